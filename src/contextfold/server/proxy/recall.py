"""Memory for one request, before it goes upstream: where the request stands in its
conversation, what to recall, which compacted history to leave out, and where the memory goes.

``prepare`` fills a draft of the request's ``Plan`` (``draft``) on one of the proxy's memory
threads; the proxy takes the draft only when it is ready within ``proxy.memory_deadline_ms``
(``proxy.fit_deadline_ms`` for a request that may not fit the model's window as sent), and
otherwise forwards the request as the client sent it (the late draft is never read).

- **Position** (``session.locate``): the branch and turn the request continues, forked when
  its history diverges; a new conversation gets its session id now and its row at commit —
  or, when it arrives with earlier turns before its query, its row and those turns now,
  derived before the recall (``ingest``), so its first message is tagged against them.
- **Recall**: ``MemoryEngine.on_message_inbound`` for the last user message with text, over
  the branch, with the request's **whole** history — every message it holds, the in-flight
  tool loop after that user message included. Nothing the request already holds is recalled
  again: stored turns are compared with the request's messages by content (match keys, runs
  of whitespace aside: a client may re-render the history it resends), not by position, and
  a turn that is mostly an older version of what the request holds (a file
  re-sent after an edit: half or more of its lines are in the request) is left out too
  (``memory.assemble.Held``).
- **History** (``drop_compacted``): raw messages whose every parsed message the history filter
  removed (compacted into memory) are left out, never splitting a tool call from its result,
  and Anthropic and Gemini still start with a user turn. The query and everything after it
  (an agent's in-flight tool loop) are never left out. The trade-off: leaving messages out
  changes the request's prefix, so the provider's prompt cache misses once — only at a
  compaction event (the filter removes nothing new between two compactions).
- **Inject** (``Wire.inject``): the whole memory block, the ``<context-topics>`` hint
  included, at the end of the request — after the last ``cache_control`` breakpoint, never in
  the system prompt or the first message — so every byte before it is what the client sent.
  A body memory leaves unchanged goes upstream byte for byte.
- **Window** (``fit``): the request is counted against ``memory.context_window`` less the
  reply's reserve before the recall; memory gets only what the history sent leaves
  (``memory.Room``, told by ``sent_history`` what ``drop_compacted`` will send of the history
  the filter keeps: turns the provider holds for a chained request, a tool call kept with its
  result, a user turn kept first; none below ``MIN_MEMORY_TOKENS``, the record says why). A
  block that would take the request past the window all the same is cut to its topic hint, or
  left out (``add_memory``), noted; the request's overhead is noted on the engine for the
  session's compaction.
"""

from __future__ import annotations

import copy
import dataclasses
import uuid
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from contextfold.items import Message
from contextfold.memory.assemble import MIN_MEMORY_TOKENS
from contextfold.server.proxy import fit
from contextfold.server.proxy.envelope import strip_envelope
from contextfold.server.proxy.record import Plan
from contextfold.server.proxy.session import Position, locate, side_call
from contextfold.server.proxy.turns import user_turns
from contextfold.server.proxy.wire import ParsedRequest, Wire, dumps

if TYPE_CHECKING:
    from contextfold.memory.engine import AssembledContext
    from contextfold.server.state import ServerState

__all__ = [
    "DropPlan",
    "draft",
    "drop_compacted",
    "ingest",
    "place",
    "prepare",
    "recall",
    "sent_history",
    "split_memory",
]


def draft(plan: Plan) -> Plan:
    """A copy of ``plan`` for the memory path to fill in: it becomes the plan only when that
    path finishes within its deadline (a late one writes into a copy nobody reads)."""
    out = copy.copy(plan)
    out.notes = list(plan.notes)
    out.dropped, out.dropped_notes, out.tool_calls = [], [], []
    return out


