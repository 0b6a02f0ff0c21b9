"""Tool-output compaction: long agent sessions stay under the model's window, and its prompt
cache stays warm between compaction events.

A coding agent's request grows by every file it reads and every command it runs; its old tool
outputs are most of the tokens and are rarely looked at again. When a request is larger than
``proxy.tool_outputs.compact_above`` tokens (default: three quarters of the model's context
window, for the models in ``WINDOWS``, and never more than the memory's ``context_window``
leaves the client's messages; unknown models are left alone unless it is set), the
oldest tool outputs are replaced by a short stub that keeps the call paired with its result,
says how big the output was, shows its first line, and names the output's reference for the
``contextfold_restore`` tool. The proxy offers that tool on every compacted request and
answers it itself from the client's own request (the client always sends the outputs in
full, so nothing needs storing); see ``Proxy._rounds``.

**Stable between events.** Which outputs are stubbed depends only on the request's size
bucket and its oldest outputs, never on state: with ``A = compact_above`` and
``H = A * (1 - target)``, a request of ``T > A`` tokens lies in bucket
``b = (T - A) // H``, and the oldest eligible outputs are stubbed until the savings reach
``(b + 1) * H``, so every request of that bucket ends at most ``A`` tokens, and right after a
new bucket starts at most ``target * A``. As an agent's session grows, the same outputs stay
stubbed, with the same stub text, until the request crosses into the next bucket (a
"compaction event"): the bytes up to the newest stub, the cache prefix, do not change in
between. The newest ``keep_recent`` outputs and outputs under ``min_tokens`` are never stubbed.

Sizes are estimated from characters (``_CHARS_PER_TOKEN``): exact counting of a 900K-token
request costs more than the request path may spend, and the rule only has to be
deterministic. Anthropic ``tool_result`` blocks, OpenAI ``tool`` messages and the Responses
API's ``function_call_output`` / ``custom_tool_call_output`` items (Codex CLI) are compacted;
a Responses stub asks for the call to be made again, since the proxy runs no tool loop for that
API. Outputs holding images or documents, and Gemini requests, are left as they are.

>>> body = {"model": "m", "messages": [
...     {"role": "user", "content": "go"},
...     {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Read",
...                                        "input": {}}]},
...     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
...                                   "content": "line one\\n" + "x" * 8000}]},
...     {"role": "user", "content": "next"}]}
>>> out, done = compact("anthropic", body, OutputSettings(compact_above=1000, keep_recent=0))
>>> done.stubbed, done.restore("t1") == body["messages"][2]["content"][0]["content"]
(['t1'], True)
>>> out["messages"][2]["content"][0]["content"].startswith("[contextfold: tool output t1")
True
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from contextfold.server.config import OutputSettings

__all__ = [
    "RESTORE_TOOL",
    "WINDOWS",
    "Compaction",
    "compact",
    "json_chars",
    "limit_for",
    "restore_definitions",
    "window_of",
]

RESTORE_TOOL = "contextfold_restore"
RESPONSES = "responses"  # the OpenAI Responses API's format name (``responses.FORMAT``)
_RESPONSES_OUTPUTS = ("function_call_output", "custom_tool_call_output")
_CHARS_PER_TOKEN = 3.0
_HEAD = 160

#: Context windows in tokens, by model-name prefix (the longest matching prefix wins).
WINDOWS: dict[str, int] = {
    "claude-": 200_000,
    "gpt-4o": 128_000,
    "gpt-4.1": 1_047_576,
    "gpt-5": 400_000,
    "o1": 200_000,
    "o3": 200_000,
    "o4": 200_000,
    "gemini-": 1_048_576,
}


@dataclass
class Compaction:
    """What ``compact`` did to one request: the stubbed outputs' references (oldest first),
    their original text (for ``contextfold_restore``), and the estimated sizes."""

    limit: int
    tokens_before: int
    tokens_after: int
    need: int = 0  # the savings this request's size bucket asks for
    saved: int = 0  # the savings of the stubs chosen (estimated alike)
    stubbed: list[str] = field(default_factory=list)
    originals: dict[str, str] = field(default_factory=dict)

    def restore(self, ref: str) -> str | None:
        return self.originals.get(ref)

    def answer(self, arguments: Any) -> str:
        """The ``contextfold_restore`` tool's result for the model."""
        ref = arguments.get("ref") if isinstance(arguments, Mapping) else None
        if not isinstance(ref, str):
            return json.dumps({"error": f"{RESTORE_TOOL} needs the argument 'ref'"})
        text = self.restore(ref)
        if text is None:
            known = ", ".join(self.stubbed[:20])
            return json.dumps({"error": f"no compacted output {ref[:80]!r}; known: {known}"})
        return text

    def note(self) -> str:
        return (
            f"tool outputs compacted: {len(self.stubbed)} stubbed, about "
            f"{self.tokens_before:,} → {self.tokens_after:,} tokens (limit {self.limit:,})"
        )


