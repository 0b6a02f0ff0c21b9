"""Gemini ``generateContent`` format: ``{"system_instruction": {...}, "contents": [...]}``.

Instructions are ``system_instruction`` parts; memory and retrieved context are text parts of
the first user turn. Tool calls become ``functionCall`` parts of a ``model`` turn and tool
results ``functionResponse`` parts of a user turn (``{"content": text}``, or ``{"error": text}``
for a failed call, as Gemini's docs suggest); consecutive same-role turns are merged.

``parse_gemini_contents`` reads a request's ``contents`` and ``system_instruction`` back into
``Message`` values.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from contextfold.formats._parsing import (
    expect_dict,
    expect_list,
    expect_str,
    fail,
    json_text,
    optional_str,
    split_tool_results,
    type_name,
)
from contextfold.formats.base import OPENING_TURN, BaseFormatter, layout_items
from contextfold.items import (
    ContentBlock,
    ContextItem,
    Message,
    Role,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from contextfold.tokens import TokenCounter

__all__ = ["GeminiFormatter", "message_to_gemini", "parse_gemini_contents"]


def message_to_gemini(message: Message, tool_names: dict[str, str]) -> dict[str, Any]:
    """One message as a Gemini turn; ``tool_names`` maps tool call ids to function names
    (Gemini matches responses by name) and is updated with this message's calls."""
    parts: list[dict[str, Any]] = []
    for b in message.content:
        if isinstance(b, TextBlock):
            parts.append({"text": b.text})
        elif isinstance(b, ToolUseBlock):
            tool_names[b.id] = b.name
            parts.append({"functionCall": {"id": b.id, "name": b.name, "args": b.input}})
        else:
            name = b.name or tool_names.get(b.tool_use_id, b.tool_use_id)
            parts.append(
                {
                    "functionResponse": {
                        "id": b.tool_use_id,
                        "name": name,
                        "response": {"error" if b.is_error else "content": b.content},
                    }
                }
            )
    return {"role": "model" if message.role == "assistant" else "user", "parts": parts}


