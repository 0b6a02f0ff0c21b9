"""Property tests for the packer invariants of DESIGN §5, over every format, the budget presets
and random budgets, and random candidates (see ``strategies.py``).

Each property packs with ``pack_or_budget_error``, which also checks that ``pack`` raises
``BudgetError`` exactly when the pinned items (plus the format's frame) do not fit, or do not
fit a strict section's cap, with the numbers in the message.
"""

from __future__ import annotations

import itertools
import json
import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from contextfold.budget import TokenBudget
from contextfold.errors import BudgetError
from contextfold.formats import BaseFormatter
from contextfold.items import ContextItem, SourceType
from contextfold.tokens import OVERHEADS, CharCounter, TokenCounter
from contextfold.truncation import TRUNCATION_MARKER
from contextfold.window import Action, Window, pack, tool_groups
from strategies import budgets, candidates, char_counters, formatters, texts

ORPHAN_REASONS = ("has no result among the candidates", "has no call among the candidates")


def section_name(budget: TokenBudget, item: ContextItem) -> str:
    if not budget.sections:
        return "context"
    section = budget.section_for(item)
    return "unassigned" if section is None else section.name


def pinned_need(
    items: Sequence[ContextItem], budget: TokenBudget, counter: TokenCounter, fmt: BaseFormatter
) -> dict[str, tuple[int, int]]:
    """Per section, bounds on what the pinned items take: their own cost, and their cost with
    everything grouped with them (a pinned item's group is kept with it)."""
    groups = tool_groups(items)
    sections = [section_name(budget, i) for i in items]
    pinned_groups = {(sections[k], groups[k]) for k, i in enumerate(items) if i.pinned}
    low: Counter[str] = Counter()
    high: Counter[str] = Counter()
    for k, item in enumerate(items):
        cost = fmt.item_cost(item, counter)
        low[sections[k]] += cost if item.pinned else 0
        high[sections[k]] += cost if (sections[k], groups[k]) in pinned_groups else 0
    return {name: (low[name], high[name]) for name in high}


def _numbers(message: str) -> set[int]:
    return {int(n.replace(",", "")) for n in re.findall(r"\d[\d,]*", message)}


def pack_or_budget_error(
    items: Sequence[ContextItem],
    budget: TokenBudget,
    counter: TokenCounter,
    formatter: BaseFormatter,
) -> Window | None:
    """``pack``, checking that it raises ``BudgetError`` exactly when the pinned items (and
    their groups) cannot fit the budget, or a strict section's cap, with the numbers in the
    message; ``None`` then."""
    base, available = formatter.base_cost(counter), budget.available
    need = pinned_need(items, budget, counter, formatter)
    low = sum(lo for lo, _ in need.values())
    high = sum(hi for _, hi in need.values())
    caps = {s.name: s.max for s in budget.sections if budget.strict and s.max is not None}
    over = {n for n, (lo, _) in need.items() if n in caps and lo > caps[n]}
    maybe_over = {n for n, (_, hi) in need.items() if n in caps and hi > caps[n]}
    try:
        window = pack(items, budget, counter, formatter)
    except BudgetError as exc:
        message, numbers = str(exc), _numbers(str(exc))
        if f"{available:,}" in message:  # the pinned items exceed the whole budget
            assert {base, available, budget.reserve_output} <= numbers, message
            assert any(low <= n <= high and n + base > available for n in numbers), message
        else:  # they exceed a strict section's cap
            assert any(
                repr(n) in message and caps[n] in numbers and need[n][0] <= max(numbers)
                for n in maybe_over
            ), f"unexpected BudgetError: {message}"
        return None
    assert base + low <= available, "pinned items exceed the budget but pack passed"
    assert not over, f"pinned items exceed the strict caps of {over} but pack passed"
    return window


# --------------------------------------------------------------------------- payload walkers


