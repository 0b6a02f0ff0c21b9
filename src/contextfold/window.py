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
   stops at the first turn that does not fit, so it stays a contiguous suffix; it keeps whole
   exchanges, so replies older than the oldest kept user turn go too (a tail that holds no
   user turn at all, tool rounds after an old task, stays). The section's overflow strategy
   decides what happens to the rest (see ``OverflowStrategy``).
4. The kept items are formatted and the payload is counted exactly; the count never exceeds
   the budget (if joining parts ever costs more than the parts, the lowest-ranked unit goes).

How it stays fast (10,000 candidates in about 15 ms, most of it spent reading the items and
formatting the payload): each item's cost is computed once per pack (and cached on the item
across packs); the fields the packer ranks by are read once into plain lists with C-level
getters (``contextfold._units``, which also builds the units); a unit is named by its first
candidate index, so the common unit of one item needs no object of its own; ranking is two
stable sorts with C-level keys; once nothing left in a section can fit, the rest are dropped
in bulk; and each candidate's decision is one compact status in a list (``Status``) that
becomes a ``Decision`` model, reason text included, when first read.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property
from itertools import compress, repeat
from operator import attrgetter, itemgetter, methodcaller, neg
from typing import Any, cast

from pydantic import BaseModel, ConfigDict, PrivateAttr, computed_field

from contextfold._units import (
    CLOSED,
    DROPPED,
    FIELDS,
    FITS,
    KEPT,
    OPENED_LATE,
    SUMMARIZED,
    TRUNCATED,
    UNASSIGNED,
    SectionMap,
    Status,
    Units,
    build_units,
    tool_groups,
)
from contextfold.budget import OverflowStrategy, SectionBudget, TokenBudget
from contextfold.errors import BudgetError
from contextfold.formats.base import Formatter, item_message
from contextfold.items import (
    ContextItem,
    Message,
    SourceType,
    TextBlock,
)
from contextfold.tokens import TokenCounter
from contextfold.truncation import Keep, truncate_text

__all__ = [
    "Action",
    "Decision",
    "SectionUsage",
    "Window",
    "item_label",
    "pack",
    "tool_groups",
]

#: A truncated item keeps at least this many tokens of content, or it is dropped instead.
MIN_TRUNCATED_TOKENS = 8


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
    label: str = ""  # what a person calls the item (``item_label``); the packer always sets it


def item_label(item: ContextItem, turn: int | None = None) -> str:
    """What a person calls ``item`` in an explanation, instead of its id (often a hash).

    ``metadata["label"]`` when set; a document chunk (``chunk_index`` in its metadata) is its
    ``title``, ``source`` or ``doc_id`` and its position (``lodging.md chunk 3``); a
    conversation item is its role and ``turn``, its 1-based place among the conversation
    candidates (``assistant turn 4``); anything else is its id.

    >>> item_label(ContextItem(content="x", metadata={"source": "faq.md", "chunk_index": 0}))
    'faq.md chunk 1'
    """
    meta = item.metadata
    label = meta.get("label")
    if isinstance(label, str) and label.strip():
        return label
    chunk = meta.get("chunk_index")
    name = meta.get("title") or meta.get("source") or meta.get("doc_id")
    if isinstance(chunk, int) and name:
        return f"{name} chunk {chunk + 1}"
    if item.source is SourceType.CONVERSATION and turn is not None:
        role = item.message.role if item.message is not None else meta.get("role", "user")
        return f"{role} turn {turn}"
    return item.id


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


_ACTIONS = {action.value: action for action in Action}
_CREATED, _TIMESTAMP = attrgetter("created_at"), methodcaller("timestamp")


def _needs(cost: int, room: int, name: str, suffix: str) -> str:
    return f"needs {cost:,} tokens, {room:,} left in section {name!r}{suffix}"


def _spell(status: Status, cost: int, name: str, suffix: str) -> tuple[str, int, str]:
    """A status as (action, tokens after, reason); ``cost`` is the candidate's."""
    if isinstance(status, str):
        return KEPT, cost, status
    if isinstance(status, int):
        return DROPPED, 0, _needs(cost, status, name, suffix)
    return status


