"""Example-based tests of the packer: ranking, overflow strategies, groups, reservations,
summarize hooks, unclaimed sources, tool exchanges and the errors it raises.

Costs come from the formatter itself (``CharCounter``: a token per four characters), so each
test states its budget as "room for these items" rather than as magic numbers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

import pytest

from contextfold.budget import OverflowStrategy, SectionBudget, TokenBudget, fixed5_budget
from contextfold.errors import BudgetError
from contextfold.formats import (
    AnthropicFormatter,
    BaseFormatter,
    GeminiFormatter,
    GenericTextFormatter,
    OpenAIFormatter,
)
from contextfold.items import (
    ContextItem,
    Message,
    Role,
    SourceType,
    ToolResultBlock,
    ToolUseBlock,
)
from contextfold.tokens import CharCounter, TokenCounter
from contextfold.truncation import TRUNCATION_MARKER, sentence_ends
from contextfold.window import Action, Window, pack

COUNTER = CharCounter()
FMT = OpenAIFormatter()
BASE = FMT.base_cost(COUNTER)
T0 = datetime(2025, 1, 1, tzinfo=UTC)
PROSE = (
    "The first sentence sets the scene. The second one adds a detail. A third follows it. "
    "The fourth sentence is here too. And the fifth closes the paragraph."
)
_DROP, _CUT, _OLDEST = (
    OverflowStrategy.DROP,
    OverflowStrategy.TRUNCATE,
    OverflowStrategy.TRUNCATE_OLDEST,
)
_R = SourceType.RETRIEVAL


def cost(*items: ContextItem) -> int:
    return sum(FMT.item_cost(i, COUNTER) for i in items)


def doc(id: str, text: str = "x" * 40, source: SourceType = _R, **fields: Any) -> ContextItem:
    fields.setdefault("created_at", T0)
    return ContextItem(id=id, content=text, source=source, **fields)


def section(
    name: str = "docs", sources: Sequence[SourceType] = (_R,), **fields: Any
) -> SectionBudget:
    return SectionBudget(name=name, sources=tuple(sources), **fields)


def budget(room: int, *sections: SectionBudget, strict: bool = False) -> TokenBudget:
    """A budget leaving exactly ``room`` tokens for items once the format's frame is paid."""
    return TokenBudget(max_tokens=BASE + room, sections=sections, strict=strict)


def actions(window: Window) -> dict[str, Action]:
    return {d.item_id: d.action for d in window.decisions}


def kept(window: Window) -> list[str]:
    return [i.id for i in window.items]


def turn(id: str, role: Role, *blocks: Any, **fields: Any) -> ContextItem:
    content = blocks[0] if len(blocks) == 1 and isinstance(blocks[0], str) else blocks
    return ContextItem.from_message(Message(role=role, content=content), id=id, **fields)


def call(id: str, *call_ids: str) -> ContextItem:
    return turn(id, "assistant", *(ToolUseBlock(id=c, name="search") for c in call_ids))


def result(id: str, call_id: str, text: str = "42") -> ContextItem:
    return turn(id, "tool", ToolResultBlock(tool_use_id=call_id, content=text))


# --------------------------------------------------------------------------- ranking


@pytest.mark.parametrize(
    ("ranks", "expected"),
    [
        ([(5, 0.0), (5, 0.0), (5, 0.0)], ["a", "b"]),  # ties: candidate order
        ([(1, 0.0), (5, 0.0), (9, 0.0)], ["b", "c"]),  # higher priority first
        ([(5, 0.9), (5, 0.1), (5, 0.5)], ["a", "c"]),  # equal priority: higher score
        ([(9, 0.0), (5, 0.9), (5, 0.1)], ["a", "b"]),  # priority beats score
        ([(2, 0.0), (2, -1.0), (3, -5.0)], ["a", "c"]),  # negative scores rank lowest
    ],
)
def test_priority_then_score_decides_inside_a_section(
    ranks: list[tuple[int, float]], expected: list[str]
) -> None:
    items = [doc(n, priority=p, score=s) for n, (p, s) in zip("abc", ranks, strict=True)]
    window = pack(items, budget(2 * cost(items[0]), section()), COUNTER, FMT)
    assert kept(window) == expected
    (lost,) = (d for d in window.decisions if d.action is Action.DROPPED)
    assert lost.reason == f"needs {cost(items[0])} tokens, 0 left in section 'docs'"
    assert [i.id for i in window.overflow_items] == [lost.item_id]


