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

Each item's cost is computed once per pack (and cached on the item across packs); decisions
are kept as compact records and become ``Decision`` models when first read.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property
from operator import attrgetter
from typing import Any

from pydantic import BaseModel, ConfigDict, PrivateAttr, computed_field

from contextfold.budget import OverflowStrategy, SectionBudget, TokenBudget
from contextfold.errors import BudgetError
from contextfold.formats.base import Formatter, item_message
from contextfold.items import ContextItem, Message, SourceType, TextBlock
from contextfold.tokens import TokenCounter
from contextfold.truncation import Keep, truncate_text

__all__ = ["Action", "Decision", "SectionUsage", "Window", "pack", "tool_groups"]

#: A truncated item keeps at least this many tokens of content, or it is dropped instead.
MIN_TRUNCATED_TOKENS = 8
UNASSIGNED = "unassigned"
_HISTORY_CLOSED = "older than the oldest kept turn; history stays a contiguous suffix"


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
    allowance: int  # what the section was allowed this build, pinned items included
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


# A decision before it becomes a ``Decision`` model: (candidate index, section, action,
# tokens before, tokens after, reason). Plain tuples and plain-str actions keep the hot loop
# cheap (Enum members hash in Python code); ``Window.decisions`` builds the models on first read.
_Record = tuple[int, str, str, int, int, str]
_KEPT, _TRUNCATED, _DROPPED, _SUMMARIZED = "kept", "truncated", "dropped", "summarized"


class Window(BaseModel):
    """The packed window: kept items, the formatted payload and every decision."""

    model_config = ConfigDict(frozen=True)
    items: tuple[ContextItem, ...]
    payload: Any
    sections: tuple[SectionUsage, ...]
    overflow_items: tuple[ContextItem, ...]
    used_tokens: int  # the payload counted exactly, overhead included
    available: int
    max_tokens: int
    reserve_output: int
    counter: str
    estimated: bool
    format: str
    _candidates: Sequence[ContextItem] = PrivateAttr(default=())
    _records: Sequence[_Record] = PrivateAttr(default=())

    @computed_field  # type: ignore[prop-decorator]
    @cached_property
    def decisions(self) -> tuple[Decision, ...]:
        """One decision per candidate, in candidate order."""
        items = self._candidates
        return tuple(
            Decision(
                item_id=items[index].id,
                section=section,
                source=items[index].source,
                action=Action(action),
                tokens_before=before,
                tokens_after=after,
                reason=reason,
            )
            for index, section, action, before, after, reason in self._records
        )


# --------------------------------------------------------------------------- units and groups


@dataclass(slots=True)
class _Unit:
    """Candidate indices packed all-or-none, in candidate order."""

    idxs: list[int]
    cost: int
    conversation: bool
    priority: int
    score: float


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
        message = item.message
        if item.group_id is None and (
            message is None or (len(message.content) == 1 and message.content[0].type == "text")
        ):
            continue
        keys = [("group", item.group_id)] if item.group_id else []
        if message is not None:
            keys += [("tool", t) for t in (*message.tool_use_ids, *message.tool_result_ids)]
        for key in keys:
            if key in owner:
                parent[find(i)] = find(owner[key])
            else:
                owner[key] = i
    return [i if parent[i] == i else find(i) for i in range(len(items))]


def _has_tool_blocks(items: Sequence[ContextItem], idxs: list[int]) -> bool:
    for i in idxs:
        message = items[i].message
        if message is not None and (len(message.content) > 1 or message.content[0].type != "text"):
            return True
    return False


def _orphan_reason(items: Sequence[ContextItem], idxs: list[int]) -> str | None:
    """Why a conversation unit carries a tool call without its result (or the reverse)."""
    calls: set[str] = set()
    results: set[str] = set()
    for i in idxs:
        message = items[i].message
        if message is not None:
            calls.update(message.tool_use_ids)
            results.update(message.tool_result_ids)
    if calls - results:
        return f"tool call {sorted(calls - results)[0]} has no result among the candidates"
    if results - calls:
        return f"tool result for {sorted(results - calls)[0]} has no call among the candidates"
    return None


