"""Every formatter's payload is one its provider accepts, whatever the history and the budget.

The rules are ``contextfold.testing.payload_problem``'s (the tool-output benchmark checks the
proxy's compacted requests against the same): Anthropic and Gemini: the first turn is the
user's, roles alternate, each tool result answers a call of the turn right before it (results
first in their turn) and every call is answered there. OpenAI: each ``tool`` message answers a
call of the assistant message before the run of tool messages it belongs to, and every call is
answered by that run. The conversations are
well-formed (each call answered right after it) and packed under random budgets, so the window
may start anywhere in them; ``trim_history`` and ``MemoryManager`` keep whole exchanges.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contextfold.budget import TokenBudget
from contextfold.conversation import MemoryManager, trim_history
from contextfold.formats import BaseFormatter
from contextfold.formats.base import item_message
from contextfold.items import ContextItem, Message, QueryBundle, SourceType
from contextfold.testing import payload_problem
from contextfold.tokens import TokenCounter
from strategies import (
    EPOCH,
    FORMATTERS,
    _exchange,
    _user_messages,
    budgets,
    histories,
    short_texts,
)
from test_properties import pack_or_budget_error

_assistant_texts = short_texts.map(lambda t: Message(role="assistant", content=t))
_system_texts = short_texts.map(lambda t: Message(role="system", content=t))
_well_formed = st.sampled_from(["ok", "ok", "split"])


@st.composite
def conversations(draw: st.DrawFn, *, max_exchanges: int = 6) -> list[Message]:
    """Exchanges (a user turn; replies, tool calls each answered right away), sometimes after
    an assistant greeting and sometimes with a system message in between."""
    out: list[Message] = []
    if draw(st.booleans()):
        out.append(draw(_assistant_texts))
    calls = 0
    for _ in range(draw(st.integers(0, max_exchanges))):
        out.append(draw(_user_messages))
        for _ in range(draw(st.integers(0, 3))):
            kind = draw(st.sampled_from(["text", "tool", "tool", "system"]))
            if kind == "text":
                out.append(draw(_assistant_texts))
            elif kind == "system":
                out.append(draw(_system_texts))
            else:
                exchange, used = _exchange(draw, calls, _well_formed)
                calls += used
                out.extend(exchange)
    return out


@st.composite
def windows(draw: st.DrawFn) -> list[ContextItem]:
    history = draw(conversations())
    items = [
        ContextItem.from_message(m, id=f"t{i}", created_at=EPOCH + timedelta(minutes=i))
        for i, m in enumerate(history)
    ]
    if draw(st.booleans()):
        items.insert(
            0, ContextItem(id="sys", content="Be brief.", source=SourceType.SYSTEM, pinned=True)
        )
    for n in range(draw(st.integers(0, 2))):
        source = draw(st.sampled_from([SourceType.MEMORY, SourceType.RETRIEVAL, SourceType.TOOL]))
        items.append(ContextItem(id=f"x{n}", content=draw(short_texts), source=source))
    if draw(st.booleans()):
        items.append(ContextItem(id="q", content="And now?", source=SourceType.USER, pinned=True))
    return items


def _check(fmt: str) -> Callable[[dict[str, Any]], None]:
    def check(payload: dict[str, Any]) -> None:
        problem = payload_problem(fmt, payload)
        assert problem is None, problem

    return check


CHECKS = {fmt: _check(fmt) for fmt in ("anthropic", "gemini", "openai")}


@given(items=windows(), budget=budgets(), formatter=st.sampled_from(FORMATTERS))
def test_every_payload_is_valid_for_its_provider(
    items: list[ContextItem], budget: TokenBudget, formatter: BaseFormatter, o200k: TokenCounter
) -> None:
    window = pack_or_budget_error(items, budget, o200k, formatter)
    if window is None:
        return
    check = CHECKS.get(formatter.name)
    if check is not None:
        check(window.payload)
    assert formatter.count_payload(window.payload, o200k) <= budget.available


@given(items=windows(), budget=budgets(), formatter=st.sampled_from(FORMATTERS))
def test_the_packed_history_opens_on_a_user_turn(
    items: list[ContextItem], budget: TokenBudget, formatter: BaseFormatter, o200k: TokenCounter
) -> None:
    """The packer evicts whole exchanges: unless it kept the whole conversation, what it kept
    of it starts on a user turn whenever it holds one, so no payload needs an invented opening
    turn before a reply whose question was dropped while a later question fit."""
    window = pack_or_budget_error(items, budget, o200k, formatter)
    if window is None:
        return
    conversation = [i.id for i in items if i.source is SourceType.CONVERSATION]
    kept = [i for i in window.items if i.source is SourceType.CONVERSATION]
    if [i.id for i in kept] == conversation:
        return
    roles = [(i.id, item_message(i).role, bool(item_message(i).tool_result_ids)) for i in kept]
    if any(role == "user" and not results for _, role, results in roles):
        assert roles[0][1] == "user" and not roles[0][2], roles


@given(
    history=conversations(), max_tokens=st.integers(0, 600), formatter=st.sampled_from(FORMATTERS)
)
def test_trimmed_and_windowed_histories_open_on_a_user_turn(
    history: list[Message], max_tokens: int, formatter: BaseFormatter, o200k: TokenCounter
) -> None:
    head = [Message(role="system", content="Be brief.")]
    kept = trim_history(head + history, max(max_tokens, 20), o200k, format=formatter.name)
    memory = MemoryManager(max(max_tokens, 1), counter=o200k, format=formatter.name)
    for message in history:
        memory.add_message(message)
        assert not kept[1:] or kept[1].role == "user"
        assert _answered(kept)
        if memory.evicted:  # once the window slid, it opens on a user turn
            assert memory.messages[0].role == "user" if memory.messages else True
        items = memory.context_items(QueryBundle(query_str=""))
        check = CHECKS.get(formatter.name)
        if check is not None and _answered(memory.messages):
            check(formatter.format(items))


def _answered(messages: list[Message]) -> bool:
    calls = {t for m in messages for t in m.tool_use_ids}
    return calls == {t for m in messages for t in m.tool_result_ids}


@given(history=histories(max_turns=20))
def test_the_lazy_walk_finds_the_same_exchanges(history: list[Message]) -> None:
    """trim_history walks exchanges from the end lazily; it must group exactly as
    ``exchanges`` and ``tool_units`` do over the whole history."""
    from contextfold.conversation import _complete, _newest_exchanges, exchanges, tool_units

    bad = {i for idxs in tool_units(history) if not _complete(history, idxs) for i in idxs}
    eager = [(group, bad.intersection(group)) for group in reversed(exchanges(history))]
    assert list(_newest_exchanges(history)) == eager


_USE = {"type": "tool_use", "id": "t1", "name": "Read", "input": {}}
_RESULT = {"type": "tool_result", "tool_use_id": "t1", "content": "text"}


@pytest.mark.parametrize(
    ("messages", "inline_system", "problem"),
    [
        ([{"role": "assistant", "content": "hi"}], False, "first turn is the assistant's"),
        ([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}], False, "in a row"),
        ([{"role": "user", "content": ""}], False, "an empty turn"),
        (
            [{"role": "user", "content": "a"}, {"role": "assistant", "content": [_USE]}],
            False,
            "never answered",
        ),
        (
            [
                {"role": "user", "content": "a"},
                {"role": "assistant", "content": [_USE]},
                {"role": "user", "content": [{"type": "text", "text": "b"}, _RESULT]},
            ],
            False,
            "do not come first",
        ),
        ([{"role": "user", "content": [_RESULT]}], False, "answer the calls []"),
        (
            [{"role": "user", "content": "a"}, {"role": "system", "content": "s"}],
            False,
            "role 'system'",
        ),
        (
            [
                {"role": "user", "content": "a"},
                {"role": "system", "content": "s"},
                {"role": "assistant", "content": [_USE]},
                {"role": "user", "content": [_RESULT]},
                {"role": "system", "content": "s"},
            ],
            True,
            None,
        ),
    ],
)
def test_payload_problem_names_what_the_provider_refuses(
    messages: list[dict[str, Any]], inline_system: bool, problem: str | None
) -> None:
    found = payload_problem("anthropic", {"messages": messages}, inline_system=inline_system)
    assert found == problem if problem is None else problem in (found or ""), found