def test_drop_skips_a_misfit_and_keeps_filling_with_smaller_items() -> None:
    big, small, smaller = doc("big", "b" * 200, priority=9), doc("small"), doc("smaller", "s")
    room = cost(small, smaller) + 3
    window = pack([big, small, smaller], budget(room, section(overflow=_DROP)), COUNTER, FMT)
    assert kept(window) == ["small", "smaller"]
    drop = window.decisions[0]
    assert (drop.action, drop.tokens_before, drop.tokens_after) == (Action.DROPPED, cost(big), 0)
    assert drop.reason == f"needs {cost(big)} tokens, {room} left in section 'docs'"
    assert window.used_tokens == FMT.count_payload(window.payload, COUNTER) <= BASE + room


# --------------------------------------------------------------------------- truncation


@pytest.mark.parametrize("spare", [0, 6, 12, 19])
def test_truncate_cuts_at_a_sentence_boundary_with_the_marker(spare: int) -> None:
    head, long = doc("head"), doc("long", PROSE, priority=1)
    room = cost(head) + 20 + spare
    window = pack([head, long], budget(room, section(overflow=_CUT)), COUNTER, FMT)
    assert actions(window) == {"head": Action.KEPT, "long": Action.TRUNCATED}
    cut = window.items[1]
    kept_text, marker = cut.content.rsplit(" ", 1)
    assert marker == TRUNCATION_MARKER
    assert len(kept_text) in sentence_ends(PROSE) and PROSE.startswith(kept_text)
    decision = window.decisions[1]
    assert decision.tokens_after == cost(cut) <= room - cost(head) < decision.tokens_before
    assert decision.reason.startswith(f"cut from {cost(long)} to {cost(cut)} tokens")


def test_truncate_cuts_only_once_per_section_then_drops() -> None:
    items = [doc(n, PROSE) for n in "abc"]
    window = pack(items, budget(cost(items[0]) + 25, section(overflow=_CUT)), COUNTER, FMT)
    assert actions(window) == {"a": Action.KEPT, "b": Action.TRUNCATED, "c": Action.DROPPED}


@pytest.mark.parametrize("order", [[0, 1, 2], [2, 1, 0], [1, 2, 0]])
def test_truncate_oldest_keeps_the_newest_output_whole(order: list[int]) -> None:
    outputs = [
        doc(f"out{k}", PROSE, SourceType.TOOL, created_at=T0 + timedelta(minutes=k))
        for k in range(3)
    ]
    items = [outputs[k] for k in order]
    tools = section("tools", (SourceType.TOOL,), overflow=_OLDEST)
    window = pack(items, budget(cost(outputs[2]) + 25, tools), COUNTER, FMT)
    decisions = actions(window)
    assert decisions == {"out2": Action.KEPT, "out1": Action.TRUNCATED, "out0": Action.DROPPED}
    cut = next(i for i in window.items if i.id == "out1")
    assert cut.content.startswith(f"{TRUNCATION_MARKER} ") and PROSE.endswith(cut.content[13:])
    dropped = next(d for d in window.decisions if d.item_id == "out0")
    assert dropped.reason.endswith("(oldest outputs go first)")


# --------------------------------------------------------------------------- groups


@pytest.mark.parametrize(("extra", "expected"), [(0, ["c"]), (40, ["a", "b", "c"])])
def test_a_group_is_packed_all_or_none(extra: int, expected: list[str]) -> None:
    a, b = doc("a", priority=9, group_id="g"), doc("b", "x" * 80, priority=1, group_id="g")
    c = doc("c", priority=5)
    window = pack([a, b, c], budget(cost(a, c) + extra, section()), COUNTER, FMT)
    assert kept(window) == expected
    if "a" not in expected:
        group = [d for d in window.decisions if d.item_id in "ab"]
        assert {d.reason for d in group} == {
            f"needs {cost(a, b)} tokens, {cost(a, c)} left in section 'docs'"
        }


# --------------------------------------------------------------------------- reservations


@pytest.mark.parametrize(("strict", "expected"), [(False, ["a", "b", "c"]), (True, ["a"])])
def test_unused_reservations_flow_to_others_unless_strict(
    strict: bool, expected: list[str]
) -> None:
    items = [doc(n) for n in "abc"]
    per_doc = cost(items[0])
    memory = section("memory", (SourceType.MEMORY,), min=2 * per_doc, priority=9)
    docs = section("docs", priority=5)
    window = pack(items, budget(3 * per_doc, memory, docs, strict=strict), COUNTER, FMT)
    assert kept(window) == expected
    usage = {s.name: s for s in window.sections}
    assert usage["memory"].used == 0 and usage["docs"].used == len(expected) * per_doc