def _suffix(section: SectionBudget) -> str:
    if section.overflow is OverflowStrategy.TRUNCATE_OLDEST:
        return " (oldest outputs go first)"
    if section.recency:
        return " (ranked by priority, score, then recency: older items go first)"
    return ""


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
    #: The encoding the counter ran (None for a counter without one, e.g. ``CharCounter``) and
    #: whether it was a fallback for a model with no known tokenizer.
    encoding: str | None = None
    encoding_fallback: bool = False
    _candidates: Sequence[ContextItem] = PrivateAttr(default=())
    _costs: Sequence[int] = PrivateAttr(default=())
    _sections: SectionMap | None = PrivateAttr(default=None)
    _status: Sequence[Status] = PrivateAttr(default=())
    _suffixes: dict[str, str] = PrivateAttr(default_factory=dict)

    @computed_field  # type: ignore[prop-decorator]
    @cached_property
    def decisions(self) -> tuple[Decision, ...]:
        """One decision per candidate, in candidate order."""
        out = []
        suffixes = self._suffixes
        names = self._sections.names() if self._sections is not None else ()
        turn = 0
        for item, cost, name, status in zip(
            self._candidates, self._costs, names, self._status, strict=True
        ):
            action, after, reason = _spell(status, cost, name, suffixes[name])
            if item.source is SourceType.CONVERSATION:
                turn += 1
            out.append(
                Decision(
                    item_id=item.id,
                    section=name,
                    source=item.source,
                    action=_ACTIONS[action],
                    tokens_before=cost,
                    tokens_after=after,
                    reason=reason,
                    label=item_label(item, turn),
                )
            )
        return tuple(out)


# --------------------------------------------------------------------------- the fill


@dataclass(slots=True)
class _Fill:
    """One section's fill; the decisions it made are in the packer's statuses."""

    kept: list[int] = field(default_factory=list)  # candidates kept whole
    cuts: dict[int, ContextItem] = field(default_factory=dict)  # candidate -> its cut
    summaries: list[tuple[int, ContextItem]] = field(default_factory=list)  # (position, item)
    used: int = 0
    smallest: float = math.inf  # the smallest cost among the candidates left out or cut