def _lonely_tool_traffic(items: Sequence[ContextItem], idxs: list[int]) -> set[int]:
    """Unpinned members of a pinned unit whose tool calls or results lack their partner; going
    without one can orphan its partners, so repeat until nothing changes."""
    lonely: set[int] = set()
    while True:
        calls: set[str] = set()
        results: set[str] = set()
        for j in idxs:
            message = items[j].message
            if j not in lonely and message is not None:
                calls.update(message.tool_use_ids)
                results.update(message.tool_result_ids)
        unmatched = calls ^ results
        more = set()
        for j in idxs:
            message = items[j].message
            if j in lonely or items[j].pinned or message is None:
                continue
            if unmatched & {*message.tool_use_ids, *message.tool_result_ids}:
                more.add(j)
        if not more:
            return lonely
        lonely |= more


# --------------------------------------------------------------------------- the fill


@dataclass(slots=True)
class _Fill:
    kept: list[tuple[int, ContextItem]] = field(default_factory=list)  # (position, item)
    records: list[_Record] = field(default_factory=list)
    used: int = 0


@dataclass(slots=True)
class _Packer:
    items: Sequence[ContextItem]
    costs: list[int]
    counter: TokenCounter
    formatter: Formatter
    next_position: int  # positions for hook summaries, after every candidate

    def fill(self, section: SectionBudget, name: str, units: list[_Unit], allowance: int) -> _Fill:
        out = _Fill()
        strategy = section.overflow
        cuts = strategy in (OverflowStrategy.TRUNCATE, OverflowStrategy.TRUNCATE_OLDEST)
        keep: Keep = "tail" if strategy is OverflowStrategy.TRUNCATE_OLDEST else "head"
        suffix = (
            " (oldest outputs go first)" if strategy is OverflowStrategy.TRUNCATE_OLDEST else ""
        )
        room = allowance
        history_open = True
        misfits: list[int] = []
        items, costs, records, kept = self.items, self.costs, out.records, out.kept
        for unit in self._order(units, strategy):
            if unit.conversation and not history_open:
                for i in unit.idxs:
                    records.append((i, name, _DROPPED, costs[i], 0, _HISTORY_CLOSED))
                continue
            if unit.cost <= room:
                room -= unit.cost
                for i in unit.idxs:
                    kept.append((i, items[i]))
                    records.append((i, name, _KEPT, costs[i], costs[i], "fits"))
                continue
            cut = None
            if cuts and len(unit.idxs) == 1:
                cut = self._truncate(items[unit.idxs[0]], room, keep)
                cuts = cut is None  # one cut per section: after it the section is full
            if cut is not None:
                i, cost = unit.idxs[0], self.formatter.item_cost(cut, self.counter)
                room -= cost
                kept.append((i, cut))
                records.append(
                    (
                        i,
                        name,
                        _TRUNCATED,
                        unit.cost,
                        cost,
                        f"cut from {unit.cost:,} to {cost:,} tokens to fit section {name!r}",
                    )
                )
            else:
                reason = f"needs {unit.cost:,} tokens, {room:,} left in section {name!r}{suffix}"
                misfits.extend(unit.idxs)
                for i in unit.idxs:
                    records.append((i, name, _DROPPED, costs[i], 0, reason))
            history_open = history_open and not unit.conversation
        if strategy is OverflowStrategy.SUMMARIZE and misfits:
            room = self._summarize(out, section, name, misfits, room)
        out.used = allowance - room
        return out

    def _order(self, units: list[_Unit], strategy: OverflowStrategy) -> Iterator[_Unit]:
        """Ranked units merged with the conversation queue (newest first, order forced)."""
        history = [u for u in units if u.conversation]
        history.reverse()
        others = [u for u in units if not u.conversation]
        if strategy is OverflowStrategy.TRUNCATE_OLDEST:
            items = self.items

            def newest(u: _Unit) -> float:
                return max(items[i].created_at.timestamp() for i in u.idxs)

            others.sort(key=lambda u: (-u.priority, -newest(u), -u.idxs[0]))
        else:
            # Two stable passes with C-level keys: priority, then score, then candidate order.
            others.sort(key=attrgetter("score"), reverse=True)
            others.sort(key=attrgetter("priority"), reverse=True)
        if not history:
            yield from others
            return
        h = o = 0
        while h < len(history) or o < len(others):
            if o >= len(others) or (
                h < len(history)
                and (history[h].priority, history[h].score) >= (others[o].priority, others[o].score)
            ):
                yield history[h]
                h += 1
            else:
                yield others[o]
                o += 1

    def _truncate(self, item: ContextItem, room: int, keep: Keep) -> ContextItem | None:
        if item.message is not None and not all(
            isinstance(b, TextBlock) for b in item.message.content
        ):
            return None  # tool traffic is never cut; it stays whole or goes
        frame = self.formatter.item_cost(item, self.counter) - self.counter.count(item.content)
        target = room - frame
        while target >= MIN_TRUNCATED_TOKENS:
            text = truncate_text(item.content, target, self.counter, keep=keep)
            if not text:
                return None
            update: dict[str, Any] = {"content": text}
            if item.source is SourceType.CONVERSATION:
                message = item_message(item)
                update["message"] = Message(role=message.role, name=message.name, content=text)
            cut = item.model_copy(update=update)
            if self.formatter.item_cost(cut, self.counter) <= room:
                return cut
            target -= 1
        return None

    def _summarize(
        self, out: _Fill, section: SectionBudget, name: str, misfits: list[int], room: int
    ) -> int:
        assert section.summarize is not None  # the budget validates this
        originals = [i for i in misfits if self.items[i].source is not SourceType.CONVERSATION]
        if not originals:
            return room
        wanted = set(originals)
        try:
            summaries = list(
                section.summarize([self.items[i] for i in originals], room, self.counter)
            )
        except Exception as exc:  # a failing hook leaves the misfits dropped, with the reason
            note = f"summarize hook failed ({type(exc).__name__}: {exc}); "
            out.records[:] = [
                (r[0], r[1], r[2], r[3], r[4], note + r[5]) if r[0] in wanted else r
                for r in out.records
            ]
            return room
        kept_any = 0
        for summary in summaries:
            summary = summary.model_copy(update={"section": section.name})
            cost = self.formatter.item_cost(summary, self.counter)
            if cost <= room:
                room -= cost
                out.kept.append((self.next_position, summary))
                self.next_position += 1
                kept_any += 1
        if kept_any:
            reason = f"summarized into {kept_any} item(s) by the section's hook"
            out.records[:] = [
                (r[0], r[1], _SUMMARIZED, r[3], r[4], reason) if r[0] in wanted else r
                for r in out.records
            ]
        return room