def _merge(contents: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Consecutive same-role turns merged so roles alternate, opening with a user turn; a user
    turn's function responses ahead of its other parts."""
    merged: list[dict[str, Any]] = []
    for turn in contents:
        if merged and merged[-1]["role"] == turn["role"]:
            merged[-1]["parts"] = merged[-1]["parts"] + turn["parts"]
        else:
            merged.append({"role": turn["role"], "parts": list(turn["parts"])})
    if merged and merged[0]["role"] != "user":
        merged.insert(0, {"role": "user", "parts": [{"text": OPENING_TURN}]})
    for turn in merged:
        parts = turn["parts"]
        if turn["role"] == "user" and any("functionResponse" in p for p in parts):
            responses = [p for p in parts if "functionResponse" in p]
            turn["parts"] = responses + [p for p in parts if "functionResponse" not in p]
    return merged


class GeminiFormatter(BaseFormatter):
    """Gemini ``generateContent`` request body.

    >>> from contextfold.items import ContextItem, SourceType
    >>> GeminiFormatter().format([ContextItem(content="Hi", source=SourceType.USER)])
    {'contents': [{'role': 'user', 'parts': [{'text': 'Hi'}]}]}
    """

    name: ClassVar[str] = "gemini"

    def base_cost(self, counter: TokenCounter) -> int:
        # As Anthropic's: the frame plus the opening user turn a reply-first history needs.
        return super().base_cost(counter) + counter.count(OPENING_TURN) + self.overhead.per_part

    def format(self, items: Sequence[ContextItem]) -> dict[str, Any]:
        layout = layout_items(items)
        system, context = self.split_memory(layout)
        contents: list[dict[str, Any]] = []
        if context:
            contents.append({"role": "user", "parts": [{"text": t} for t in context]})
        tool_names: dict[str, str] = {}
        contents.extend(message_to_gemini(m, tool_names) for m in layout.history)
        if layout.query:
            contents.append({"role": "user", "parts": [{"text": q.content} for q in layout.query]})
        payload: dict[str, Any] = {"contents": _merge(contents)}
        if system:
            payload = {"system_instruction": {"parts": [{"text": t} for t in system]}, **payload}
        return payload

    def count_payload(self, payload: Any, counter: TokenCounter) -> int:
        oh = self.overhead
        total = oh.per_request
        turns = list(payload["contents"])
        if "system_instruction" in payload:
            turns.append(payload["system_instruction"])
        for turn in turns:
            total += oh.per_message
            for part in turn["parts"]:
                if "text" in part:
                    total += counter.count(part["text"]) + oh.per_part
                elif "functionCall" in part:
                    call = part["functionCall"]
                    args = ToolUseBlock(id="", name=call["name"], input=call["args"])
                    total += counter.count(call["name"]) + counter.count(args.arguments_json())
                    total += 2 * oh.per_part
                else:
                    response = part["functionResponse"]["response"]
                    text = response["error"] if "error" in response else response["content"]
                    total += counter.count(text) + oh.per_part
        return total


# --------------------------------------------------------------------------- parsing

_ROLES: dict[str, Role] = {"user": "user", "model": "assistant", "function": "tool"}
# The REST API accepts lowerCamelCase and snake_case field names alike.
_KINDS = {
    "text": "text",
    "functionCall": "functionCall",
    "function_call": "functionCall",
    "functionResponse": "functionResponse",
    "function_response": "functionResponse",
}
_METADATA = frozenset({"thoughtSignature", "thought_signature", "videoMetadata", "video_metadata"})


@dataclass(slots=True)
class _Call:
    id: str
    name: str
    answered: bool = False


def parse_gemini_contents(
    contents: list[dict[str, Any]], system_instruction: dict[str, Any] | None = None
) -> list[Message]:
    """A ``generateContent`` request's ``contents`` and ``system_instruction`` as ``Message``
    values.

    ``model`` turns become assistant messages, ``function`` turns tool messages, and a user turn
    with ``functionResponse`` parts a ``tool`` message for each run of responses and a user
    message for each run of other parts, in order. A call without an ``id`` gets
    ``call_{turn}_{part}`` (stable as the conversation grows); a response without one answers
    the earliest unanswered call of the same name. A response's text is the string value of its
    only key ``content``, ``output`` or ``error`` (``error`` marks it failed), else the response
    as compact JSON. Raises ``FormatError`` naming the path of the first malformed value.

    >>> parse_gemini_contents([{"role": "model", "parts": [{"text": "Hi"}]}])
    [Message(role='assistant', content=(TextBlock(type='text', text='Hi'),), name=None)]
    """
    out: list[Message] = []
    if system_instruction is not None:
        si = expect_dict(system_instruction, "system_instruction")
        parts = expect_list(si.get("parts"), "system_instruction.parts")
        blocks: list[ContentBlock] = []
        for j, part in enumerate(parts):
            here = f"system_instruction.parts[{j}]"
            if _key(expect_dict(part, here), here) != "text":
                fail(here, "is not a text part; system_instruction holds only text")
            blocks.append(TextBlock(text=expect_str(part["text"], f"{here}.text")))
        if blocks:
            out.append(Message(role="system", content=tuple(blocks)))
    calls: list[_Call] = []
    for i, raw in enumerate(expect_list(contents, "contents")):
        path = f"contents[{i}]"
        turn = expect_dict(raw, path)
        role_value = turn.get("role", "user")  # Gemini treats a missing role as the user
        if not isinstance(role_value, str):
            fail(f"{path}.role", f"is {type_name(role_value)}; expected one of {sorted(_ROLES)}")
        if role_value not in _ROLES:
            fail(f"{path}.role", f"{role_value!r} is unknown; expected one of {sorted(_ROLES)}")
        role = _ROLES[role_value]
        blocks = []
        for j, raw_part in enumerate(expect_list(turn.get("parts"), f"{path}.parts")):
            here = f"{path}.parts[{j}]"
            part = expect_dict(raw_part, here)
            key = _key(part, here)
            kind, value = _KINDS[key], part[key]
            if kind == "text":
                blocks.append(TextBlock(text=expect_str(value, f"{here}.text")))
            elif kind == "functionCall":
                if role != "assistant":
                    fail(
                        here,
                        f"is a functionCall in a {role_value} turn; only model turns "
                        "call functions",
                    )
                call = _function_call(value, f"{here}.{key}", f"call_{i}_{j}")
                calls.append(_Call(call.id, call.name))
                blocks.append(call)
            else:
                if role == "assistant":
                    fail(
                        here,
                        "is a functionResponse in a model turn; responses go in a user "
                        "or function turn",
                    )
                blocks.append(_function_response(value, f"{here}.{key}", calls))
        if role == "tool":
            if not all(isinstance(b, ToolResultBlock) for b in blocks):
                fail(
                    f"{path}.parts",
                    "mixes text into a function turn; a function turn holds "
                    "only functionResponse parts",
                )
            out.append(Message(role="tool", content=tuple(blocks)))
        else:
            out.extend(split_tool_results(role, blocks))
    return out


def _key(part: dict[str, Any], path: str) -> str:
    """The part's one data key (``text``, ``functionCall``, ``function_call``, ...)."""
    if part.get("thought") is True:
        fail(path, "is a thought summary, which is not supported yet")
    found = [k for k in part if k in _KINDS]
    if len(found) > 1:
        fail(path, f"has both {found[0]!r} and {found[1]!r}; a part holds exactly one")
    if found:
        return found[0]
    others = sorted(k for k in part if k not in _METADATA and k != "thought")
    if others:
        fail(
            path,
            f"has {others[0]!r}, which is not supported yet (only text, functionCall "
            "and functionResponse parts)",
        )
    fail(path, "is empty; expected text, functionCall or functionResponse")


def _function_call(value: Any, path: str, default_id: str) -> ToolUseBlock:
    call = expect_dict(value, path)
    return ToolUseBlock(
        id=optional_str(call.get("id"), f"{path}.id") or default_id,
        name=expect_str(call.get("name"), f"{path}.name"),
        input=expect_dict(call.get("args", {}), f"{path}.args"),
    )


def _function_response(value: Any, path: str, calls: list[_Call]) -> ToolResultBlock:
    response_part = expect_dict(value, path)
    name = expect_str(response_part.get("name"), f"{path}.name")
    response = expect_dict(response_part.get("response"), f"{path}.response")
    call_id = optional_str(response_part.get("id"), f"{path}.id")
    if call_id is None:
        match = next((c for c in calls if c.name == name and not c.answered), None)
        if match is None:
            fail(path, f"has no id and answers no earlier unanswered functionCall named {name!r}")
        call_id = match.id
    for call in calls:
        if call.id == call_id and not call.answered:
            call.answered = True
            break
    is_error = "error" in response
    only = next(iter(response.values())) if len(response) == 1 else None
    if isinstance(only, str) and next(iter(response)) in ("content", "output", "error"):
        content = only
    else:
        content = json_text(response)
    return ToolResultBlock(tool_use_id=call_id, content=content, name=name, is_error=is_error)