def prepare(
    state: ServerState, plan: Plan, wire: Wire, body: dict[str, Any], *, tools: bool
) -> None:
    """Fill ``plan`` with the body to forward (runs on a memory thread; may raise, and the
    caller then fails open). ``tools``: offer the memory tools too."""
    memory = state.memory
    stripped, tokens = wire.strip(body)
    parsed = wire.parse(stripped)
    plan.parsed = parsed
    plan.notes.extend(parsed.notes)
    if (note := strip_envelope(state.config.proxy.envelope, parsed.messages)) is not None:
        plan.notes.append(note)
    if state.config.proxy.recall_scope == "principal" and plan.header is None:
        reason = side_call(parsed.messages, body)
        if reason is not None:
            # An agent's helper call beside its conversation: it neither continues the
            # credential's latest conversation nor is stored as one; it goes as it came.
            plan.notes.append(f"helper call ({reason}): no memory, not stored")
            plan.wire = None
            return
    definitions = memory.tool_definitions(wire.name, model=plan.model) if tools else []
    plan.fit = fit.measure(state, wire.name, stripped, parsed.messages, extra_tools=definitions)
    place(state, plan, parsed, tokens, create=tools)
    fit.note(state, plan, plan.session_id or plan.new_session)
    ingest(state, plan, parsed)
    bare, planned = stripped, DropPlan(wire, stripped, parsed)
    assembled = recall(state, plan, parsed, sent=sent_history(planned))
    if assembled is not None:
        bare, _ = drop_compacted(plan, planned, assembled)
    plan.bare = bare
    forwarded = add_memory(plan, wire, bare, assembled)
    if tools:
        forwarded = wire.add_tools(forwarded, definitions)
    plan.body = forwarded
    if forwarded is not body:  # unchanged: the client's own bytes go upstream
        plan.content = dumps(forwarded)


def place(
    state: ServerState,
    plan: Plan,
    parsed: ParsedRequest,
    tokens: Sequence[str],
    *,
    create: bool = False,
    header_source: str | None = None,
) -> None:
    """Where the request stands (``session.locate``: found by content, marker or header,
    forked when its history diverges), recorded in ``plan``; the query's embedding starts
    first, so it runs while the session is found. ``create``: a new conversation gets its
    session now (the memory tools need one), else its id is minted for the commit.
    ``header_source``: how to name a position the header found (the Responses API's
    ``previous_response_id``)."""
    memory = state.memory
    if parsed.query is not None:
        memory.prefetch(parsed.query_text)
    position, forked = locate(
        memory.store,
        plan.principal,
        parsed.messages,
        tokens,
        plan.header,
        state.secret,
        scope=state.config.proxy.recall_scope,
    )
    if forked is not None:
        plan.notes.append(f"continues turn {forked[1]} of {forked[0][:8]} on a new branch")
    if header_source is not None and position.source == "header":
        position = dataclasses.replace(position, source=header_source)
    if create and position.session_id is None:
        sid = memory.store.create_session(principal=plan.principal)
        position = Position(sid, 0, position.new_from, position.source, expect_last=0)
    plan.position = position
    plan.session_id = position.session_id
    plan.session_source = position.source
    if position.session_id is None:  # created with this id when the exchange commits
        plan.new_session = uuid.uuid4().hex


def ingest(state: ServerState, plan: Plan, parsed: ParsedRequest) -> None:
    """A conversation the proxy has not stored, arriving with earlier turns before its query
    (a client switched to the proxy mid-conversation): store those turns and derive them
    (tags, vectors, compaction) now, before the recall, so the first request's message is
    tagged and recalled against its own history. The commit then stores only the query, what
    follows it and the reply."""
    position = plan.position
    if position is None or position.source != "new" or position.anchor or position.fork:
        return  # it continues a stored conversation (or the caller's latest one)
    if parsed.query is None:
        return
    earlier = [m for m in parsed.messages[position.new_from : parsed.query] if m.role != "system"]
    if not earlier:
        return
    memory = state.memory
    sid = position.session_id or memory.store.create_session(
        plan.new_session, principal=plan.principal
    )
    # One exchange: its turns share one time (the commit stores the rest at it too), so the
    # earlier turns are not taken for replies (``session._agrees_short_of_a_reply``).
    plan.exchange_time = datetime.now(UTC)
    seqs = memory.store_turns(sid, earlier, timestamps=[plan.exchange_time] * len(earlier))
    memory.derive(sid)
    plan.position = Position(sid, seqs[-1], parsed.query, position.source, expect_last=seqs[-1])
    plan.session_id = sid
    plan.new_session = None
    plan.ingested, plan.ingested_seqs = user_turns(earlier), (seqs[0], seqs[-1])
    plan.notes.append(f"history of {len(earlier)} turn(s) stored and derived before recall")


