"""The raw exchange, committed before the reply's last byte goes to the client.

What is new is known, not guessed: the messages after the turn the request continues
(``session.resolve``) and the reply. They are appended raw in one transaction with the
session's ``derive`` job (``MemoryStore.commit_exchange``) — no tagging, no model — so an
exchange the client has received is in the store even if the process dies the next moment;
tags, vectors, summaries and compaction follow from the job (``server.jobs``). A request
whose memory path did not finish (its deadline passed, or it failed) is resolved here, so it
is stored all the same. When the branch moved on while the request was upstream (another
request on the same branch committed first), the exchange goes on a new branch forked at the
turn it continued. A reply cut off is stored flagged ``partial``.

An exchange the store could not take (``spool``) is stored later by ``replay_exchange``, which
finds the conversation again as a request would and writes only what the store lacks.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import TYPE_CHECKING, cast

from contextfold.server.proxy import responses
from contextfold.server.proxy.envelope import strip_envelope
from contextfold.server.proxy.record import Plan
from contextfold.server.proxy.session import Position, locate, resolve
from contextfold.server.proxy.wire import WIRES, ParsedRequest
from contextfold.store.models import BranchMoved

if TYPE_CHECKING:
    from contextfold.items import Message
    from contextfold.server.proxy.routes import Proxy
    from contextfold.server.proxy.spool import Spooled
    from contextfold.server.proxy.stream import Reply
    from contextfold.store.protocols import MemoryStorage

__all__ = ["commit_exchange", "replay_exchange"]


def _request(proxy: Proxy, plan: Plan) -> tuple[ParsedRequest, list[str]]:
    """The request's messages as the memory path reads them (markers and the envelope taken
    out), and the marker tokens found in them."""
    assert plan.wire is not None and plan.original is not None
    stripped, tokens = plan.wire.strip(plan.original)
    parsed = plan.wire.parse(stripped)
    strip_envelope(proxy.state.config.proxy.envelope, parsed.messages)
    return parsed, list(tokens)


def commit_exchange(
    proxy: Proxy, plan: Plan, reply: Message, partial: bool = False
) -> tuple[str, list[int]]:
    """Store the request's new messages and ``reply``; returns (session, their seqs)."""
    store = proxy.state.memory.store
    position, parsed = plan.position, plan.parsed
    if position is None or parsed is None:
        parsed, position = _located(proxy, plan)
        plan.session_source = position.source  # (the record's: its memory path did not say)
    try:
        return _commit(store, plan, parsed, position, reply, partial)
    except BranchMoved:
        pass
    # The branch moved on while the request was upstream: another request on it committed
    # first, or the replay of a spooled exchange that this request's history resends. Found
    # again, the request continues where its history now stands (after that exchange, which
    # is not stored twice); a branch another continuation took is forked at the turn the
    # request continues, as before.
    parsed, position = _located(proxy, plan)
    try:
        return _commit(store, plan, parsed, position, reply, partial)
    except BranchMoved:
        assert position.session_id is not None
        forked = store.fork(position.session_id, position.anchor)
        moved = Position(forked, position.anchor, position.new_from, position.source)
        return _commit(store, plan, parsed, moved, reply, partial)


def _located(proxy: Proxy, plan: Plan) -> tuple[ParsedRequest, Position]:
    """The request's messages and where they stand now (``locate``: forks where needed)."""
    parsed, tokens = _request(proxy, plan)
    position, _ = locate(
        proxy.state.memory.store,
        plan.principal,
        parsed.messages,
        tokens,
        plan.header,
        proxy.state.secret,
        scope=proxy.state.config.proxy.recall_scope,
    )
    return parsed, position


def _commit(
    store: MemoryStorage,
    plan: Plan,
    parsed: ParsedRequest,
    position: Position,
    reply: Message,
    partial: bool,
) -> tuple[str, list[int]]:
    """Append the messages after ``position`` and ``reply`` to its branch (a new session for
    a new conversation); ``BranchMoved`` when the branch has moved past its ``expect_last``."""
    new = [m for m in parsed.messages[position.new_from :] if m.role != "system"]
    messages = [*new, reply]
    flags = [False] * len(new) + [partial]
    # The rest of an exchange whose first turns were stored before the recall (``ingest``).
    when = [plan.exchange_time] * len(messages) if plan.exchange_time is not None else None
    sid = position.session_id
    if sid is None:
        sid = plan.new_session
        # (a replay's session may exist already: the failed commit created it, empty)
        if sid is None or store.principal_of(sid) != plan.principal:
            sid = store.create_session(plan.new_session, principal=plan.principal)
        return sid, store.commit_exchange(
            sid, messages, partial=flags, expect_last=0, timestamps=when
        )
    seqs = store.commit_exchange(
        sid, messages, partial=flags, expect_last=position.expect_last, timestamps=when
    )
    return sid, seqs


def replay_exchange(proxy: Proxy, spooled: Spooled) -> tuple[str, list[int]] | None:
    """Store a spooled exchange as its request would have been stored (a Responses reply's id
    named too): (session, seqs), or ``None`` when the store holds it already (the
    conversation's next request, resending the history, stored it first). Raises what the
    store raises while it still fails."""
    plan = Plan(
        id=f"spooled-{spooled.id}",
        format=spooled.format,
        path="",
        model=None,
        stream=False,
        principal=spooled.principal,
        header=spooled.header,
        wire=responses.WIRE if spooled.format == responses.FORMAT else WIRES[spooled.format],
        original=spooled.body,
        new_session=spooled.new_session,
        exchange_time=spooled.exchange_time,
    )
    parsed, tokens = _request(proxy, plan)
    history = [*parsed.messages, spooled.reply]
    held = resolve(
        proxy.state.memory.store,
        plan.principal,
        history,
        tokens,
        plan.header,
        proxy.state.secret,
    )
    if held.session_id is not None and all(m.role == "system" for m in history[held.new_from :]):
        return None  # the reply is stored, after the same history
    sid, seqs = commit_exchange(proxy, plan, spooled.reply, spooled.partial)
    if spooled.format == responses.FORMAT and spooled.response_id:
        # the response's id names the stored reply, as the live commit would have named it
        named = cast("Reply", SimpleNamespace(response_id=spooled.response_id))
        proxy.chains.committed(plan, named, sid, seqs)
    return sid, seqs