# --------------------------------------------------------------------------- pack


def _section_names(budget: TokenBudget, items: Sequence[ContextItem]) -> list[str]:
    if not budget.sections:
        return ["context"] * len(items)
    explicit = {s.name for s in budget.sections}
    # Enum members hash in Python code; their identities are unique and hash in C.
    by_source = {id(source): s.name for s in budget.sections for source in s.sources}
    return [
        item.section
        if item.section is not None and item.section in explicit
        else by_source.get(id(item.source), UNASSIGNED)
        for item in items
    ]


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
    sections = sorted(  # stable: definition order on ties
        budget.sections or (SectionBudget(name="context", sources=tuple(SourceType)),),
        key=lambda s: -s.priority,
    )
    unassigned = SectionBudget(
        name=UNASSIGNED,
        priority=1,
        max=0 if budget.strict else None,
        description="items whose source no section takes",
    )
    order = [*sections, unassigned]
    by_name = {s.name: s for s in order}
    costs = formatter.item_costs(items, counter)
    packer = _Packer(items, costs, counter, formatter, len(items))
    section_of = _section_names(budget, items)

    # Atomic units per section, in candidate order; pinned units are kept outright, orphaned
    # tool traffic is dropped. Most items are units of one: they take the fast path.
    groups = tool_groups(items)
    roots = {g for i, g in enumerate(groups) if g != i}
    members: dict[tuple[str, int], list[int]] = {}
    for i, g in enumerate(groups):
        if g != i or i in roots:
            members.setdefault((section_of[i], g), []).append(i)
    units: dict[str, list[_Unit]] = {}
    records: list[_Record] = []
    kept: list[tuple[int, ContextItem]] = []
    pinned_used: dict[str, int] = {}
    conversation = SourceType.CONVERSATION
    for i, item in enumerate(items):
        name = section_of[i]
        if groups[i] != i or i in roots:
            idxs = members[(name, groups[i])]
            if idxs[0] != i:
                continue  # a later member of a group already handled at its first member
            unit = _Unit(
                idxs,
                sum(costs[j] for j in idxs),
                any(items[j].source is conversation for j in idxs),
                max(items[j].priority for j in idxs),
                max(items[j].score for j in idxs),
            )
            pinned = any(items[j].pinned for j in idxs)
        else:
            idxs = [i]
            unit = _Unit(idxs, costs[i], item.source is conversation, item.priority, item.score)
            pinned = item.pinned
        if pinned:
            if unit.conversation and _has_tool_blocks(items, idxs):
                lonely = _lonely_tool_traffic(items, idxs)
                if lonely:  # a pinned group never carries orphaned tool traffic in
                    orphan = _orphan_reason(items, idxs) or "tool traffic without its partner"
                    records.extend((j, name, _DROPPED, costs[j], 0, orphan) for j in lonely)
                    idxs = [j for j in idxs if j not in lonely]
            pinned_used[name] = pinned_used.get(name, 0) + sum(costs[j] for j in idxs)
            for j in idxs:
                kept.append((j, items[j]))
                records.append((j, name, _KEPT, costs[j], costs[j], "pinned"))
            continue
        if unit.conversation and _has_tool_blocks(items, idxs):
            reason = _orphan_reason(items, idxs)
            if reason is not None:
                records.extend((j, name, _DROPPED, costs[j], 0, reason) for j in idxs)
                continue
        units.setdefault(name, []).append(unit)
    for name, section_units in units.items():
        units[name] = _contiguous(section_units, items)

    base = formatter.base_cost(counter)
    pinned_total = sum(pinned_used.values())
    available = budget.available
    if base + pinned_total > available:
        raise BudgetError(
            f"pinned items need {pinned_total:,} tokens (+{base:,} format overhead) but the "
            f"budget leaves {available:,} after the {budget.reserve_output:,}-token response "
            "reserve; raise max_tokens or shorten the system prompt and query"
        )
    if budget.strict:
        for name, used in pinned_used.items():
            cap = by_name[name].max
            if name != UNASSIGNED and cap is not None and used > cap:
                raise BudgetError(
                    f"pinned items need {used:,} tokens in section {name!r} but its strict cap "
                    f"is {cap:,}; raise the section's max or shorten the pinned text"
                )

    fills, allowances = _allocate(
        budget, order, units, pinned_used, packer, available - base - pinned_total
    )
    for fill in fills.values():
        kept.extend(fill.kept)
        records.extend(fill.records)
    kept.sort(key=lambda pair: pair[0])
    records.sort(key=lambda r: r[0])
    payload = formatter.format([item for _, item in kept])
    used = formatter.count_payload(payload, counter)
    while used > available:  # joins cost a token more than their parts: drop the last-ranked
        victim = _last_ranked(kept, section_of, by_name)
        if victim is None:
            raise BudgetError(
                f"the payload needs {used:,} tokens but the budget leaves {available:,}; "
                "raise max_tokens"
            )
        idx, _ = kept.pop(victim)
        pos = next(p for p, r in enumerate(records) if r[0] == idx)
        index, section, _, before, _, _ = records[pos]
        records[pos] = (
            index,
            section,
            _DROPPED,
            before,
            0,
            "dropped after measuring the formatted payload: joining parts cost more tokens "
            "than the parts alone",
        )
        payload = formatter.format([item for _, item in kept])
        used = formatter.count_payload(payload, counter)

    # Built from values the packer made itself: skip re-validating every kept item.
    window = Window.model_construct(
        items=tuple(item for _, item in kept),
        payload=payload,
        sections=_usages(order, allowances, pinned_used, records, fills),
        overflow_items=tuple(
            items[r[0]] for r in records if r[2] == _DROPPED or r[2] == _SUMMARIZED
        ),
        used_tokens=used,
        available=available,
        max_tokens=budget.max_tokens,
        reserve_output=budget.reserve_output,
        counter=counter.name,
        estimated=counter.estimated,
        format=formatter.name,
    )
    window._candidates = items
    window._records = records
    return window