def recall(
    state: ServerState,
    plan: Plan,
    parsed: ParsedRequest,
    *,
    sent: Callable[[list[int]], Iterable[int]] | None = None,
) -> AssembledContext | None:
    """The memory for the request's query over its branch (``None``, with the reason in the
    notes, when there is no query or nothing stored yet). The whole request is the history:
    the in-flight tool loop after the query is in it too, and the filter keeps the query and
    that loop whole, so nothing the request holds is recalled again. ``sent``: what the
    request sends of its history when the filter keeps some (``sent_history``), so memory
    gets what the window leaves beside that."""
    if parsed.query is None:
        plan.notes.append("no user message with text: nothing recalled")
        return None
    if plan.session_id is None:
        plan.notes.append("a new conversation: nothing stored yet to recall")
        return None
    assembled = state.memory.on_message_inbound(
        parsed.query_text,
        parsed.messages,
        session_id=plan.session_id,
        protected=len(parsed.messages) - parsed.query,
        model=plan.model,
        room=plan.fit.room(sent) if plan.fit is not None else None,
    )
    plan.assembled = assembled
    if plan.fit is not None and (note := _room_note(state, plan.fit, assembled)) is not None:
        plan.notes.append(note)
    if assembled.unembedded:
        plan.notes.append(
            f"{assembled.unembedded} turn(s) not embedded yet: recalled by full text and tags"
        )
    if assembled.withheld:
        plan.notes.append(f"no memory: {assembled.withheld}")
    if assembled.budget.turns_held:
        plan.notes.append(
            f"{assembled.budget.turns_held} recalled turn(s) left out: older versions of"
            " what the request holds"
        )
    return assembled


def _room_note(state: ServerState, counted: fit.Fit, assembled: AssembledContext) -> str | None:
    """What the window left memory, when that was less than its budget."""
    left, budget = assembled.room_left, state.memory.config.assembly.memory_budget
    if left is None or left >= budget:
        return None
    beside = (
        f"the request leaves {max(left, 0):,} tokens of the {counted.window:,}-token window"
        f" ({counted.reserve:,} kept for the reply)"
    )
    if left < MIN_MEMORY_TOKENS:
        return f"no room in the window for memory: {beside}"
    return f"memory budget cut to {assembled.budget.budget:,} tokens: {beside}"


def add_memory(
    plan: Plan,
    wire: Wire,
    bare: dict[str, Any],
    assembled: AssembledContext | None,
    *,
    sep: str = "\n",
) -> dict[str, Any]:
    """``bare`` with the memory block injected at its end (the hint and the rest joined by
    ``sep``), the body's tokens counted (``fit.forwarded``). Where the block would take the
    request past the window all the same (the room the recall was given did not foresee the
    history forwarded), only its ``<context-topics>`` hint goes when that fits, else no memory
    — noted either way, with the numbers."""
    if assembled is not None:
        plan.hint, plan.dynamic = split_memory(assembled)
    text = sep.join(t for t in (plan.hint, plan.dynamic) if t)
    injected = wire.inject(bare, text) if text else bare
    if text and injected is bare:
        plan.notes.append("memory not added: the request has no user message to take it")
    if injected is bare or assembled is None:
        plan.hint = plan.dynamic = ""
        if plan.fit is not None:
            fit.forwarded(plan, 0)
        return bare
    memory_tokens = assembled.budget.used
    counted = plan.fit
    if counted is None:
        return injected
    sent = fit.forwarded(plan, memory_tokens)
    if sent <= counted.limit:
        return injected
    # More history goes than the room foresaw: the difference, for the note.
    without = fit.forwarded(plan, 0)
    beyond = ""
    extra = None if assembled.room_left is None else assembled.room_left - (counted.limit - without)
    if extra is not None and extra > 0:
        beyond = f" (the history forwarded takes {extra:,} tokens more than its room foresaw)"
    why = (
        f"with all {memory_tokens:,} tokens of it the request would be"
        f" {sent - counted.limit:,} tokens over the window{beyond}"
    )
    hint = assembled.budget.hint
    if plan.hint and plan.dynamic and without + hint <= counted.limit:
        fit.forwarded(plan, hint)
        plan.dynamic = ""
        plan.notes.append(f"memory cut to its topic hint ({hint:,} tokens): {why}")
        return wire.inject(bare, plan.hint)
    plan.notes.append(f"memory left out: {why}")
    plan.hint = plan.dynamic = ""
    return bare