def test_strict_reservations_filling_the_window_still_leave_room_for_the_frame() -> None:
    """Reservations that fill the whole window leave the format's frame a negative shared
    pool; tool exchanges (never cut, never dropped after measuring) must still fit."""
    budget5 = fixed5_budget(scale=0.2, frame_tokens=0)
    size = {s.name: s.min for s in budget5.sections}
    pins = [
        fill_to(partial(doc, f"pin-{name}", source=source, pinned=True), size[name])
        for name, source in [
            ("instructions", SourceType.SYSTEM),
            ("retrieval", _R),
            ("tool_outputs", SourceType.TOOL),
        ]
    ]
    history = [*exchange("old", size["goal"] // 2), *exchange("new", size["goal"] // 2)]
    window = pack([*pins, *history], budget5, COUNTER, FMT)
    assert window.used_tokens == FMT.count_payload(window.payload, COUNTER) <= budget5.available
    assert kept(window) == [*(p.id for p in pins), "new-call", "new-result"]
    assert actions(window)["old-call"] is actions(window)["old-result"] is Action.DROPPED


def fill_to(make: Callable[[str], ContextItem], target: int) -> ContextItem:
    """``make(text)`` with the text padded until the item costs exactly ``target`` tokens."""
    for n in range(4 * target):
        item = make("y" * n)
        if cost(item) == target:
            return item
    raise AssertionError(f"no padding makes {make('').id} cost {target}")


def exchange(prefix: str, total: int) -> list[ContextItem]:
    """A tool call and its result costing ``total`` tokens together."""
    asked = call(f"{prefix}-call", f"{prefix}-1")
    answer = fill_to(lambda t: result(f"{prefix}-result", f"{prefix}-1", t), total - cost(asked))
    return [asked, answer]


# --------------------------------------------------------------------------- summarize hook


def first_words(
    items: Sequence[ContextItem], max_tokens: int, counter: TokenCounter
) -> list[ContextItem]:
    text = "; ".join(i.content.split(".")[0] for i in items)
    return [
        ContextItem(
            id="summary", content=counter.cut(text, max_tokens // 2), source=SourceType.MEMORY
        )
    ]


def offline(
    items: Sequence[ContextItem], max_tokens: int, counter: TokenCounter
) -> list[ContextItem]:
    raise RuntimeError("summarizer offline")


def test_summarize_hook_replaces_the_misfits() -> None:
    items = [doc("a"), doc("b", PROSE), doc("c", PROSE)]
    docs = section(overflow=OverflowStrategy.SUMMARIZE, summarize=first_words)
    window = pack(items, budget(cost(items[0]) + 30, docs), COUNTER, FMT)
    assert kept(window) == ["a", "summary"]
    summary = window.items[1]
    assert summary.section == "docs" and summary.content.startswith("The first sentence")
    for decision in window.decisions[1:]:
        assert decision.action is Action.SUMMARIZED
        assert decision.reason == "summarized into 1 item(s) by the section's hook"
    assert [i.id for i in window.overflow_items] == ["b", "c"]
    assert window.used_tokens <= window.available


def test_a_failing_summarize_hook_leaves_the_misfits_dropped_with_the_error() -> None:
    items = [doc("a"), doc("b", PROSE)]
    docs = section(overflow=OverflowStrategy.SUMMARIZE, summarize=offline)
    window = pack(items, budget(cost(items[0]) + 30, docs), COUNTER, FMT)
    assert kept(window) == ["a"]
    dropped = window.decisions[1]
    assert dropped.action is Action.DROPPED
    assert dropped.reason.startswith("summarize hook failed (RuntimeError: summarizer offline); ")
    assert dropped.reason.endswith(f"needs {cost(items[1])} tokens, 30 left in section 'docs'")


# --------------------------------------------------------------------------- unclaimed sources


@pytest.mark.parametrize(("strict", "expected"), [(False, Action.KEPT), (True, Action.DROPPED)])
def test_items_no_section_claims_go_to_unassigned(strict: bool, expected: Action) -> None:
    note = doc("note", "remember this", SourceType.MEMORY)
    window = pack([doc("a"), note], budget(200, section(), strict=strict), COUNTER, FMT)
    decision = window.decisions[1]
    assert (decision.section, decision.action) == ("unassigned", expected)
    usage = {s.name: s for s in window.sections}["unassigned"]
    assert (usage.limit, usage.used) == ((0, 0) if strict else (None, cost(note)))
    if strict:
        assert decision.reason == f"needs {cost(note)} tokens, 0 left in section 'unassigned'"


# --------------------------------------------------------------------------- history and tools


def test_history_is_cut_newest_first_and_stays_a_suffix() -> None:
    turns = [turn(f"t{k}", "assistant" if k % 2 else "user", "z" * 40) for k in range(5)]
    window = pack(
        turns,
        budget(cost(*turns[2:]) + 5, section(sources=[SourceType.CONVERSATION])),
        COUNTER,
        FMT,
    )
    assert kept(window) == ["t2", "t3", "t4"]
    assert {d.reason for d in window.decisions[:2]} == {
        f"needs {cost(turns[1])} tokens, 5 left in section 'docs'",
        "older than the oldest kept turn; history stays a contiguous suffix",
    }


def test_history_keeps_whole_exchanges_when_a_user_turn_fits() -> None:
    """A reply whose question did not fit goes too, so history opens on a user turn."""
    turns = [turn(f"t{k}", "user" if k % 2 else "assistant", "z" * 40) for k in range(5)]
    window = pack(
        turns,
        budget(cost(*turns[2:]) + 5, section(sources=[SourceType.CONVERSATION])),
        COUNTER,
        FMT,
    )
    assert kept(window) == ["t3", "t4"]  # t2 fits, but it answers t1, which does not
    reasons = [d.reason for d in window.decisions]
    assert reasons[2] == (
        "in an exchange whose user turn did not fit; history keeps whole exchanges, so it "
        "opens on a user turn"
    )
    assert reasons[1] == f"needs {cost(turns[1])} tokens, 5 left in section 'docs'"
    assert FMT.count_payload(window.payload, COUNTER) == window.used_tokens
    assert window.used_tokens <= cost(*turns[3:]) + FMT.base_cost(COUNTER)


def test_tool_rounds_without_a_user_turn_stay() -> None:
    """When no user turn fits at all (tool rounds after an old task), the newest rounds stay:
    dropping them would leave the model nothing."""
    rounds = [call("c1", "x1"), result("r1", "x1", "a" * 40), call("c2", "x2"), result("r2", "x2")]
    items = [turn("task", "user", "t" * 200), *rounds]
    window = pack(
        items, budget(cost(*rounds) + 5, section(sources=[SourceType.CONVERSATION])), COUNTER, FMT
    )
    assert kept(window) == ["c1", "r1", "c2", "r2"]


@pytest.mark.parametrize("aside", [[], [turn("aside", "user", "wait, one more thing")]])
def test_a_tool_exchange_is_kept_whole_or_dropped_whole(aside: list[ContextItem]) -> None:
    exchange_ = [call("ask", "c1"), *aside, result("answer", "c1", "r" * 80)]
    last = turn("last", "user", "thanks")
    first = turn("first", "user", "hello")
    items = [first, *exchange_, last]
    conversation = section(sources=[SourceType.CONVERSATION])
    full = cost(first, *exchange_, last)
    window = pack(items, budget(full - 1, conversation), COUNTER, FMT)
    assert kept(window) == ["last"]  # the exchange (and a turn inside it) does not fit
    window = pack(items, budget(full, conversation), COUNTER, FMT)
    assert kept(window) == [i.id for i in items]
    # The exchange alone fits, but the user turn it answers does not: it goes with it.
    window = pack(items, budget(cost(*exchange_, last), conversation), COUNTER, FMT)
    assert kept(window) == ["last"]


def test_a_group_spanning_turns_keeps_history_a_suffix() -> None:
    items = [
        turn("a", "user", "q" * 80, group_id="g"),
        turn("b", "assistant", "short"),
        turn("c", "user", "q" * 80, group_id="g"),
        turn("d", "assistant", "last"),
    ]
    conversation = section(sources=[SourceType.CONVERSATION])
    window = pack(items, budget(cost(*items[1:]), conversation), COUNTER, FMT)
    assert kept(window) == ["d"]  # keeping b without c would leave a gap
    window = pack(items, budget(cost(*items), conversation), COUNTER, FMT)
    assert kept(window) == ["a", "b", "c", "d"]


@pytest.mark.parametrize(
    "fmt",
    [OpenAIFormatter(), AnthropicFormatter(), GeminiFormatter(), GenericTextFormatter()],
    ids=lambda f: f.name,
)
@pytest.mark.parametrize(
    ("items", "reason"),
    [
        (
            [call("ask", "c1", "c2"), result("r1", "c1")],
            "tool call c2 has no result among the candidates",
        ),
        ([result("r1", "c9")], "tool result for c9 has no call among the candidates"),
    ],
)
def test_orphaned_tool_traffic_is_dropped_with_a_reason(
    fmt: BaseFormatter, items: list[ContextItem], reason: str
) -> None:
    window = pack([*items, turn("q", "user", "next?")], TokenBudget(max_tokens=500), COUNTER, fmt)
    assert kept(window) == ["q"]
    assert {d.reason for d in window.decisions[:-1]} == {reason}
    assert "c1" not in str(window.payload) and "c9" not in str(window.payload)


def test_a_pinned_group_never_carries_orphaned_tool_traffic() -> None:
    query = doc("q", "what now?", SourceType.USER, pinned=True, group_id="g")
    orphan = call("ask", "c1", "c2").model_copy(update={"group_id": "g"})
    note = turn("note", "user", "context for the query", group_id="g")
    window = pack(
        [query, orphan, result("r1", "c1"), note], TokenBudget(max_tokens=500), COUNTER, FMT
    )
    assert kept(window) == ["q", "note"]
    assert actions(window) == {
        "q": Action.KEPT,
        "ask": Action.DROPPED,
        "r1": Action.DROPPED,
        "note": Action.KEPT,
    }
    assert all("tool_calls" not in m and m["role"] != "tool" for m in window.payload["messages"])


# --------------------------------------------------------------------------- pinned items


@pytest.mark.parametrize(
    "fmt",
    [OpenAIFormatter(), AnthropicFormatter(), GeminiFormatter(), GenericTextFormatter()],
    ids=lambda f: f.name,
)
def test_pinned_items_beyond_the_budget_raise_with_the_numbers(fmt: BaseFormatter) -> None:
    system = doc("sys", "s" * 4_000, SourceType.SYSTEM, pinned=True)
    need, base = fmt.item_cost(system, COUNTER), fmt.base_cost(COUNTER)
    with pytest.raises(BudgetError) as raised:
        pack([system, doc("a")], TokenBudget(max_tokens=1_200, reserve_output=200), COUNTER, fmt)
    message = str(raised.value)
    assert f"pinned items need {need:,} tokens (+{base:,} format overhead)" in message
    assert "budget leaves 1,000 after the 200-token response reserve" in message


def test_pinned_items_beyond_a_strict_cap_raise_with_the_numbers() -> None:
    system = doc("sys", "s" * 400, SourceType.SYSTEM, pinned=True)
    capped = section("instructions", [SourceType.SYSTEM], max=50)
    with pytest.raises(
        BudgetError,
        match=rf"need {cost(system)} tokens in section 'instructions' but its strict cap is 50",
    ):
        pack([system], budget(500, capped, strict=True), COUNTER, FMT)


def test_memory_drops_its_oldest_items_first() -> None:
    """Seed 004: 'Older or less relevant memory items are dropped first'; the memory section
    ranks ties by recency, and each drop says so."""
    from contextfold.formats import OpenAIFormatter

    facts = [f"Fact number {n}: the user prefers option {n} for every trip." for n in range(8)]
    memory = [
        ContextItem(
            id=f"m{n}",
            content=text,
            source=SourceType.MEMORY,
            created_at=datetime(2025, 1, 1, tzinfo=UTC) + timedelta(days=n),
        )
        for n, text in enumerate(facts)  # oldest first, as a store lists them
    ]
    query = ContextItem(content="Book it.", source=SourceType.USER, pinned=True)
    window = pack([*memory, query], fixed5_budget(), COUNTER, OpenAIFormatter())
    kept = [i.id for i in window.items if i.source is SourceType.MEMORY]
    assert kept and len(kept) < len(facts)
    assert kept == [f"m{n}" for n in range(len(facts) - len(kept), len(facts))]  # the newest
    dropped = [d for d in window.decisions if d.action is Action.DROPPED]
    assert {d.item_id for d in dropped} == {f"m{n}" for n in range(len(facts) - len(kept))}
    assert all("older items go first" in d.reason for d in dropped)