def _contiguous(units: list[_Unit], items: Sequence[ContextItem]) -> list[_Unit]:
    """Merge conversation units whose turns interleave (a tool call, another turn, then the
    result; a ``group_id`` spanning turns) into one unit. History is taken newest first, whole
    units at a time; a unit that spans another unit's turns would otherwise leave a gap, and
    the kept history would not be a suffix."""
    if all(len(u.idxs) == 1 for u in units if u.conversation):
        return units
    conversation = SourceType.CONVERSATION
    spans = sorted(
        (
            min(i for i in u.idxs if items[i].source is conversation),
            max(i for i in u.idxs if items[i].source is conversation),
            u,
        )
        for u in units
        if u.conversation
    )
    merged: list[tuple[int, _Unit]] = []  # (last turn index, unit)
    for lo, hi, unit in spans:
        if merged and lo < merged[-1][0]:
            last, prev = merged[-1]
            merged[-1] = (
                max(last, hi),
                _Unit(
                    sorted(prev.idxs + unit.idxs),
                    prev.cost + unit.cost,
                    True,
                    max(prev.priority, unit.priority),
                    max(prev.score, unit.score),
                ),
            )
        else:
            merged.append((hi, unit))
    return [u for u in units if not u.conversation] + [u for _, u in merged]