def _args_json(args: dict[str, Any]) -> str:
    return json.dumps(args, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def walk_openai(payload: dict[str, Any], counter: TokenCounter) -> int:
    """Tokens of a Chat Completions payload, by the cookbook's rules: 3 per request, 3 per
    message plus every string value (the role included), 1 more per name; a tool call (which
    the cookbook leaves out) as docs/concepts.md says: its id, type, name and arguments, +1."""
    total = 3
    assert set(payload) == {"messages"}
    for message in payload["messages"]:
        assert message["role"] in ("system", "user", "assistant", "tool")
        total += 3
        for key, value in message.items():
            if isinstance(value, str):
                total += counter.count(value) + (1 if key == "name" else 0)
        assert message.get("content") is None or isinstance(message["content"], str)
        for call in message.get("tool_calls", ()):
            assert message["role"] == "assistant" and call["type"] == "function"
            function = call["function"]
            total += counter.count(call["id"]) + counter.count("function") + 1
            total += counter.count(function["name"]) + counter.count(function["arguments"])
    return total


def walk_anthropic(payload: dict[str, Any], counter: TokenCounter) -> int:
    oh = OVERHEADS["anthropic"]

    def blocks(content: list[dict[str, Any]]) -> int:
        total = 0
        for block in content:
            if block["type"] == "text":
                total += counter.count(block["text"]) + oh.per_part
            elif block["type"] == "tool_use":
                total += counter.count(block["name"]) + counter.count(_args_json(block["input"]))
                total += 2 * oh.per_part
            else:
                assert block["type"] == "tool_result"
                total += counter.count(block["content"]) + oh.per_part
        return total

    total = oh.per_request
    if "system" in payload:
        total += oh.per_message + blocks(payload["system"])
    roles = [m["role"] for m in payload["messages"]]
    assert all(a != b for a, b in itertools.pairwise(roles)), "roles must alternate"
    for message in payload["messages"]:
        total += oh.per_message + blocks(message["content"])
    return total


def walk_gemini(payload: dict[str, Any], counter: TokenCounter) -> int:
    oh = OVERHEADS["gemini"]
    turns = list(payload["contents"])
    if "system_instruction" in payload:
        turns.append(payload["system_instruction"])
    total = oh.per_request
    for turn in turns:
        total += oh.per_message
        for part in turn["parts"]:
            if "text" in part:
                total += counter.count(part["text"]) + oh.per_part
            elif "functionCall" in part:
                call = part["functionCall"]
                total += counter.count(call["name"]) + counter.count(_args_json(call["args"]))
                total += 2 * oh.per_part
            else:
                (response,) = part["functionResponse"]["response"].values()  # content or error
                total += counter.count(response) + oh.per_part
    return total


def walk_payload(payload: Any, formatter: BaseFormatter, counter: TokenCounter) -> int:
    if formatter.name == "openai":
        return walk_openai(payload, counter)
    if formatter.name == "anthropic":
        return walk_anthropic(payload, counter)
    if formatter.name == "gemini":
        return walk_gemini(payload, counter)
    assert isinstance(payload, str)
    return counter.count(payload)


def payload_tool_ids(payload: Any, formatter: BaseFormatter) -> tuple[Counter[str], Counter[str]]:
    """(call ids, result ids) as the formatted payload carries them."""
    calls: Counter[str] = Counter()
    results: Counter[str] = Counter()
    if formatter.name == "openai":
        for message in payload["messages"]:
            calls.update(c["id"] for c in message.get("tool_calls", ()))
            if message["role"] == "tool":
                results[message["tool_call_id"]] += 1
    elif formatter.name == "anthropic":
        for message in payload["messages"]:
            for block in message["content"]:
                if block["type"] == "tool_use":
                    assert message["role"] == "assistant"
                    calls[block["id"]] += 1
                elif block["type"] == "tool_result":
                    assert message["role"] == "user"
                    results[block["tool_use_id"]] += 1
    elif formatter.name == "gemini":
        for turn in payload["contents"]:
            for part in turn["parts"]:
                if "functionCall" in part:
                    assert turn["role"] == "model"
                    calls[part["functionCall"]["id"]] += 1
                elif "functionResponse" in part:
                    assert turn["role"] == "user"
                    results[part["functionResponse"]["id"]] += 1
    return calls, results


def item_tool_ids(items: Sequence[ContextItem]) -> tuple[Counter[str], Counter[str]]:
    calls: Counter[str] = Counter()
    results: Counter[str] = Counter()
    for item in items:
        if item.message is not None:
            calls.update(item.message.tool_use_ids)
            results.update(item.message.tool_result_ids)
    return calls, results


# --------------------------------------------------------------------------- the invariants


@given(items=candidates(), budget=budgets(summarize=True), formatter=formatters)
def test_window_never_exceeds_budget(
    items: list[ContextItem], budget: TokenBudget, formatter: BaseFormatter, o200k: TokenCounter
) -> None:
    """§5: the payload, counted exactly for its format with every overhead, fits the budget."""
    window = pack_or_budget_error(items, budget, o200k, formatter)
    if window is None:
        return
    counted = formatter.count_payload(window.payload, o200k)
    assert counted == window.used_tokens
    assert counted <= budget.available == window.available
    # Counted again without trusting the formatter's own counting code.
    assert walk_payload(window.payload, formatter, o200k) == counted
    assert window.format == formatter.name and window.counter == o200k.name


@given(
    items=candidates(max_free=3, max_turns=8),
    budget=budgets(),
    formatter=formatters,
    counter=char_counters,
)
def test_tool_calls_and_results_travel_together(
    items: list[ContextItem], budget: TokenBudget, formatter: BaseFormatter, counter: TokenCounter
) -> None:
    """§5: no tool call without its result and no result without its call, in every format."""
    window = pack_or_budget_error(items, budget, counter, formatter)
    if window is None:
        return
    calls, results = item_tool_ids(window.items)
    assert calls == results
    assert all(n == 1 for n in calls.values())
    if formatter.name != "text":
        assert payload_tool_ids(window.payload, formatter) == (calls, results)
    else:  # the text format shows each result by its call id, and only kept ones
        shown = Counter(re.findall(r"\[tool result (call_\d+)\]", window.payload))
        assert set(shown) == set(results)


@given(
    items=candidates(), budget=budgets(summarize=True), formatter=formatters, counter=char_counters
)
def test_every_candidate_has_one_explained_decision(
    items: list[ContextItem], budget: TokenBudget, formatter: BaseFormatter, counter: TokenCounter
) -> None:
    """§5: nothing is lost silently — one decision per candidate, in order, with a reason."""
    window = pack_or_budget_error(items, budget, counter, formatter)
    if window is None:
        return
    assert [d.item_id for d in window.decisions] == [i.id for i in items]
    by_id = {i.id: i for i in items}
    in_window = [i.id for i in window.items]
    assert len(set(in_window)) == len(in_window)
    present = {d.item_id for d in window.decisions if d.action in (Action.KEPT, Action.TRUNCATED)}
    summaries = [i for i in window.items if i.id not in by_id]
    assert set(in_window) - {s.id for s in summaries} == present
    if summaries:
        assert any(d.action is Action.SUMMARIZED for d in window.decisions)
    kept_items = {i.id: i for i in window.items}
    tables = {s.name for s in window.sections}
    for decision, item in zip(window.decisions, items, strict=True):
        assert decision.source is item.source and decision.section in tables
        assert decision.tokens_before == formatter.item_cost(item, counter)
        if decision.action is Action.KEPT:
            assert kept_items[item.id] == item and decision.tokens_after == decision.tokens_before
            continue
        assert decision.reason.strip()
        if decision.action is Action.TRUNCATED:
            cut = kept_items[item.id]
            assert TRUNCATION_MARKER in cut.content and cut.content != item.content
            assert decision.tokens_after == formatter.item_cost(cut, counter)
            assert 0 < decision.tokens_after < decision.tokens_before
        else:
            assert decision.tokens_after == 0
    lost = [i for i, d in zip(items, window.decisions, strict=True) if d.action not in _PRESENT]
    assert list(window.overflow_items) == lost


_PRESENT = (Action.KEPT, Action.TRUNCATED)


@given(
    items=candidates(max_free=3, max_turns=10),
    budget=budgets(),
    formatter=formatters,
    counter=char_counters,
)
def test_history_stays_a_contiguous_suffix(
    items: list[ContextItem], budget: TokenBudget, formatter: BaseFormatter, counter: TokenCounter
) -> None:
    """§5: kept conversation turns are the newest ones, except orphaned tool traffic, which is
    dropped with a reason that says so."""
    window = pack_or_budget_error(items, budget, counter, formatter)
    if window is None:
        return
    decisions = dict(zip((i.id for i in items), window.decisions, strict=True))
    turns = [  # turns kept by a pin (grouped with a pinned item) are outside the history cut
        i
        for i in items
        if i.source is SourceType.CONVERSATION
        and decisions[i.id].reason != "pinned"
        and not any(r in decisions[i.id].reason for r in ORPHAN_REASONS)
    ]
    kept = [decisions[i.id].action in _PRESENT for i in turns]
    first = kept.index(True) if True in kept else len(kept)
    explain = [(i.id, decisions[i.id].action, decisions[i.id].reason) for i in turns]
    assert all(kept[first:]), explain
    # An orphan decision goes only to tool traffic and what is grouped with it.
    groups = tool_groups(items)
    with_tools = {g for g, i in zip(groups, items, strict=True) if any(item_tool_ids([i]))}
    for group, item in zip(groups, items, strict=True):
        if any(r in decisions[item.id].reason for r in ORPHAN_REASONS):
            assert group in with_tools and decisions[item.id].action is Action.DROPPED


@given(
    items=candidates(pinned_texts=texts),
    budget=budgets(),
    formatter=formatters,
    counter=char_counters,
)
def test_pinned_items_are_never_dropped_or_altered(
    items: list[ContextItem], budget: TokenBudget, formatter: BaseFormatter, counter: TokenCounter
) -> None:
    """§5: pinned items are kept verbatim; when they cannot fit, ``BudgetError`` names the
    numbers (checked inside ``pack_or_budget_error``)."""
    window = pack_or_budget_error(items, budget, counter, formatter)
    if window is None:
        return
    kept = {i.id: i for i in window.items}
    for item, decision in zip(items, window.decisions, strict=True):
        if item.pinned:
            assert kept[item.id] == item and kept[item.id].content == item.content
            assert decision.action is Action.KEPT and decision.reason == "pinned"


@given(items=candidates(), budget=budgets(), formatter=formatters, counter=char_counters)
def test_sections_respect_caps_and_strict_reservations(
    items: list[ContextItem], budget: TokenBudget, formatter: BaseFormatter, counter: TokenCounter
) -> None:
    """§6: no section goes past its max unless its pinned items alone do (strict budgets refuse
    that for declared sections); a strict budget never lends a section's reservation: a section
    goes beyond ``max(min, pinned)`` only from the unreserved pool."""
    window = pack_or_budget_error(items, budget, counter, formatter)
    if window is None:
        return
    used: Counter[str] = Counter()
    pinned: Counter[str] = Counter()
    for decision in window.decisions:
        if decision.action in _PRESENT:
            used[decision.section] += decision.tokens_after
            pin = decision.reason == "pinned"  # a pinned item, or one grouped with it
            pinned[decision.section] += decision.tokens_after if pin else 0
    for item in window.items:
        if item.id.startswith("summary-of-"):
            assert item.section is not None
            used[item.section] += formatter.item_cost(item, counter)
    table = {s.name: s for s in window.sections}
    for name, usage in table.items():
        assert usage.used == used[name]
        if usage.limit is not None and pinned[name] <= usage.limit:
            assert usage.used <= usage.limit, (name, usage)
    if budget.strict:
        assert all(s.name in table for s in budget.sections)
        assert used["unassigned"] == pinned["unassigned"]  # strict: nothing unclaimed but pins
        floors = {s.name: max(s.min, pinned[s.name]) for s in budget.sections}
        borrowed = sum(max(0, used[name] - floor) for name, floor in floors.items())
        pool = budget.available - formatter.base_cost(counter) - sum(floors.values())
        assert borrowed <= max(0, pool - pinned["unassigned"])


@given(
    items=candidates(), budget=budgets(summarize=True), formatter=formatters, counter=char_counters
)
def test_packing_is_deterministic_and_pure(
    items: list[ContextItem], budget: TokenBudget, formatter: BaseFormatter, counter: TokenCounter
) -> None:
    """The packer is a pure function: same inputs, same window; inputs untouched."""
    before = [i.model_dump() for i in items]
    fresh = [ContextItem.model_validate(d) for d in before]  # no cached token counts
    first = pack_or_budget_error(items, budget, counter, formatter)
    second = pack_or_budget_error(items, budget, counter, formatter)
    third = pack_or_budget_error(fresh, budget, counter, formatter)
    assert [i.model_dump() for i in items] == before
    if first is None:
        assert second is None and third is None
        return
    assert second is not None and third is not None
    for other in (second, third):
        assert json.dumps(other.payload) == json.dumps(first.payload)
        assert other.decisions == first.decisions
        assert other.sections == first.sections
        assert [i.model_dump() for i in other.items] == [i.model_dump() for i in first.items]


@given(items=candidates(), formatter=formatters, use_o200k=st.booleans())
def test_formatter_cost_model_bounds_the_payload(
    items: list[ContextItem], formatter: BaseFormatter, use_o200k: bool, o200k: TokenCounter
) -> None:
    """The cost model the packer trusts (``Formatter``'s contract): the base cost plus the item
    costs bound what the formatted payload counts."""
    counter = o200k if use_o200k else CharCounter()
    bound = formatter.base_cost(counter) + sum(formatter.item_cost(i, counter) for i in items)
    assert formatter.count_payload(formatter.format(items), counter) <= bound