@dataclass(slots=True)
class _Packer:
    units: Units
    costs: list[int]
    status: list[Status]
    counter: TokenCounter
    formatter: Formatter
    next_position: int  # positions for hook summaries, after every candidate
    orders: dict[str, list[int]] = field(default_factory=dict)
    floors: dict[str, float] = field(default_factory=dict)  # see ``_order``
    history_only: set[str] = field(default_factory=set)  # sections of history alone

    def fill(self, section: SectionBudget, name: str, allowance: int) -> _Fill:
        out = _Fill()
        strategy = section.overflow
        cuts = strategy in (OverflowStrategy.TRUNCATE, OverflowStrategy.TRUNCATE_OLDEST)
        keep: Keep = "tail" if strategy is OverflowStrategy.TRUNCATE_OLDEST else "head"
        suffix = _suffix(section)
        summarize = strategy is OverflowStrategy.SUMMARIZE
        room = allowance
        closed = False  # history is closed once a turn did not fit
        smallest = math.inf
        misfits: list[int] = []
        units, costs, status, kept = self.units, self.costs, self.status, out.kept
        unit_cost, members, conversation = units.cost, units.members, units.conversation
        taken: list[int] = []  # history units kept, newest first
        order = self._order(section, name)
        # Once nothing left could fit, the rest go for want of room without a look each; that
        # needs a section of units of one, none of them history (whose misfits close it).
        floor = self.floors[name] if not summarize else -1
        history_only = name in self.history_only
        # The hot loop: most units are one item, dropped for want of room; keep that path short.
        for u in order:
            if closed and conversation[u]:
                for i in members.get(u) or (u,):
                    status[i] = CLOSED
                    smallest = min(smallest, costs[i])
                continue
            cost = unit_cost[u]
            if cost <= room:
                room -= cost
                if conversation[u]:
                    taken.append(u)
                if u in members:
                    for i in members[u]:
                        status[i] = FITS
                    kept.extend(members[u])
                else:
                    status[u] = FITS
                    kept.append(u)
                continue
            m = members.get(u)
            cut = None
            if cuts and m is None:
                cut = self._truncate(units.items[u], room, keep)
                cuts = cut is None  # one cut per section: after it the section is full
            if cut is not None:
                after = self.formatter.item_cost(cut, self.counter)
                room -= after
                out.cuts[u] = cut
                if conversation[u]:
                    taken.append(u)
                reason = f"cut from {cost:,} to {after:,} tokens to fit section {name!r}"
                status[u] = (TRUNCATED, after, reason)
                smallest = min(smallest, cost)
            elif m is None:
                status[u] = room
                if cost < smallest:
                    smallest = cost
                if summarize:
                    misfits.append(u)
                elif room < floor and not cuts:
                    rest = order[order.index(u) + 1 :]
                    any(map(status.__setitem__, rest, repeat(room)))
                    smallest = min(smallest, min(map(unit_cost.__getitem__, rest), default=cost))
                    break
            else:
                dropped = (DROPPED, 0, _needs(cost, room, name, suffix))
                for i in m:
                    status[i] = dropped
                    smallest = min(smallest, costs[i])
                if summarize:
                    misfits.extend(m)
            if conversation[u] and not closed:
                closed = True
                room += self._open_on_a_user_turn(out, taken)
                if history_only:  # the rest is history, all of it closed now
                    rest = order[order.index(u) + 1 :]
                    smallest = min(smallest, self._close(rest))
                    break
        if summarize and misfits:
            room = self._summarize(out, section, name, misfits, room)
        out.used = allowance - room
        out.smallest = smallest
        return out

    def _open_on_a_user_turn(self, out: _Fill, taken: list[int]) -> int:
        """Once history closed, give back the kept turns older than the oldest kept user turn
        (the replies of an exchange whose user turn did not fit), so that history opens on a
        user turn whenever one fits. A tail with no user turn at all (tool rounds after an
        old task) stays: dropping it would leave nothing. The tokens given back."""
        units, status = self.units, self.status
        items = units.items
        opening = -1  # position in ``taken`` (newest first) of the oldest user turn
        for pos, u in enumerate(taken):
            first = next(i for i in units.idxs(u) if items[i].source is SourceType.CONVERSATION)
            message = item_message(items[first])
            if message.role == "user" and not message.tool_result_ids:
                opening = pos
        if opening < 0:
            return 0
        orphans = [i for u in taken[opening + 1 :] for i in units.idxs(u)]
        if not orphans:
            return 0
        freed = 0
        for i in orphans:
            before = status[i]
            if i in out.cuts:
                del out.cuts[i]
                freed += before[1] if isinstance(before, tuple) else self.costs[i]
            else:
                freed += self.costs[i]
            status[i] = OPENED_LATE
        gone = set(orphans)
        out.kept[:] = [i for i in out.kept if i not in gone]
        return freed

    def _order(self, section: SectionBudget, name: str) -> list[int]:
        """The section's units ranked, merged with its history queue (newest first, order
        forced); computed once per pack."""
        order = self.orders.get(name)
        if order is not None:
            return order
        units = self.units
        history = units.history.get(name, [])[::-1]
        others = units.others.get(name, []).copy()
        priority, score = units.priority, units.score
        ranked = section.overflow is not OverflowStrategy.TRUNCATE_OLDEST
        if not ranked:
            # Newest first: by priority, then the unit's newest timestamp, then candidate order
            # (the keys are unique: sort them, and read each unit back from its key).
            stamps = self._stamps(others)
            keys = zip(
                map(neg, map(priority.__getitem__, others)),
                map(neg, stamps),
                map(neg, others),
                strict=True,
            )
            others = list(map(neg, map(itemgetter(2), sorted(keys))))
        else:
            # Stable passes with C-level keys: priority, then score, then candidate order (or,
            # for a recency section, newest first: the unit's newest timestamp, then the later
            # candidate).
            if section.recency:
                stamp = dict(zip(others, self._stamps(others), strict=True))
                others.sort(key=lambda u: (stamp[u], u), reverse=True)
            others.sort(key=score.__getitem__, reverse=True)
            others.sort(key=priority.__getitem__, reverse=True)
        if not history:
            order = others
        elif not others:
            order = history
            self.history_only.add(name)
        else:
            order = _merge(history, others, priority, score, ranked)
        self.orders[name] = order
        # The smallest unit cost, when the section has only units of one and no history.
        simple = not history and units.members.keys().isdisjoint(others)
        self.floors[name] = min(map(units.cost.__getitem__, others), default=0) if simple else -1
        return order

    def _stamps(self, units_: list[int]) -> list[float]:
        """Each unit's newest ``created_at`` as a timestamp."""
        units = self.units
        items = units.items
        stamps = list(map(_TIMESTAMP, map(_CREATED, map(items.__getitem__, units_))))
        for pos, u in enumerate(units_):
            if u in units.members:
                stamps[pos] = max(_TIMESTAMP(items[i].created_at) for i in units.members[u])
        return stamps

    def _close(self, rest: list[int]) -> float:
        """Drop the history units ``rest`` as older than the oldest kept turn; their smallest
        cost."""
        members = self.units.members
        if not members.keys().isdisjoint(rest):
            rest = [i for u in rest for i in members.get(u) or (u,)]
        any(map(self.status.__setitem__, rest, repeat(CLOSED)))
        return min(map(self.costs.__getitem__, rest), default=math.inf)

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
        items, status = self.units.items, self.status
        originals = [i for i in misfits if items[i].source is not SourceType.CONVERSATION]
        if not originals:
            return room
        try:
            summaries = list(section.summarize([items[i] for i in originals], room, self.counter))
        except Exception as exc:  # a failing hook leaves the misfits dropped, with the reason
            note = f"summarize hook failed ({type(exc).__name__}: {exc}); "
            for i in originals:
                reason = _spell(status[i], self.costs[i], name, _suffix(section))[2]
                status[i] = (DROPPED, 0, note + reason)
            return room
        kept_any = 0
        for summary in summaries:
            summary = summary.model_copy(update={"section": section.name})
            cost = self.formatter.item_cost(summary, self.counter)
            if cost <= room:
                room -= cost
                out.summaries.append((self.next_position, summary))
                self.next_position += 1
                kept_any += 1
        if kept_any:
            summarized = (
                SUMMARIZED,
                0,
                f"summarized into {kept_any} item(s) by the section's hook",
            )
            for i in originals:
                status[i] = summarized
        return room


