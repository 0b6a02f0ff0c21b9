"""The OpenAI Responses API (``POST /v1/responses``): its request body, its reply and its
stream, and the response ids that chain its requests.

**Request** (``ResponsesWire``). ``input`` is a string (one user message) or a list of items.
The items are read into messages the way a resent history is recognised: ``message`` items
(``role`` user / system / developer / assistant, ``content`` a string or parts), ``function_call``
and ``custom_tool_call`` (tool calls, by ``call_id``), ``function_call_output`` and
``custom_tool_call_output`` (their results); ``instructions`` is the system prompt. One
response's output — the assistant's messages, its calls and the ``reasoning`` and other call
items around them — is one assistant message, exactly as the proxy stored that reply, so a
client that resends its history (``store: false``) continues the stored conversation by
content. Items contextfold does not read (``reasoning``, ``local_shell_call``, ``item_reference``,
a type added after this was written …) are carried byte for byte and named in the request's
record; parts it does not read (images, files, audio) stay in the body too.

**Memory** goes into one extra ``user`` item appended after the client's last item: every
earlier item and ``instructions`` keep their bytes, so the provider's prompt cache keeps
hitting. No session marker is ever added to a Responses reply.

**Continuity** (``ResponseChains``): by the resent history's content, by the
``x-contextfold-session`` header, and by ``previous_response_id`` (or ``conversation``): each
response id the proxy has relayed names the stored turn it produced, so a request that sends
only ``previous_response_id`` and its new items continues that turn's branch. Such a request's
history is held by the provider; the proxy treats the stored turns of that chain as held, so
nothing the provider already has is injected again, and what came before the chain's first
request (a client that trimmed its input, then chained) can still be recalled. The ids are
kept in memory (bounded); after a restart a chained request starts a new conversation.

**Reply** (``response_reply``, ``ResponsesStream``): the text of ``output_text`` parts and the
tool calls, from a JSON response or accumulated from the stream's events (``response.completed``
carries the whole response and is taken as final). Events are relayed byte for byte, each as
it arrives; the exchange is committed just before ``response.completed`` (or
``response.incomplete`` / ``response.failed``) goes to the client. A reply that ended
incomplete, failed or cut off is stored flagged ``partial``.

The in-proxy memory tool loop (``paging.mode: tools``) is not run on this route.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from contextfold.errors import FormatError
from contextfold.items import Message, ToolResultBlock, ToolUseBlock
from contextfold.server.proxy import fit
from contextfold.server.proxy.envelope import strip_envelope
from contextfold.server.proxy.recall import (
    DropPlan,
    add_memory,
    drop_compacted,
    place,
    recall,
    sent_history,
)
from contextfold.server.proxy.session import make_token
from contextfold.server.proxy.stream import Reply, StreamState, _args
from contextfold.server.proxy.wire import JSON, ParsedRequest, Wire, dumps, reply_message

if TYPE_CHECKING:
    from contextfold.server.proxy.record import Plan
    from contextfold.server.state import ServerState
    from contextfold.store.protocols import MemoryStorage

__all__ = [
    "FORMAT",
    "ResponseChains",
    "ResponsesReply",
    "ResponsesStream",
    "ResponsesWire",
    "prepare",
    "response_reply",
]

logger = logging.getLogger(__name__)

FORMAT = "responses"

#: Items of a response's output that the client resends: one stored assistant turn.
_CALLS = frozenset({"function_call", "custom_tool_call"})
#: Their results, sent by the client: one stored ``tool`` turn.
_RESULTS = frozenset({"function_call_output", "custom_tool_call_output"})
_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
_TEXT_PARTS = frozenset({"input_text", "output_text", "text"})


def _kind(item: Any) -> str:
    """Which run an input item belongs to: ``assistant`` (a response's output), ``tool``
    (the client's results), ``user``, ``system``, or ``other`` (not read; it ends a run)."""
    if not isinstance(item, dict):
        return "other"
    kind = item.get("type")
    if kind is None or kind == "message":
        role = item.get("role")
        return _ROLES.get(role, "other") if isinstance(role, str) else "other"
    if not isinstance(kind, str):
        return "other"
    if kind == "reasoning" or kind in _CALLS or kind.endswith("_call"):
        return "assistant"
    if kind.endswith("_call_output"):
        return "tool"
    return "other"


def _unread(item: Any) -> str | None:
    """The type of an item carried without being read (for the record), else None."""
    if not isinstance(item, dict):
        return type(item).__name__
    kind = item.get("type")
    if kind is None or kind == "message":
        return None if item.get("role") in _ROLES else f"message with role {item.get('role')!r}"
    if kind in _CALLS or kind in _RESULTS or kind == "reasoning":
        return None
    return str(kind)


def _text(content: Any) -> str:
    """The text of a message's ``content``: a string, or its text parts joined."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    return "".join(
        p["text"]
        for p in content
        if isinstance(p, dict) and p.get("type") in _TEXT_PARTS and isinstance(p.get("text"), str)
    )


def _call_of(item: JSON) -> ToolUseBlock | None:
    name = item.get("name")
    if not isinstance(name, str) or not name:
        return None
    call_id = item.get("call_id") or item.get("id") or name
    if item.get("type") == "custom_tool_call":
        raw = item.get("input")
        arguments: dict[str, Any] = {"input": raw if isinstance(raw, str) else ""}
    else:
        arguments = _args(item.get("arguments"))
    return ToolUseBlock(id=str(call_id), name=name, input=arguments)


def _output_text(output: Any) -> str:
    """A function call output's text (a string, or its text parts)."""
    return _text(output)


def _assistant(items: Sequence[Any]) -> tuple[str, list[ToolUseBlock]]:
    """(text, tool calls) of one response's output items: the assistant's message texts
    joined by blank lines, and its function and custom tool calls in order."""
    texts: list[str] = []
    calls: list[ToolUseBlock] = []
    for item in items:
        if not isinstance(item, dict):
            continue
        kind = item.get("type")
        if (kind is None or kind == "message") and item.get("role") == "assistant":
            text = _text(item.get("content"))
            if text:
                texts.append(text)
        elif kind in _CALLS:
            call = _call_of(item)
            if call is not None:
                calls.append(call)
    return "\n\n".join(texts), calls


class ResponsesWire(Wire):
    """A Responses API request body (``input``, ``instructions``)."""

    name: ClassVar[str] = FORMAT
    key: ClassVar[str] = "input"

    def items(self, body: JSON) -> list[Any]:
        value = body.get("input")
        if isinstance(value, str):
            return [{"role": "user", "content": value}]
        if value is None:  # optional: a chained request may send only ``instructions``
            return []
        if not isinstance(value, list):
            raise FormatError(f"input is a {type(value).__name__}; expected a string or an array")
        return value

    def strip(self, body: JSON) -> tuple[JSON, list[str]]:
        return body, []  # no Responses reply ever carries a marker

    def _strip_message(self, msg: JSON, tokens: list[str]) -> JSON:
        return msg

    def parse(self, body: JSON) -> ParsedRequest:
        messages: list[Message] = []
        sources: list[tuple[int, ...]] = []
        instructions = body.get("instructions")
        if isinstance(instructions, str) and instructions:
            messages.append(Message(role="system", content=instructions))
            sources.append((-1,))
        items = self.items(body)
        i = 0
        while i < len(items):
            kind = _kind(items[i])
            if kind in ("assistant", "tool"):
                j = i
                while j < len(items) and _kind(items[j]) == kind:
                    j += 1
                run = items[i:j]
                if kind == "assistant":
                    text, calls = _assistant(run)
                    messages.append(reply_message(text, calls))
                    sources.append(tuple(range(i, j)))
                else:
                    results = [
                        ToolResultBlock(
                            tool_use_id=str(item.get("call_id") or ""),
                            content=_output_text(item.get("output")),
                        )
                        for item in run
                        if item.get("type") in _RESULTS
                    ]
                    if results:
                        messages.append(Message(role="tool", content=tuple(results)))
                        sources.append(tuple(range(i, j)))
                i = j
                continue
            if kind in ("user", "system"):
                text = _text(items[i].get("content"))
                role = "system" if kind == "system" else "user"
                messages.append(Message(role=role, content=text))
                sources.append((i,))
            i += 1
        return ParsedRequest(messages, sources)

    def raw_role(self, body: JSON, index: int) -> str:
        kind = _kind(self.items(body)[index])
        return "user" if kind == "other" else kind

    def drop(self, body: JSON, indices: set[int]) -> JSON:
        if not indices:
            return body
        return {**body, "input": [m for i, m in enumerate(self.items(body)) if i not in indices]}

    def _append(self, items: list[Any], text: str) -> list[Any] | None:
        """The memory as one ``user`` item after the last item: nothing before it changes."""
        return [*items, {"role": "user", "content": [{"type": "input_text", "text": text}]}]

    def unread(self, body: JSON) -> dict[str, int]:
        """The items carried without being read, counted by type."""
        counts: dict[str, int] = {}
        value = body.get("input")
        for item in value if isinstance(value, list) else []:
            kind = _unread(item)
            if kind is not None:
                counts[kind] = counts.get(kind, 0) + 1
        return counts


WIRE = ResponsesWire()


# --------------------------------------------------------------------------- replies


@dataclass
class ResponsesReply(Reply):
    """A Responses reply: also its response id, and whether it ended incomplete."""

    response_id: str | None = None
    partial: bool = False


_TERMINAL = {
    "response.completed": None,
    "response.incomplete": "incomplete",
    "response.failed": "failed",
}


def response_reply(body: Any) -> ResponsesReply:
    """The reply in a Responses JSON response (a ``response`` object)."""
    reply = ResponsesReply()
    if not isinstance(body, dict):
        return reply
    if isinstance(body.get("id"), str):
        reply.response_id = body["id"]
    output = body.get("output")
    reply.text, reply.calls = _assistant(output if isinstance(output, list) else [])
    status = body.get("status")
    reply.stop = status if isinstance(status, str) else None
    reply.partial = status in ("incomplete", "failed", "cancelled")
    return reply


class ResponsesStream(StreamState):
    """The reply of a Responses stream. Every event goes on as it came; the place before the
    terminal event (``response.completed`` / ``incomplete`` / ``failed``) is where the
    exchange is committed. No marker event is ever added."""

    def __init__(self, marker: str | None) -> None:
        super().__init__(marker)
        self.reply: ResponsesReply = ResponsesReply()
        self._items: dict[int, JSON] = {}
        self._texts: dict[tuple[int, int], str] = {}
        self._arguments: dict[int, str] = {}
        self._final: list[Any] | None = None

    def _render(self) -> bytes:
        return b""

    def _feed(self, name: str | None, data: str, payload: Any, raw: bytes) -> list[bytes]:
        if not isinstance(payload, dict):
            return [raw]
        kind = payload.get("type") or name
        index = payload.get("output_index")
        response = payload.get("response")
        if isinstance(response, dict) and isinstance(response.get("id"), str):
            self.reply.response_id = response["id"]
        if kind in ("response.output_item.added", "response.output_item.done"):
            item = payload.get("item")
            if isinstance(index, int) and isinstance(item, dict):
                self._items[index] = item
                if kind.endswith(".done"):  # the item as it ended: its own text and arguments
                    self._texts = {k: v for k, v in self._texts.items() if k[0] != index}
                    self._arguments.pop(index, None)
        elif kind == "response.output_text.delta" and isinstance(index, int):
            at = (index, int(payload.get("content_index") or 0))
            self._texts[at] = self._texts.get(at, "") + str(payload.get("delta") or "")
        elif kind == "response.output_text.done" and isinstance(index, int):
            at = (index, int(payload.get("content_index") or 0))
            self._texts[at] = str(payload.get("text") or "")
        elif kind in (
            "response.function_call_arguments.delta",
            "response.custom_tool_call_input.delta",
        ) and isinstance(index, int):
            self._arguments[index] = self._arguments.get(index, "") + str(
                payload.get("delta") or ""
            )
        elif kind == "response.function_call_arguments.done" and isinstance(index, int):
            self._arguments[index] = str(payload.get("arguments") or "")
        elif kind == "response.custom_tool_call_input.done" and isinstance(index, int):
            self._arguments[index] = str(payload.get("input") or "")
        elif kind in _TERMINAL:
            self.ended = True
            status = _TERMINAL[kind]
            if isinstance(response, dict) and isinstance(response.get("output"), list):
                self._final = response["output"]
            if status is not None:
                self.reply.partial = True
                problem = response.get("error") if isinstance(response, dict) else None
                if status == "failed":
                    self.error = f"response failed: {str(problem)[:500]}"
            slot = self._slot()
            return [slot, raw] if slot else [raw]
        elif kind == "error":
            self.error = f"error event: {str(payload.get('message') or payload)[:500]}"
        return [raw]

    def collect(self) -> None:
        output = self._final if self._final is not None else self._streamed()
        self.reply.text, self.reply.calls = _assistant(output)
        if not self.ended:
            self.reply.partial = True  # cut off before the response ended

    def _streamed(self) -> list[Any]:
        """The output items as far as they arrived (a stream without its terminal event)."""
        out = []
        for index, item in sorted(self._items.items()):
            parts = sorted((c, t) for (i, c), t in self._texts.items() if i == index)
            if parts:
                item = {**item, "content": [{"type": "output_text", "text": t} for _, t in parts]}
            if index in self._arguments:
                field = "input" if item.get("type") == "custom_tool_call" else "arguments"
                item = {**item, field: self._arguments[index]}
            out.append(item)
        return out


# --------------------------------------------------------------------------- chains


@dataclass(frozen=True)
class Link:
    """What one relayed response id names: the stored reply ``(session, seq)`` and ``start``,
    the first seq of the turns the provider holds for a request that chains on it."""

    session_id: str
    seq: int
    start: int


class ResponseChains:
    """Response ids (and ``conversation`` ids) the proxy has relayed, per principal: the
    stored turn each produced. Kept in ``store`` when given (``put_response_link``), so a
    chain started through one server process goes on through any other on the store; the
    recently used ones are also kept here (bounded: the least recently used go first)."""

    def __init__(self, entries: int = 100_000, *, store: MemoryStorage | None = None) -> None:
        self.entries = entries
        self.store = store
        self._links: OrderedDict[tuple[str, str], Link] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def named(body: JSON) -> str | None:
        """The id a request chains on: ``previous_response_id``, else its ``conversation``."""
        previous = body.get("previous_response_id")
        if isinstance(previous, str) and previous:
            return previous
        conversation = body.get("conversation")
        if isinstance(conversation, dict):
            conversation = conversation.get("id")
        return f"conversation:{conversation}" if isinstance(conversation, str) else None

    def link(self, principal: str, body: JSON) -> Link | None:
        named = self.named(body)
        if named is None:
            return None
        with self._lock:
            found = self._links.get((principal, named))
            if found is not None:
                self._links.move_to_end((principal, named))
                return found
        if self.store is None:
            return None
        try:
            stored = self.store.records.response_link(principal, named)
        except Exception as exc:  # the store is down: the chain is not known here
            logger.warning("cannot read a response link: %s: %s", type(exc).__name__, exc)
            return None
        if stored is None:
            return None
        found = Link(*stored)
        self._keep(principal, named, found)
        return found

    def token(self, principal: str, body: JSON, secret: bytes) -> str | None:
        """A session token for the turn the request chains on, if the proxy knows it."""
        found = self.link(principal, body)
        if found is None:
            return None
        return make_token(principal, found.session_id, found.seq, secret)

    def remember(self, principal: str, response_id: str, link: Link) -> None:
        if self.store is not None:
            try:
                self.store.records.put_response_link(
                    principal, response_id, link.session_id, link.seq, link.start
                )
            except Exception as exc:  # kept in this process only
                logger.warning("cannot store a response link: %s: %s", type(exc).__name__, exc)
        self._keep(principal, response_id, link)

    def _keep(self, principal: str, response_id: str, link: Link) -> None:
        with self._lock:
            self._links[(principal, response_id)] = link
            self._links.move_to_end((principal, response_id))
            while len(self._links) > self.entries:
                self._links.popitem(last=False)

    def committed(self, plan: Plan, reply: Reply, session_id: str, seqs: list[int]) -> None:
        """Name the stored reply (the last of ``seqs``) by the response's id (and the
        request's ``conversation``), with the first turn its chain holds."""
        if not seqs or plan.original is None:
            return
        previous = self.link(plan.principal, plan.original)
        if previous is not None:
            start = previous.start
        else:
            position, parsed = plan.position, plan.parsed
            held = 0
            if position is not None and parsed is not None:
                held = sum(1 for m in parsed.messages[: position.new_from] if m.role != "system")
            start = position.anchor - held + 1 if held and position is not None else seqs[0]
        link = Link(session_id, seqs[-1], max(1, start))
        response_id = getattr(reply, "response_id", None)
        if isinstance(response_id, str) and response_id:
            self.remember(plan.principal, response_id, link)
        named = self.named({"conversation": plan.original.get("conversation")})
        if named is not None:
            self.remember(plan.principal, named, link)


# --------------------------------------------------------------------------- the memory path

#: At most this many stored turns of a chain are read as the history the provider holds.
MAX_CHAIN = 2000


def prepare(state: ServerState, chains: ResponseChains, plan: Plan, body: JSON) -> None:
    """``recall.prepare`` for a Responses request: position (by content, the header, or the
    response id it chains on), recall over everything the provider will hold (the chain's
    stored turns and the input), compacted history left out, memory appended at the end."""
    memory = state.memory
    wire = WIRE
    input_parsed = wire.parse(body)
    if (note := strip_envelope(state.config.proxy.envelope, input_parsed.messages)) is not None:
        plan.notes.append(note)
    unread = wire.unread(body)
    if unread:
        listed = ", ".join(f"{k} ×{n}" for k, n in sorted(unread.items()))
        plan.notes.append(f"input items carried as they came, not read: {listed}")
    chain: list[Message] = []
    link = chains.link(plan.principal, body)
    if link is not None:
        first = max(link.start, link.seq - MAX_CHAIN + 1)
        chain = [t.message for t in memory.store.turns(link.session_id, first, link.seq)]
        plan.notes.append(
            f"chains on {chains.named(body)}: {len(chain)} stored turns held by the provider"
        )
    parsed = ParsedRequest(
        [*chain, *input_parsed.messages], [()] * len(chain) + input_parsed.sources
    )
    plan.parsed = parsed
    # The chain's turns count too: the provider holds them in the model's window, and the
    # proxy cannot leave them out (``sent_history``: they have no input item of their own).
    plan.fit = fit.measure(state, FORMAT, body, parsed.messages, held=len(chain))
    place(state, plan, parsed, [], header_source="previous_response_id" if link else None)
    fit.note(state, plan, plan.session_id or plan.new_session)
    bare, planned = body, DropPlan(wire, body, parsed)
    assembled = recall(state, plan, parsed, sent=sent_history(planned, filtered=not unread))
    if assembled is not None:
        if unread:
            note = "history filter skipped: the input has items contextfold does not read"
            if assembled.history is not None and assembled.history.removed:
                plan.notes.append(note)
        else:
            bare, _ = drop_compacted(plan, planned, assembled)
    plan.bare = bare
    forwarded = add_memory(plan, wire, bare, assembled, sep="\n\n")
    plan.body = forwarded
    if forwarded is not body:
        plan.content = dumps(forwarded)