def _allocate(
    budget: TokenBudget,
    order: list[SectionBudget],
    units: dict[str, list[_Unit]],
    pinned_used: dict[str, int],
    packer: _Packer,
    free: int,
) -> tuple[dict[str, _Fill], dict[str, int]]:
    """Fill each section in priority order; a second pass hands leftovers (non-strict)."""
    reserve_left = {s.name: max(0, s.min - pinned_used.get(s.name, 0)) for s in order}
    pool = free - sum(reserve_left.values())  # unreserved tokens (strict budgets)
    fills: dict[str, _Fill] = {}
    allowances: dict[str, int] = {}

    def cap_of(section: SectionBudget) -> float:
        return math.inf if section.max is None else section.max - pinned_used.get(section.name, 0)

    for pos, section in enumerate(order):
        name = section.name
        if budget.strict:
            # ``free`` bounds it too: reservations may exceed what the frame and the pinned
            # items leave (fixed5 reserves the whole window), and then the pool is negative.
            allowance = int(max(0, min(cap_of(section), reserve_left[name] + max(pool, 0), free)))
        else:
            held = sum(reserve_left[s.name] for s in order[pos + 1 :])
            allowance = int(max(0, min(cap_of(section), free - held)))
        fill = packer.fill(section, name, units.get(name, []), allowance)
        fills[name], allowances[name] = fill, allowance
        free -= fill.used
        pool -= max(0, fill.used - reserve_left[name])
    if not budget.strict:  # leftovers go to sections that still had candidates
        for section in order:
            name = section.name
            fill = fills[name]
            smallest = min((r[3] for r in fill.records if r[2] != _KEPT), default=None)
            if smallest is None or free < min(smallest, MIN_TRUNCATED_TOKENS * 4):
                continue  # nothing that was left out could use the leftover
            allowance = int(min(cap_of(section), fill.used + free))
            if allowance > allowances[name]:
                again = packer.fill(section, name, units.get(name, []), allowance)
                if again.used > fill.used:
                    free -= again.used - fill.used
                    fills[name], allowances[name] = again, allowance
    return fills, allowances


def _last_ranked(
    kept: list[tuple[int, ContextItem]], section_of: list[str], by_name: dict[str, SectionBudget]
) -> int | None:
    """Position in ``kept`` of the lowest-ranked item that may go: not pinned, not tool traffic,
    and for conversation only the oldest kept turn (history stays contiguous)."""
    oldest_turn = next(
        (p for p, (_, it) in enumerate(kept) if it.source is SourceType.CONVERSATION), None
    )
    best: tuple[tuple[float, ...], int] | None = None
    for pos, (idx, item) in enumerate(kept):
        message = item.message
        if (
            item.pinned
            or idx >= len(section_of)
            or (message is not None and (message.tool_use_ids or message.tool_result_ids))
        ):
            continue
        if item.source is SourceType.CONVERSATION and pos != oldest_turn:
            continue
        section = by_name.get(section_of[idx])
        rank = (section.priority if section else 0, item.priority, item.score, -pos)
        if best is None or rank < best[0]:
            best = (rank, pos)
    return None if best is None else best[1]


def _usages(
    order: list[SectionBudget],
    allowances: dict[str, int],
    pinned_used: dict[str, int],
    records: list[_Record],
    fills: dict[str, _Fill],
) -> tuple[SectionUsage, ...]:
    actions = (_KEPT, _TRUNCATED, _DROPPED, _SUMMARIZED)
    counts = {s.name: dict.fromkeys(actions, 0) for s in order}
    used = dict.fromkeys(counts, 0)
    for r in records:
        counts[r[1]][r[2]] += 1
        used[r[1]] += r[4]
    for name, fill in fills.items():  # summaries from a summarize hook have no record
        used[name] += fill.used - sum(r[4] for r in fill.records)
    rows = []
    for s in order:
        c = counts[s.name]
        if s.name == UNASSIGNED and not any(c.values()):
            continue
        rows.append(
            SectionUsage(
                name=s.name,
                description=s.description,
                reserved=s.min,
                limit=s.max,
                allowance=allowances[s.name] + pinned_used.get(s.name, 0),
                used=used[s.name],
                candidates=sum(c.values()),
                kept=c[_KEPT],
                truncated=c[_TRUNCATED],
                dropped=c[_DROPPED] + c[_SUMMARIZED],
            )
        )
    return tuple(rows)