def _merge(
    history: list[int], others: list[int], priority: list[int], score: list[float], ranked: bool
) -> list[int]:
    """Interleave the history queue (newest first) with the ranked units: a turn goes before
    every unit it ranks at least as high as."""
    # A NaN score (the sum is NaN then; so is it with both infinities) makes the ranking no
    # order that bisection could search: merge one by one.
    if ranked and not math.isnan(sum(score)):
        # ``others`` is sorted by (-priority, -score): find each turn's place by bisection.
        def neg_priority(u: int) -> int:
            return -priority[u]

        def neg_score(u: int) -> float:
            return -score[u]

        out: list[int] = []
        o = 0
        last = None
        for u in history:
            rank = (-priority[u], -score[u])
            if rank != last:  # a run of turns of one rank goes in one place
                p, s = last = rank
                lo = bisect_left(others, p, o, key=neg_priority)
                hi = bisect_right(others, p, lo, key=neg_priority)
                at = bisect_left(others, s, lo, hi, key=neg_score)
                out += others[o:at]
                o = at
            out.append(u)
        out += others[o:]
        return out
    out = []
    h = o = 0
    while h < len(history) or o < len(others):
        if o >= len(others) or (
            h < len(history)
            and (priority[history[h]], score[history[h]]) >= (priority[others[o]], score[others[o]])
        ):
            out.append(history[h])
            h += 1
        else:
            out.append(others[o])
            o += 1
    return out