@dataclass(frozen=True)
class _Output:
    message: int
    block: int | None  # the tool_result block (Anthropic); None: the whole tool message
    ref: str
    text: str


def window_of(model: str | None) -> int | None:
    if not model:
        return None
    name = model.lower().rsplit("/", 1)[-1]
    best = max((p for p in WINDOWS if name.startswith(p)), key=len, default=None)
    return WINDOWS[best] if best else None


def limit_for(
    fmt: str, settings: OutputSettings, model: str | None, cap: int | None = None
) -> int | None:
    """The size in tokens above which a ``fmt`` request for ``model`` is compacted, or None
    when it never is (compaction off, a format it does not read, an unknown model's window).
    ``cap``: what the memory's ``context_window`` leaves the client's messages (the proxy's
    ``fit``: the window less the reply's reserve and the memory budget); the default limit,
    three quarters of the model's window, is never above it (an explicit
    ``compact_above`` is kept as set)."""
    if not settings.compact or fmt not in ("openai", "anthropic", RESPONSES):
        return None
    if settings.compact_above is not None:
        return settings.compact_above
    window = window_of(model)
    if window is None:
        return None
    return int(window * 0.75) if cap is None else min(int(window * 0.75), max(cap, 1))


def json_chars(value: Any) -> int:
    """About how many characters ``value`` takes as compact JSON (``json.dumps`` with
    ``ensure_ascii=False``: strings as their length plus quotes, escapes not counted), without
    serialising it: sizing a megabyte request by ``json.dumps`` cost a coding agent's request
    as much as the rest of its memory work. Deterministic, which is all the size rule needs.

    >>> json_chars({"a": [1, "xy", None, True]}) == len('{"a": [1, "xy", null, true]}')
    True
    """
    if isinstance(value, str):
        return len(value) + 2
    if isinstance(value, dict):
        return (
            2
            + sum(len(k) + 4 + json_chars(v) for k, v in value.items())
            + max(0, 2 * (len(value) - 1))
        )
    if isinstance(value, list):
        return 2 + sum(json_chars(v) for v in value) + max(0, 2 * (len(value) - 1))
    if value is None or value is True:
        return 4
    if value is False:
        return 5
    return len(str(value))


def _estimate(chars: int) -> int:
    return math.ceil(chars / _CHARS_PER_TOKEN)


