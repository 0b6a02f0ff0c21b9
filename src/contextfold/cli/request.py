"""The ``build`` input file: a JSON object of candidate context, checked field by field.

::

    {"system": str, "query": str,
     "memory":       [str | {"content": str, "metadata": {...}, "priority": int, "id": str}],
     "retrieval":    [{"content": str, "score": float, "metadata": {"source": "file.txt"}}],
     "tool_outputs": [str | {"content": str, "metadata": {"tool_name": "..."}}],
     "history":      [{"role": "user" | "assistant", "content": str}]}

Every key is optional. A mistake becomes an ``InputError`` that names the file and the field,
e.g. ``request.json: retrieval[2].score must be a number, got "high"``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from contextfold.cli.common import InputError
from contextfold.items import ContextItem, Message, SourceType

__all__ = ["BuildRequest", "parse_request"]

_TOP_KEYS = ("system", "query", "memory", "retrieval", "tool_outputs", "history")
_ITEM_KEYS = ("content", "metadata", "score", "priority", "id")
_SOURCES = {
    "memory": SourceType.MEMORY,
    "retrieval": SourceType.RETRIEVAL,
    "tool_outputs": SourceType.TOOL,
}


@dataclass(frozen=True, slots=True)
class BuildRequest:
    """What the input file asks for: instructions, a query and candidate items."""

    system: str = ""
    query: str = ""
    items: tuple[ContextItem, ...] = field(default_factory=tuple)


def _kind(value: Any) -> str:
    """How a JSON value reads in an error message: ``an object``, ``a list``, ``"high"``, ``3``."""
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    return json.dumps(value)[:40]


def _str(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise InputError(f"{where} must be a string, got {_kind(value)}")
    return value


def _item(entry: Any, where: str, source: SourceType) -> ContextItem:
    if isinstance(entry, str):
        entry = {"content": entry}
    if not isinstance(entry, dict):
        raise InputError(f"{where} must be a string or an object, got {_kind(entry)}")
    unknown = sorted(set(entry) - set(_ITEM_KEYS))
    if unknown:
        raise InputError(
            f"{where} has unknown key(s) {', '.join(unknown)}; allowed: {', '.join(_ITEM_KEYS)}"
        )
    if "content" not in entry:
        raise InputError(f'{where} has no "content"')
    fields: dict[str, Any] = {"content": _str(entry["content"], f"{where}.content")}
    metadata = entry.get("metadata", {})
    if not isinstance(metadata, dict):
        raise InputError(f"{where}.metadata must be an object, got {_kind(metadata)}")
    fields["metadata"] = metadata
    if "score" in entry:
        score = entry["score"]
        if isinstance(score, bool) or not isinstance(score, int | float):
            raise InputError(f"{where}.score must be a number, got {_kind(score)}")
        fields["score"] = float(score)
    if "priority" in entry:
        priority = entry["priority"]
        if isinstance(priority, bool) or not isinstance(priority, int) or not 1 <= priority <= 10:
            raise InputError(
                f"{where}.priority must be an integer from 1 to 10, got {_kind(priority)}"
            )
        fields["priority"] = priority
    if "id" in entry:
        fields["id"] = _str(entry["id"], f"{where}.id")
    return ContextItem(source=source, **fields)


def _turn(entry: Any, where: str) -> ContextItem:
    if not isinstance(entry, dict):
        raise InputError(
            f'{where} must be an object {{"role": ..., "content": ...}}, got {_kind(entry)}'
        )
    unknown = sorted(set(entry) - {"role", "content"})
    if unknown:
        raise InputError(f"{where} has unknown key(s) {', '.join(unknown)}; allowed: role, content")
    role = entry.get("role")
    if role not in ("user", "assistant"):
        raise InputError(f'{where}.role must be "user" or "assistant", got {_kind(role)}')
    content = _str(entry.get("content"), f"{where}.content")
    return ContextItem.from_message(Message(role=role, content=content))


def _list(data: dict[str, Any], key: str, name: str) -> list[Any]:
    value = data.get(key, [])
    if not isinstance(value, list):
        raise InputError(f'{name}: "{key}" must be a list, got {_kind(value)}')
    return value


def parse_request(text: str, name: str) -> BuildRequest:
    """The request in ``text`` (the JSON of the file called ``name``)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(
            f"{name} is not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
        ) from None
    if not isinstance(data, dict):
        raise InputError(f"{name} must hold a JSON object, got {_kind(data)}")
    unknown = sorted(set(data) - set(_TOP_KEYS))
    if unknown:
        raise InputError(
            f"{name} has unknown key(s) {', '.join(unknown)}; allowed: {', '.join(_TOP_KEYS)}"
        )
    items: list[ContextItem] = []
    for key, source in _SOURCES.items():
        for i, entry in enumerate(_list(data, key, name)):
            items.append(_item(entry, f"{name}: {key}[{i}]", source))
    for i, entry in enumerate(_list(data, "history", name)):
        items.append(_turn(entry, f"{name}: history[{i}]"))
    return BuildRequest(
        system=_str(data.get("system", ""), f'{name}: "system"'),
        query=_str(data.get("query", ""), f'{name}: "query"'),
        items=tuple(items),
    )
