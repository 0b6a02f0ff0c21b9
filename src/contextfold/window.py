"""The packer: a pure function from candidate items, a budget, a token counter and a format to
a packed window in which every candidate has a decision.

How a window is filled:

1. Pinned items (instructions, the current query) are kept whole. If they and the format's
   frame overhead exceed the budget, ``BudgetError`` names the numbers.
2. Sections fill in priority order (higher first). Each may use its reserved ``min`` plus the
   shared pool, up to its ``max``; the reservations of sections still to come are held back. In
   a non-strict budget, tokens left at the end go to sections that still had candidates.
3. Inside a section, atomic units (an item, a ``group_id`` group, or a tool call with its
   results) are taken by priority, then score. Conversation history is taken newest first and
   stops at the first turn that does not fit, so it stays a contiguous suffix. The section's
   overflow strategy decides what happens to the rest (see ``OverflowStrategy``).
4. The kept items are formatted and the payload is counted exactly; the count never exceeds
   the budget (if joining parts ever costs more than the parts, the lowest-ranked unit goes).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict

from contextfold.budget import OverflowStrategy, SectionBudget, TokenBudget
from contextfold.errors import BudgetError
from contextfold.formats.base import Formatter, item_message
from contextfold.items import ContextItem, Message, SourceType, TextBlock
from contextfold.tokens import TokenCounter
from contextfold.truncation import Keep, truncate_text

__all__ = ["Action", "Decision", "SectionUsage", "Window", "pack", "tool_groups"]

#: A truncated item keeps at least this many tokens of content, or it is dropped instead.
MIN_TRUNCATED_TOKENS = 8
_UNASSIGNED = "unassigned"


class Action(StrEnum):
    KEPT = "kept"
    TRUNCATED = "truncated"
    DROPPED = "dropped"
    SUMMARIZED = "summarized"


class Decision(BaseModel):
    """What happened to one candidate, in tokens as the target format counts them."""

    model_config = ConfigDict(frozen=True)
    item_id: str
    section: str
    source: SourceType
    action: Action
    tokens_before: int
    tokens_after: int
    reason: str


class SectionUsage(BaseModel):
    """One row of the budget table."""

    model_config = ConfigDict(frozen=True)
    name: str
    description: str = ""
    reserved: int  # the section's min
    limit: int | None  # the section's max (None: only the total caps it)
    allowance: int  # what the section was allowed this build
    used: int
    candidates: int
    kept: int
    truncated: int
    dropped: int

    @property
    def status(self) -> str:
        """``OVER`` (pinned items beyond the cap), ``TRUNCATED`` (something cut or dropped) or
        ``ok``."""
        if self.limit is not None and self.used > self.limit:
            return "OVER"
        return "TRUNCATED" if self.truncated or self.dropped else "ok"

    @property
    def percent(self) -> float:
        base = self.limit if self.limit else self.allowance
        return 100.0 * self.used / base if base else 0.0


class Window(BaseModel):
    """The packed window: kept items, the formatted payload and every decision."""

    model_config = ConfigDict(frozen=True)
    items: tuple[ContextItem, ...]
    payload: Any
    decisions: tuple[Decision, ...]
    sections: tuple[SectionUsage, ...]
    overflow_items: tuple[ContextItem, ...]
    used_tokens: int  # the payload counted exactly, overhead included
    available: int
    max_tokens: int
    reserve_output: int
    counter: str
    estimated: bool
    format: str


# --------------------------------------------------------------------------- units and groups


@dataclass(slots=True)
class _Unit:
    """Items packed all-or-none, in candidate order."""

    items: list[ContextItem]
    index: int  # position of the first item among the candidates
    cost: int
    conversation: bool
    priority: int = field(init=False)
    score: float = field(init=False)

    def __post_init__(self) -> None:
        self.priority = max(i.priority for i in self.items)
        self.score = max(i.score for i in self.items)


def tool_groups(items: Sequence[ContextItem]) -> list[int]:
    """A group number per item: items sharing a ``group_id``, or a tool call id, share one."""
    parent = list(range(len(items)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    owner: dict[tuple[str, str], int] = {}
    for i, item in enumerate(items):
        keys = [("group", item.group_id)] if item.group_id else []
        if item.message is not None:
            keys += [
                ("tool", t) for t in (*item.message.tool_use_ids, *item.message.tool_result_ids)
            ]
        for key in keys:
            if key in owner:
                parent[find(i)] = find(owner[key])
            else:
                owner[key] = i
    return [find(i) for i in range(len(items))]


def _orphaned(unit: _Unit) -> str | None:
    calls: set[str] = set()
    results: set[str] = set()
    for item in unit.items:
        if item.message is not None:
            calls.update(item.message.tool_use_ids)
            results.update(item.message.tool_result_ids)
    if calls - results:
        return f"tool call {sorted(calls - results)[0]} has no result among the candidates"
    if results - calls:
        return f"tool result for {sorted(results - calls)[0]} has no call among the candidates"
    return None


# --------------------------------------------------------------------------- the fill


@dataclass(slots=True)
class _Fill:
    # (position, item): candidates keep their index; hook summaries get positions after them
    kept: list[tuple[int, ContextItem]] = field(default_factory=list)
    decisions: dict[int, Decision] = field(default_factory=dict)
    used: int = 0


@dataclass(slots=True)
class _Packer:
    counter: TokenCounter
    formatter: Formatter
    index_of: dict[int, int]  # id(item) -> candidate index
    next_position: int  # positions for hook summaries, after every candidate

    def cost(self, item: ContextItem) -> int:
        return self.formatter.item_cost(item, self.counter)

    def fill(self, section: SectionBudget, name: str, units: list[_Unit], allowance: int) -> _Fill:
        out = _Fill()
        strategy = section.overflow
        room = allowance
        history_closed: str | None = None
        misfits: list[_Unit] = []
        truncated_once = False
        for unit in self._order(units, strategy):
            if unit.conversation and history_closed is not None:
                self._drop(out, unit, name, history_closed)
                continue
            if unit.cost <= room:
                room -= unit.cost
                self._keep(out, unit, name)
                continue
            cut = None
            wants_cut = strategy in (OverflowStrategy.TRUNCATE, OverflowStrategy.TRUNCATE_OLDEST)
            if wants_cut and not truncated_once and len(unit.items) == 1:
                keep: Keep = "tail" if strategy is OverflowStrategy.TRUNCATE_OLDEST else "head"
                cut = self._truncate(unit.items[0], room, keep)
            if cut is not None:
                truncated_once = True
                cost = self.cost(cut)
                room -= cost
                original = unit.items[0]
                out.kept.append((unit.index, cut))
                out.decisions[unit.index] = Decision(
                    item_id=original.id,
                    section=name,
                    source=original.source,
                    action=Action.TRUNCATED,
                    tokens_before=unit.cost,
                    tokens_after=cost,
                    reason=f"cut from {unit.cost:,} to {cost:,} tokens to fit section {name!r}",
                )
            else:
                misfits.append(unit)
                self._drop(
                    out,
                    unit,
                    name,
                    (
                        f"needs {unit.cost:,} tokens, {room:,} left in section {name!r}"
                        + (
                            " (oldest outputs go first)"
                            if strategy is OverflowStrategy.TRUNCATE_OLDEST
                            else ""
                        )
                    ),
                )
            if unit.conversation:
                history_closed = (
                    "older than the oldest kept turn; history stays a contiguous suffix"
                )
        if strategy is OverflowStrategy.SUMMARIZE and misfits:
            room = self._summarize(out, section, name, misfits, room)
        out.used = allowance - room
        return out

    def _order(self, units: list[_Unit], strategy: OverflowStrategy) -> Iterator[_Unit]:
        """Ranked units merged with the conversation queue (newest first, order forced)."""
        history = sorted((u for u in units if u.conversation), key=lambda u: -u.index)
        others = [u for u in units if not u.conversation]
        if strategy is OverflowStrategy.TRUNCATE_OLDEST:
            others.sort(
                key=lambda u: (
                    -u.priority,
                    -max(i.created_at.timestamp() for i in u.items),
                    -u.index,
                )
            )
        else:
            others.sort(key=lambda u: (-u.priority, -u.score, u.index))
        h = o = 0
        while h < len(history) or o < len(others):
            take_history = o >= len(others) or (
                h < len(history)
                and (-history[h].priority, -history[h].score)
                <= (-others[o].priority, -others[o].score)
            )
            if take_history:
                yield history[h]
                h += 1
            else:
                yield others[o]
                o += 1

    def _keep(self, out: _Fill, unit: _Unit, name: str) -> None:
        for item in unit.items:
            idx = self.index_of[id(item)]
            cost = self.cost(item)
            out.kept.append((idx, item))
            out.decisions[idx] = Decision(
                item_id=item.id,
                section=name,
                source=item.source,
                action=Action.KEPT,
                tokens_before=cost,
                tokens_after=cost,
                reason="fits",
            )

    def _drop(self, out: _Fill, unit: _Unit, name: str, reason: str) -> None:
        for item in unit.items:
            idx = self.index_of[id(item)]
            out.decisions[idx] = Decision(
                item_id=item.id,
                section=name,
                source=item.source,
                action=Action.DROPPED,
                tokens_before=self.cost(item),
                tokens_after=0,
                reason=reason,
            )

    def _truncate(self, item: ContextItem, room: int, keep: Keep) -> ContextItem | None:
        if item.message is not None and not all(
            isinstance(b, TextBlock) for b in item.message.content
        ):
            return None  # tool traffic is never cut; it stays whole or goes
        frame = self.cost(item) - self.counter.count(item.content)
        target = room - frame
        while target >= MIN_TRUNCATED_TOKENS:
            text = truncate_text(item.content, target, self.counter, keep=keep)
            if not text:
                return None
            update: dict[str, Any] = {"content": text}
            if item.message is not None or item.source is SourceType.CONVERSATION:
                message = item_message(item)
                update["message"] = Message(role=message.role, name=message.name, content=text)
            cut = item.model_copy(update=update)
            if self.cost(cut) <= room:
                return cut
            target -= 1
        return None

    def _summarize(
        self, out: _Fill, section: SectionBudget, name: str, misfits: list[_Unit], room: int
    ) -> int:
        assert section.summarize is not None  # the budget validates this
        originals = [i for u in misfits if not u.conversation for i in u.items]
        if not originals:
            return room
        try:
            summaries = list(section.summarize(originals, room, self.counter))
        except Exception as exc:  # a failing hook leaves the misfits dropped, with the reason
            for item in originals:
                idx = self.index_of[id(item)]
                out.decisions[idx] = out.decisions[idx].model_copy(
                    update={
                        "reason": f"summarize hook failed ({type(exc).__name__}: {exc}); "
                        + out.decisions[idx].reason
                    }
                )
            return room
        kept_any = 0
        for summary in summaries:
            summary = summary.model_copy(update={"section": section.name})
            cost = self.cost(summary)
            if cost <= room:
                room -= cost
                out.kept.append((self.next_position, summary))
                self.next_position += 1
                kept_any += 1
        if kept_any:
            for item in originals:
                idx = self.index_of[id(item)]
                out.decisions[idx] = out.decisions[idx].model_copy(
                    update={
                        "action": Action.SUMMARIZED,
                        "reason": f"summarized into {kept_any} item(s) by the section's hook",
                    }
                )
        return room


# --------------------------------------------------------------------------- pack


def _sections_of(budget: TokenBudget) -> list[SectionBudget]:
    sections = list(budget.sections)
    if not sections:
        sections = [SectionBudget(name="context", sources=tuple(SourceType), priority=5)]
    return sorted(sections, key=lambda s: -s.priority)  # stable: definition order on ties


def _assign(budget: TokenBudget, sections: list[SectionBudget], item: ContextItem) -> str:
    if not budget.sections:
        return sections[0].name
    section = budget.section_for(item)
    return section.name if section is not None else _UNASSIGNED


def pack(
    items: Sequence[ContextItem],
    budget: TokenBudget,
    counter: TokenCounter,
    formatter: Formatter,
) -> Window:
    """Pack ``items`` into ``budget`` for ``formatter``'s format; see the module docstring.

    Raises ``BudgetError`` when the pinned items alone do not fit.
    """
    items = list(items)
    sections = _sections_of(budget)
    by_name = {s.name: s for s in sections}
    unassigned = SectionBudget(
        name=_UNASSIGNED,
        priority=1,
        max=0 if budget.strict else None,
        description="items whose source no section takes",
    )
    packer = _Packer(counter, formatter, {id(item): i for i, item in enumerate(items)}, len(items))
    section_of = [_assign(budget, sections, item) for item in items]

    # Atomic units per section.
    groups = tool_groups(items)
    members: dict[tuple[str, int], list[int]] = {}
    for i, g in enumerate(groups):
        members.setdefault((section_of[i], g), []).append(i)
    units: dict[str, list[_Unit]] = {}
    decisions: dict[int, Decision] = {}
    kept: list[tuple[int, ContextItem]] = []
    pinned_used: dict[str, int] = {}
    for (name, _), idxs in members.items():
        unit_items = [items[i] for i in idxs]
        conversation = any(i.source is SourceType.CONVERSATION for i in unit_items)
        unit = _Unit(unit_items, idxs[0], sum(packer.cost(i) for i in unit_items), conversation)
        if any(i.pinned for i in unit_items):
            pinned_used[name] = pinned_used.get(name, 0) + unit.cost
            for i in idxs:
                cost = packer.cost(items[i])
                kept.append((i, items[i]))
                decisions[i] = Decision(
                    item_id=items[i].id,
                    section=name,
                    source=items[i].source,
                    action=Action.KEPT,
                    tokens_before=cost,
                    tokens_after=cost,
                    reason="pinned",
                )
            continue
        orphan = _orphaned(unit) if conversation else None
        if orphan is not None:
            for i in idxs:
                decisions[i] = Decision(
                    item_id=items[i].id,
                    section=name,
                    source=items[i].source,
                    action=Action.DROPPED,
                    tokens_before=packer.cost(items[i]),
                    tokens_after=0,
                    reason=orphan,
                )
            continue
        units.setdefault(name, []).append(unit)

    base = formatter.base_cost(counter)
    pinned_total = sum(pinned_used.values())
    available = budget.available
    if base + pinned_total > available:
        raise BudgetError(
            f"pinned items need {pinned_total:,} tokens (+{base:,} format overhead) but the "
            f"budget leaves {available:,} after the {budget.reserve_output:,}-token response "
            "reserve; raise max_tokens or shorten the system prompt and query"
        )
    for name, used in pinned_used.items():
        section = by_name.get(name, unassigned)
        if budget.strict and name != _UNASSIGNED and section.max is not None and used > section.max:
            raise BudgetError(
                f"pinned items need {used:,} tokens in section {name!r} but its strict cap is "
                f"{section.max:,}; raise the section's max or shorten the pinned text"
            )

    order = [*sections, unassigned]
    free = available - base - pinned_total
    reserve_left = {s.name: max(0, s.min - pinned_used.get(s.name, 0)) for s in order}
    pool = free - sum(reserve_left.values())  # unreserved tokens (strict budgets)
    fills: dict[str, _Fill] = {}
    allowances: dict[str, int] = {}
    for pos, section in enumerate(order):
        name = section.name
        cap = math.inf if section.max is None else section.max - pinned_used.get(name, 0)
        if budget.strict:
            allowance = int(max(0, min(cap, reserve_left[name] + max(pool, 0))))
        else:
            held = sum(reserve_left[s.name] for s in order[pos + 1 :])
            allowance = int(max(0, min(cap, free - held)))
        fill = packer.fill(section, name, units.get(name, []), allowance)
        fills[name], allowances[name] = fill, allowance
        free -= fill.used
        pool -= max(0, fill.used - reserve_left[name])
    if not budget.strict:  # leftovers go to sections that still had candidates
        for section in order:
            name = section.name
            fill = fills[name]
            if free <= 0 or all(d.action is Action.KEPT for d in fill.decisions.values()):
                continue
            cap = math.inf if section.max is None else section.max - pinned_used.get(name, 0)
            allowance = int(min(cap, fill.used + free))
            if allowance > allowances[name]:
                again = packer.fill(section, name, units.get(name, []), allowance)
                if again.used > fill.used:
                    free -= again.used - fill.used
                    fills[name], allowances[name] = again, allowance

    for fill in fills.values():
        kept.extend(fill.kept)
        decisions.update(fill.decisions)
    kept.sort(key=lambda pair: pair[0])
    payload, used = _measure(kept, formatter, counter)
    while used > available:  # joins cost a token more than their parts: drop the last-ranked
        victim = _last_ranked(kept, decisions, by_name, items)
        if victim is None:
            raise BudgetError(
                f"the payload needs {used:,} tokens but the budget leaves {available:,}; "
                "raise max_tokens"
            )
        idx, item = kept.pop(victim)
        cost = packer.cost(item)
        decisions[idx] = Decision(
            item_id=item.id,
            section=decisions[idx].section if idx in decisions else "",
            source=item.source,
            action=Action.DROPPED,
            tokens_before=cost,
            tokens_after=0,
            reason="dropped after measuring the formatted payload: joining parts cost more "
            "tokens than the parts alone",
        )
        payload, used = _measure(kept, formatter, counter)

    return Window(
        items=tuple(item for _, item in kept),
        payload=payload,
        decisions=tuple(decisions[i] for i in sorted(decisions)),
        sections=tuple(
            _usage(s, allowances[s.name], pinned_used, decisions, units, kept, packer, section_of)
            for s in order
            if s.name != _UNASSIGNED or any(d.section == _UNASSIGNED for d in decisions.values())
        ),
        overflow_items=tuple(
            items[i]
            for i in sorted(decisions)
            if i < len(items)
            and decisions[i].action is not Action.KEPT
            and decisions[i].action is not Action.TRUNCATED
        ),
        used_tokens=used,
        available=available,
        max_tokens=budget.max_tokens,
        reserve_output=budget.reserve_output,
        counter=counter.name,
        estimated=counter.estimated,
        format=formatter.name,
    )


def _measure(
    kept: Iterable[tuple[int, ContextItem]], formatter: Formatter, counter: TokenCounter
) -> tuple[Any, int]:
    payload = formatter.format([item for _, item in kept])
    return payload, formatter.count_payload(payload, counter)


def _last_ranked(
    kept: list[tuple[int, ContextItem]],
    decisions: dict[int, Decision],
    by_name: dict[str, SectionBudget],
    items: list[ContextItem],
) -> int | None:
    """Position in ``kept`` of the lowest-ranked non-pinned, non-tool item (conversation: only
    the oldest kept turn, so history stays contiguous)."""
    oldest_turn = next(
        (p for p, (_, it) in enumerate(kept) if it.source is SourceType.CONVERSATION), None
    )
    best: tuple[tuple[float, ...], int] | None = None
    for pos, (idx, item) in enumerate(kept):
        if item.pinned or (
            item.message is not None and (item.message.tool_use_ids or item.message.tool_result_ids)
        ):
            continue
        if item.source is SourceType.CONVERSATION and pos != oldest_turn:
            continue
        section = by_name.get(decisions[idx].section) if idx in decisions else None
        rank = (section.priority if section else 0, item.priority, item.score, -pos)
        if best is None or rank < best[0]:
            best = (rank, pos)
    return None if best is None else best[1]


def _usage(
    section: SectionBudget,
    allowance: int,
    pinned_used: dict[str, int],
    decisions: dict[int, Decision],
    units: dict[str, list[_Unit]],
    kept: list[tuple[int, ContextItem]],
    packer: _Packer,
    section_of: list[str],
) -> SectionUsage:
    name = section.name
    mine = [d for d in decisions.values() if d.section == name]
    used = sum(
        packer.cost(item)
        for idx, item in kept
        if (section_of[idx] if idx < len(section_of) else item.section) == name
    )
    return SectionUsage(
        name=name,
        description=section.description,
        reserved=section.min,
        limit=section.max,
        allowance=allowance + pinned_used.get(name, 0),
        used=used,
        candidates=len(mine),
        kept=sum(d.action is Action.KEPT for d in mine),
        truncated=sum(d.action is Action.TRUNCATED for d in mine),
        dropped=sum(d.action in (Action.DROPPED, Action.SUMMARIZED) for d in mine),
    )