class DropPlan:
    """``_planned_drop`` for one request, its last answer kept: the recall's room asks what
    the history the filter keeps sends (``sent_history``), and ``drop_compacted`` then asks
    the same of what the filter removed (2 ms for a 500-message history, once instead of
    twice on the request path)."""

    __slots__ = ("_last", "body", "parsed", "wire")

    def __init__(self, wire: Wire, body: dict[str, Any], parsed: ParsedRequest) -> None:
        self.wire, self.body, self.parsed = wire, body, parsed
        self._last: tuple[frozenset[int], tuple[set[int], list[int]]] | None = None

    def __call__(self, removed: set[int]) -> tuple[set[int], list[int]]:
        key = frozenset(removed)
        if self._last is None or self._last[0] != key:
            self._last = (key, _planned_drop(self.wire, self.body, self.parsed, removed))
        drop, dropped = self._last[1]
        return set(drop), list(dropped)


def sent_history(planned: DropPlan, *, filtered: bool = True) -> Callable[[list[int]], list[int]]:
    """What the request sends of its history when the history filter keeps the messages
    ``kept`` (``memory.Room.sent``): those, and what ``drop_compacted`` cannot leave out of
    the rest — a message with no raw message of its own (the turns the provider holds for a
    chained Responses request, a separate system field), a raw message only part of which the
    filter removed, a tool call kept with its result, a user turn kept first; the whole
    history where the filter is not applied (``filtered=False``)."""
    everything = range(len(planned.parsed.messages))

    def sent(kept: list[int]) -> list[int]:
        if not filtered:
            return list(everything)
        dropped = set(planned(set(everything).difference(kept))[1])
        return [i for i in everything if i not in dropped]

    return sent


def drop_compacted(
    plan: Plan, planned: DropPlan, assembled: AssembledContext
) -> tuple[dict[str, Any], set[int]]:
    """Leave out of ``planned``'s body the raw messages whose every parsed message the
    history filter removed (compacted into memory), keeping tool calls with their results
    and a user turn first."""
    body = planned.body
    filtered = assembled.history
    if filtered is None or not filtered.removed:
        return body, set()
    removed = {r.index: r for r in filtered.removed}
    drop, dropped = planned(set(removed))
    if not drop:
        return body, set()
    plan.dropped = dropped
    plan.dropped_notes = [
        f"{removed[i].reason}: {removed[i].preview}" for i in dropped if i in removed
    ]
    return planned.wire.drop(body, drop), drop


def _planned_drop(
    wire: Wire, body: dict[str, Any], parsed: ParsedRequest, removed: set[int]
) -> tuple[set[int], list[int]]:
    """(the raw messages to leave out, the parsed messages they carry) when the filter
    removed the parsed messages ``removed``: those whose every parsed message it removed,
    less the ones that would split a tool call from its result (the raw message holding the
    other side is kept too) and, for Anthropic and Gemini, the ones before the first user
    turn left."""
    by_raw: dict[int, list[int]] = {}
    for i, sources in enumerate(parsed.sources):
        for raw in sources:
            by_raw.setdefault(raw, []).append(i)
    drop = {r for r, idx in by_raw.items() if r >= 0 and all(i in removed for i in idx)}
    ids = {r: {t for i in by_raw[r] for t in _tool_ids(parsed.messages[i])} for r in drop}
    whole = _orphans(parsed.messages)
    while True:  # each round only keeps more, so it ends
        if drop and wire.name != "openai":  # Anthropic and Gemini want a user turn first
            count = len(wire.items(body))
            first = next((i for i in range(count) if i not in drop), None)
            while first is not None and wire.raw_role(body, first) != "user":
                before = [d for d in drop if d < first]
                if not before:
                    break
                first = max(before)
                drop.discard(first)
        dropped = sorted(i for r in drop for i in by_raw[r])
        gone = set(dropped)
        split = _orphans([m for i, m in enumerate(parsed.messages) if i not in gone]) - whole
        if not split:
            return drop, dropped
        drop -= {r for r in drop if ids[r] & split}  # the other side's message kept too


def split_memory(assembled: AssembledContext) -> tuple[str, str]:
    """(the ``<context-topics>`` hint, the rest) of the memory block, for the record (both go
    at the end of the request, the hint first)."""
    text = assembled.prepend_text
    hint = next((i.content for i in assembled.items if i.metadata.get("kind") == "hint"), "")
    if hint and text.startswith(hint):
        return hint, text[len(hint) :].lstrip("\n")
    return "", text


def _tool_ids(message: Message) -> set[str]:
    """The tool calls a message makes and the results it gives back."""
    return {*message.tool_use_ids, *message.tool_result_ids}


def _orphans(messages: list[Message]) -> set[str]:
    calls = {i for m in messages for i in m.tool_use_ids}
    results = {i for m in messages for i in m.tool_result_ids}
    return calls ^ results
