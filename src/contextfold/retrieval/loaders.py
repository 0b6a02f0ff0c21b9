"""Reading documents from files: ``.txt``, ``.md``, ``.json`` and ``.jsonl``.

A ``.json`` file holds one document object or a list of them; a ``.jsonl`` file one object per
line. An object's text is its ``text`` (or ``content``, or ``body``) field; ``title``, when
present, is prepended as the first line; every other scalar field becomes metadata. Folders
are walked recursively (sorted, hidden files skipped).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from contextfold.errors import ConfigError

__all__ = ["SUFFIXES", "LoadedDocument", "iter_files", "load_documents"]

SUFFIXES = (".txt", ".md", ".json", ".jsonl")
_TEXT_FIELDS = ("text", "content", "body")


@dataclass(frozen=True)
class LoadedDocument:
    """One document read from a file: its text, where it came from, its metadata."""

    text: str
    source: str
    metadata: dict[str, Any] = field(default_factory=dict)


def iter_files(paths: Sequence[str | Path]) -> list[Path]:
    """The supported files under ``paths`` (files as given, folders walked), de-duplicated."""
    found: dict[Path, None] = {}
    for raw in paths:
        path = Path(raw)
        if not path.exists():
            raise ConfigError(f"{raw}: no such file or folder")
        if path.is_dir():
            for child in sorted(path.rglob("*")):
                hidden = any(part.startswith(".") for part in child.relative_to(path).parts)
                if child.is_file() and child.suffix.lower() in SUFFIXES and not hidden:
                    found[child] = None
        elif path.suffix.lower() in SUFFIXES:
            found[path] = None
        else:
            raise ConfigError(f"{raw}: unsupported file type; supported: {', '.join(SUFFIXES)}")
    return list(found)


def _from_object(obj: Any, source: str, where: str) -> LoadedDocument:
    if isinstance(obj, str):
        return LoadedDocument(obj, source, {"source": source})
    if not isinstance(obj, dict):
        raise ConfigError(
            f"{where}: expected an object with a 'text' field, got {type(obj).__name__}"
        )
    text_field = next((f for f in _TEXT_FIELDS if isinstance(obj.get(f), str)), None)
    if text_field is None:
        raise ConfigError(f"{where}: no text field (one of {', '.join(_TEXT_FIELDS)})")
    text = obj[text_field]
    title = obj.get("title")
    if isinstance(title, str) and title.strip() and not text.startswith(title):
        text = f"{title}\n{text}"
    metadata = {
        k: v for k, v in obj.items() if k != text_field and isinstance(v, str | int | float | bool)
    }
    metadata.setdefault("source", source)
    return LoadedDocument(text, source, metadata)


def load_documents(path: Path) -> Iterator[LoadedDocument]:
    """The documents in one file; a malformed file raises ``ConfigError`` naming the place."""
    source = path.name
    try:
        raw = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{path}: not UTF-8 text (invalid byte at offset {exc.start:,})"
        ) from None
    suffix = path.suffix.lower()
    if suffix in (".txt", ".md"):
        if raw.strip():
            yield LoadedDocument(raw, source, {"source": source, "format": suffix[1:]})
        return
    if suffix == ".jsonl":
        for number, line in enumerate(raw.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{path}:{number}: invalid JSON ({exc.msg})") from None
            yield _from_object(obj, source, f"{path}:{number}")
        return
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}:{exc.lineno}: invalid JSON ({exc.msg})") from None
    for n, obj in enumerate(data if isinstance(data, list) else [data]):
        yield _from_object(obj, source, f"{path}[{n}]")
