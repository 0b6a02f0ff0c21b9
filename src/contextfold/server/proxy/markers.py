"""Whether a reply may carry the session marker. Markers are off by default
(``proxy.markers: false``): a conversation is found again by the history the client resends
(``session.resolve``) and by the ``x-contextfold-session`` header every reply carries. With
``proxy.markers: true`` (for clients that can send no header) the marker is text added to
the model's reply, so it goes only where added text cannot break the client.

No marker, decided from the request (``withheld`` says why; the reason goes into the record):

- ``proxy.markers: false`` (no reason recorded: it is the server's choice, not the request's);
- the client asked for machine-readable text: OpenAI ``response_format`` of type
  ``json_object`` or ``json_schema`` (JSON mode, structured outputs, the SDKs' ``parse()``);
  Anthropic ``output_config.format`` or ``output_format`` (structured outputs); Gemini
  ``generationConfig.responseMimeType`` other than ``text/plain`` (``application/json``,
  ``text/x.enum``) or a ``responseSchema`` / ``responseJsonSchema``;
- the client forced a tool call (OpenAI ``tool_choice: required`` or a named tool, Anthropic
  ``tool_choice`` ``any`` or ``tool`` — Anthropic's usual way to get JSON — Gemini
  ``functionCallingConfig.mode: ANY``): the reply is for a program, not for reading;
- a helper call: a request with no assistant turn in its history (a one-shot request — what
  agents' title, commit-message, summary and warm-up calls look like). Its text goes into
  titles, commit messages and files; and a real conversation's first reply needs no marker
  either, since its next request resends the reply and is recognised by it.

No marker, decided from the reply (``stream``, at the end of a stream from what was
streamed): a reply with any tool call (the client is in a tool loop, and OpenAI expects
``content: null`` beside calls), or with no text.

Where it goes: appended to the reply's last text (Anthropic: to the last text block, never a
block of its own — some clients print only the last block).

>>> withheld("openai", {"response_format": {"type": "json_object"}})
'no session marker: the request asks for JSON (response_format json_object)'
>>> withheld("anthropic", {"tool_choice": {"type": "auto"}}) is None
True
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from contextfold.server.proxy.record import Plan
from contextfold.server.proxy.session import marker_text

__all__ = ["session_marker", "withheld"]


def session_marker(plan: Plan, token: str | None, *, enabled: bool = True) -> str | None:
    """The marker for the reply to ``plan``'s request, or None when the reply must stay as the
    model wrote it (a request reason is added to ``plan.notes``). A request forwarded as the
    client sent it (its memory path failed or ran late) is judged by the client's body."""
    body = plan.body if plan.body is not None else plan.original
    if not enabled or token is None or body is None:
        return None
    reason = withheld(plan.format, body) or _helper(plan.format, body)
    if reason is not None:
        plan.notes.append(reason)
        return None
    return marker_text(token)


def withheld(fmt: str, body: Mapping[str, Any]) -> str | None:
    """Why the reply to request ``body`` (wire format ``fmt``) must get no marker, or None."""
    if fmt == "openai":
        kind = _get(body, "response_format", "type")
        if kind in ("json_object", "json_schema"):
            return f"no session marker: the request asks for JSON (response_format {kind})"
        if _forced(body.get("tool_choice")):
            return "no session marker: the request forces a tool call (tool_choice)"
    elif fmt == "anthropic":
        if _get(body, "output_config", "format") is not None or body.get("output_format"):
            return "no session marker: the request asks for JSON (structured output)"
        if _get(body, "tool_choice", "type") in ("any", "tool"):
            return "no session marker: the request forces a tool call (tool_choice)"
    else:
        config = _either(body, "generationConfig", "generation_config")
        config = config if isinstance(config, Mapping) else {}
        mime = _either(config, "responseMimeType", "response_mime_type")
        if isinstance(mime, str) and mime.strip().lower() not in ("", "text/plain"):
            return f"no session marker: the request asks for {mime} (responseMimeType)"
        schemas = ("responseSchema", "response_schema", "responseJsonSchema",
                   "response_json_schema")  # fmt: skip
        if any(config.get(key) is not None for key in schemas):
            return "no session marker: the request asks for JSON (responseSchema)"
        tool_config = _either(body, "toolConfig", "tool_config")
        calling = _either(tool_config, "functionCallingConfig", "function_calling_config")
        if str(_either(calling, "mode", "mode") or "").upper() == "ANY":
            return "no session marker: the request forces a function call (mode ANY)"
    return None


def _helper(fmt: str, body: Mapping[str, Any]) -> str | None:
    """Why a one-shot request (no assistant turn in its history) gets no marker."""
    items = body.get("contents" if fmt == "gemini" else "messages")
    role = "model" if fmt == "gemini" else "assistant"
    if isinstance(items, list) and not any(
        isinstance(m, Mapping) and m.get("role") == role for m in items
    ):
        return "no session marker: a one-shot request (no assistant turn), as helper calls are"
    return None


def _forced(choice: Any) -> bool:
    """An OpenAI ``tool_choice`` that makes the model call a tool."""
    if choice == "required":
        return True
    if not isinstance(choice, Mapping):
        return False
    if choice.get("type") == "allowed_tools":
        return bool(_get(choice, "allowed_tools", "mode") == "required")
    return choice.get("type") in ("function", "custom")


def _get(body: Mapping[str, Any], key: str, inner: str) -> Any:
    value = body.get(key)
    return value.get(inner) if isinstance(value, Mapping) else None


def _either(value: Any, camel: str, snake: str) -> Any:
    """``value[camel]`` or ``value[snake]`` (Gemini's JSON takes either spelling)."""
    if not isinstance(value, Mapping):
        return None
    found = value.get(camel)
    return found if found is not None else value.get(snake)