# --------------------------------------------------------------------------- pack


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
    n = len(items)
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
    # Items are frozen pydantic models whose fields live in ``__dict__``: reading it with
    # C-level getters is several times cheaper than attribute access item by item.
    fields = list(map(FIELDS, items))
    sources = list(map(itemgetter("source"), fields))
    section_of = SectionMap.of(budget, sources, fields)
    # Every candidate gets its own status below (a None left over would fail when read).
    status = cast(list[Status], [None] * n)
    units, kept_pinned, pinned_used = build_units(items, fields, sources, costs, section_of, status)
    packer = _Packer(units, costs, status, counter, formatter, n)

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
        budget, order, pinned_used, packer, available - base - pinned_total
    )
    kept_idx = kept_pinned.copy()
    cuts: dict[int, ContextItem] = {}
    summaries: list[tuple[int, ContextItem]] = []
    for fill in fills.values():
        kept_idx += fill.kept
        kept_idx += fill.cuts
        cuts.update(fill.cuts)
        summaries += fill.summaries
    kept_idx.sort()
    summaries.sort(key=lambda pair: pair[0])
    kept_items = list(map(items.__getitem__, kept_idx))
    for i, cut in cuts.items():
        kept_items[bisect_left(kept_idx, i)] = cut
    kept_items += [item for _, item in summaries]
    payload = formatter.format(kept_items)
    used = formatter.count_payload(payload, counter)
    tallies = _tallies(order, units.sizes, section_of, fills, pinned_used, kept_pinned)
    if used > available:
        kept = [*zip(kept_idx, kept_items, strict=False), *summaries]
        while used > available:  # joins cost a token more than their parts: drop the last-ranked
            victim = _last_ranked(kept, n, section_of, by_name)
            if victim is None:
                raise BudgetError(
                    f"the payload needs {used:,} tokens but the budget leaves {available:,}; "
                    "raise max_tokens"
                )
            idx, _ = kept.pop(victim)
            before = status[idx]
            tally = tallies[section_of[idx]]
            if isinstance(before, tuple):  # a cut
                tally[2] -= 1
                tally[3] -= before[1]
            else:
                tally[1] -= 1
                tally[3] -= costs[idx]
            status[idx] = (
                DROPPED,
                0,
                "dropped after measuring the formatted payload: joining parts cost more tokens "
                "than the parts alone",
            )
            kept_items = [item for _, item in kept]
            payload = formatter.format(kept_items)
            used = formatter.count_payload(payload, counter)
        kept_idx = [i for i, _ in kept if i < n]

    left_out = bytearray(b"\x01") * n
    for i in kept_idx:
        left_out[i] = 0
    # Built from values the packer made itself: skip re-validating every kept item.
    window = Window.model_construct(
        items=tuple(kept_items),
        payload=payload,
        sections=_usages(order, allowances, pinned_used, tallies),
        overflow_items=tuple(compress(items, left_out)),
        used_tokens=used,
        available=available,
        max_tokens=budget.max_tokens,
        reserve_output=budget.reserve_output,
        counter=counter.name,
        estimated=counter.estimated,
        format=formatter.name,
        encoding=getattr(counter, "encoding_name", None),
        encoding_fallback=bool(getattr(counter, "fallback", False)),
    )
    window._candidates = items
    window._costs = costs
    window._sections = section_of
    window._status = status
    window._suffixes = {s.name: _suffix(s) for s in order}
    return window


def _allocate(
    budget: TokenBudget,
    order: list[SectionBudget],
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
        fill = packer.fill(section, name, allowance)
        fills[name], allowances[name] = fill, allowance
        free -= fill.used
        pool -= max(0, fill.used - reserve_left[name])
    if not budget.strict:  # leftovers go to sections that still had candidates
        for section in order:
            name = section.name
            fill = fills[name]
            if free < min(fill.smallest, MIN_TRUNCATED_TOKENS * 4):
                continue  # nothing that was left out could use the leftover
            allowance = int(min(cap_of(section), fill.used + free))
            if allowance > allowances[name]:
                saved = packer.status.copy()
                again = packer.fill(section, name, allowance)
                if again.used > fill.used:
                    free -= again.used - fill.used
                    fills[name], allowances[name] = again, allowance
                else:
                    packer.status[:] = saved
    return fills, allowances


def _last_ranked(
    kept: list[tuple[int, ContextItem]],
    n: int,
    section_of: SectionMap,
    by_name: dict[str, SectionBudget],
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
            or idx >= n
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


def _tallies(
    order: list[SectionBudget],
    sizes: Counter[str],
    section_of: SectionMap,
    fills: dict[str, _Fill],
    pinned_used: dict[str, int],
    kept_pinned: list[int],
) -> dict[str, list[int]]:
    """Per section: [candidates, kept, truncated, used tokens]."""
    pinned = Counter(section_of[i] for i in kept_pinned)
    return {
        s.name: [
            sizes[s.name],
            pinned[s.name] + len(fills[s.name].kept),
            len(fills[s.name].cuts),
            pinned_used.get(s.name, 0) + fills[s.name].used,
        ]
        for s in order
    }


def _usages(
    order: list[SectionBudget],
    allowances: dict[str, int],
    pinned_used: dict[str, int],
    tallies: dict[str, list[int]],
) -> tuple[SectionUsage, ...]:
    rows = []
    for s in order:
        candidates, kept, truncated, used = tallies[s.name]
        if s.name == UNASSIGNED and not candidates:
            continue
        rows.append(
            SectionUsage(
                name=s.name,
                description=s.description,
                reserved=s.min,
                limit=s.max,
                allowance=allowances[s.name] + pinned_used.get(s.name, 0),
                used=used,
                candidates=candidates,
                kept=kept,
                truncated=truncated,
                dropped=candidates - kept - truncated,
            )
        )
    return tuple(rows)