def _text_of(content: Any) -> str | None:
    """The text of a tool output, or None when it holds anything but text."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content:
        parts = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text"):
                return None
            text = part.get("text")
            if not isinstance(text, str):
                return None
            parts.append(text)
        return "\n".join(parts)
    return None


def _outputs(fmt: str, messages: list[Any]) -> list[_Output]:
    found: list[_Output] = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            continue
        if fmt == "openai":
            ref, text = msg.get("tool_call_id"), _text_of(msg.get("content"))
            if msg.get("role") == "tool" and isinstance(ref, str) and text is not None:
                found.append(_Output(i, None, ref, text))
        elif fmt == RESPONSES:  # input items: a call's output is its own item
            ref, text = msg.get("call_id"), _text_of(msg.get("output"))
            kind = msg.get("type")
            if kind in _RESPONSES_OUTPUTS and isinstance(ref, str) and text is not None:
                found.append(_Output(i, None, ref, text))
        elif fmt == "anthropic" and isinstance(msg.get("content"), list):
            for j, block in enumerate(msg["content"]):
                if not (isinstance(block, dict) and block.get("type") == "tool_result"):
                    continue
                ref, text = block.get("tool_use_id"), _text_of(block.get("content"))
                if isinstance(ref, str) and text is not None:
                    found.append(_Output(i, j, ref, text))
    return found


def stub_text(ref: str, text: str, fmt: str = "openai") -> str:
    """The stub that replaces output ``ref``: the same for the same output, every time. It
    names the restore tool, which the proxy answers in its tool loop; a Responses request has
    no such loop (``routes``), so its stubs ask for the call to be made again."""
    first = text.strip().split("\n", 1)[0][:_HEAD]
    how = (
        "Make the call again to see it in full (the output may have changed since)."
        if fmt == RESPONSES
        else f'Call {RESTORE_TOOL} with {{"ref": "{ref}"}} to read it in full.'
    )
    return (
        f"[contextfold: tool output {ref} compacted, about {_estimate(len(text)):,} tokens "
        f"({len(text):,} characters). It began: {json.dumps(first)}. {how}]"
    )


def restores(fmt: str) -> bool:
    """Whether a compacted ``fmt`` request is offered ``contextfold_restore`` (answered in the
    proxy's tool loop, which the Responses API does not have)."""
    return fmt != RESPONSES


def compact(
    fmt: str,
    body: dict[str, Any],
    settings: OutputSettings,
    model: str | None = None,
    *,
    sent: dict[str, Any] | None = None,
    cap: int | None = None,
) -> tuple[dict[str, Any], Compaction | None]:
    """``body`` with its oldest tool outputs stubbed when the request is over the limit, and
    what was done (``None``: nothing; ``body`` is then returned as it is). ``model``: whose
    window sets the default limit (default: the body's ``model``). ``sent``: the body
    the client sent, which sizes the request and picks the outputs (default ``body``); the
    stubs go into ``body`` (the one going upstream, with memory added), so memory that varies
    from turn to turn never moves a request across a bucket boundary. ``cap``: see
    ``limit_for``."""
    sent = body if sent is None else sent
    if model is None and isinstance(body.get("model"), str):
        model = body["model"]
    limit = limit_for(fmt, settings, model, cap)
    if limit is None:
        return body, None
    key = "input" if fmt == RESPONSES else "messages"
    client_messages, messages = sent.get(key), body.get(key)
    if not (isinstance(client_messages, list) and isinstance(messages, list)):
        return body, None
    total = _estimate(json_chars(sent))
    if total <= limit:
        return body, None
    outputs = _outputs(fmt, client_messages)
    eligible = outputs[: max(0, len(outputs) - settings.keep_recent)]
    span = max(1, int(limit * (1 - settings.target)))
    need = ((total - limit) // span + 1) * span
    chosen: dict[str, str] = {}
    saved = 0
    for output in eligible:
        if saved >= need:
            break
        size = _estimate(len(output.text))
        if size < settings.min_tokens or output.ref in chosen:
            continue
        gain = size - _estimate(len(stub_text(output.ref, output.text, fmt)))
        if gain > 0:
            chosen[output.ref] = output.text
            saved += gain
    if not chosen:
        return body, None
    out_messages = list(messages)
    stubbed: list[str] = []
    for output in _outputs(fmt, messages):
        if chosen.get(output.ref) != output.text:
            continue
        stub = stub_text(output.ref, output.text, fmt)
        msg = dict(out_messages[output.message])
        if fmt == RESPONSES:
            msg["output"] = stub
        elif output.block is None:
            msg["content"] = stub
        else:
            blocks = list(msg["content"])
            blocks[output.block] = {**blocks[output.block], "content": stub}
            msg["content"] = blocks
        out_messages[output.message] = msg
        stubbed.append(output.ref)
    if not stubbed:
        return body, None
    out = {**body, key: out_messages}
    done = Compaction(
        limit=limit,
        tokens_before=_estimate(json_chars(body)),
        tokens_after=_estimate(json_chars(out)),
        need=need,
        saved=saved,
        stubbed=stubbed,
        originals={ref: chosen[ref] for ref in stubbed},
    )
    return out, done


def restore_definitions(fmt: str) -> list[dict[str, Any]]:
    """The ``contextfold_restore`` tool, in ``fmt``'s shape."""
    description = (
        "Read in full a tool output that contextfold compacted to a stub to save context; "
        "the stub names its ref."
    )
    schema = {
        "type": "object",
        "properties": {"ref": {"type": "string", "description": "the ref the stub names"}},
        "required": ["ref"],
    }
    if fmt == "anthropic":
        return [{"name": RESTORE_TOOL, "description": description, "input_schema": schema}]
    return [
        {
            "type": "function",
            "function": {"name": RESTORE_TOOL, "description": description, "parameters": schema},
        }
    ]
