"""The packer's first step: candidates read into plain lists and grouped into units, each
section's units queued, pinned units kept and orphaned tool traffic dropped (``build_units``).

Also how the packer records a decision per candidate (``Status``) until ``Window.decisions``
turns it into a ``Decision``.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import compress, repeat
from operator import attrgetter, is_, is_not, itemgetter
from typing import Any

from contextfold.budget import TokenBudget
from contextfold.items import (
    ContextItem,
    Message,
    SourceType,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)

__all__ = [
    "CLOSED",
    "DROPPED",
    "FIELDS",
    "FITS",
    "KEPT",
    "OPENED_LATE",
    "PINNED",
    "SUMMARIZED",
    "TRUNCATED",
    "UNASSIGNED",
    "SectionMap",
    "Status",
    "Units",
    "build_units",
    "tool_groups",
]

UNASSIGNED = "unassigned"
HISTORY_CLOSED = "older than the oldest kept turn; history stays a contiguous suffix"
HISTORY_OPENED_LATE = (
    "in an exchange whose user turn did not fit; history keeps whole exchanges, so it opens on "
    "a user turn"
)
#: Items are frozen pydantic models whose fields live in ``__dict__``: reading it with C-level
#: getters is several times cheaper than attribute access item by item.
FIELDS = attrgetter("__dict__")

# A decision before it becomes a ``Decision`` model, one per candidate (its section and its
# cost, ``tokens_before``, are kept beside it):
# - ``str``: kept whole, the string being the reason (``FITS`` or ``PINNED``);
# - ``int``: dropped for want of room, the int being the tokens left in the section then (the
#   reason is formatted when decisions are first read; the packer drops thousands per build);
# - ``(action, tokens after, reason)`` for everything else.
Status = str | int | tuple[str, int, str]
KEPT, TRUNCATED, DROPPED, SUMMARIZED = "kept", "truncated", "dropped", "summarized"
FITS, PINNED = "fits", "pinned"
CLOSED: tuple[str, int, str] = (DROPPED, 0, HISTORY_CLOSED)
OPENED_LATE: tuple[str, int, str] = (DROPPED, 0, HISTORY_OPENED_LATE)


# --------------------------------------------------------------------------- groups

_ToolIds = dict[int, tuple[list[str], list[str]]]  # candidate -> (tool call ids, result ids)


def _tool_ids(idxs: Iterable[int], messages: Iterable[Message | None]) -> _ToolIds:
    """The tool call and result ids of the candidates ``idxs`` whose message (``messages``,
    one per candidate) carries tools."""
    out: _ToolIds = {}
    for i, message in zip(idxs, messages, strict=True):
        if message is None:
            continue
        content = message.content
        if len(content) == 1 and isinstance(content[0], TextBlock):
            continue
        calls, results = [], []
        for block in content:
            if isinstance(block, ToolUseBlock):
                calls.append(block.id)
            elif isinstance(block, ToolResultBlock):
                results.append(block.tool_use_id)
        out[i] = (calls, results)
    return out


def _group_parents(items: Sequence[ContextItem], candidates: list[int], ids: _ToolIds) -> list[int]:
    """Union-find over the candidates that may share a group (a ``group_id``, or tool blocks,
    in candidate order); every other item is its own group."""
    parent = list(range(len(items)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    owner: dict[tuple[str, str], int] = {}
    for i in candidates:
        group_id = items[i].group_id
        keys = [("group", group_id)] if group_id else []
        if i in ids:
            calls, results = ids[i]
            keys += [("tool", t) for t in (*calls, *results)]
        for key in keys:
            if key in owner:
                parent[find(i)] = find(owner[key])
            else:
                owner[key] = i
    for i in candidates:
        parent[i] = find(i)
    return parent


def tool_groups(items: Sequence[ContextItem]) -> list[int]:
    """A group number per item: items sharing a ``group_id``, or a tool call id, share one."""
    ids = _tool_ids(range(len(items)), map(attrgetter("message"), items))
    candidates = [i for i, item in enumerate(items) if item.group_id is not None or i in ids]
    return _group_parents(items, candidates, ids)


def _orphan_reason(idxs: list[int], ids: _ToolIds) -> str | None:
    """Why a conversation unit carries a tool call without its result (or the reverse)."""
    calls: set[str] = set()
    results: set[str] = set()
    for i in idxs:
        if i in ids:
            calls.update(ids[i][0])
            results.update(ids[i][1])
    if calls - results:
        return f"tool call {sorted(calls - results)[0]} has no result among the candidates"
    if results - calls:
        return f"tool result for {sorted(results - calls)[0]} has no call among the candidates"
    return None


def _lonely_tool_traffic(items: Sequence[ContextItem], idxs: list[int], ids: _ToolIds) -> set[int]:
    """Unpinned members of a pinned unit whose tool calls or results lack their partner; going
    without one can orphan its partners, so repeat until nothing changes."""
    lonely: set[int] = set()
    while True:
        calls: set[str] = set()
        results: set[str] = set()
        for j in idxs:
            if j not in lonely and j in ids:
                calls.update(ids[j][0])
                results.update(ids[j][1])
        unmatched = calls ^ results
        more = set()
        for j in idxs:
            if j in lonely or items[j].pinned or j not in ids:
                continue
            if unmatched & {*ids[j][0], *ids[j][1]}:
                more.add(j)
        if not more:
            return lonely
        lonely |= more


# --------------------------------------------------------------------------- units


@dataclass(slots=True)
class SectionMap:
    """The section of each candidate: the one its ``section`` names, when the budget has a
    section by that name, else the one taking its source (``unassigned`` when none does)."""

    sources: list[SourceType]
    by_source: dict[SourceType, str]
    explicit: dict[int, str]  # candidate -> the section it names

    @classmethod
    def of(
        cls, budget: TokenBudget, sources: list[SourceType], fields: list[dict[str, Any]]
    ) -> SectionMap:
        if not budget.sections:
            return cls(sources, dict.fromkeys(SourceType, "context"), {})
        by_source = dict.fromkeys(SourceType, UNASSIGNED)
        by_source.update({source: s.name for s in budget.sections for source in s.sources})
        wanted = list(map(itemgetter("section"), fields))
        explicit: dict[int, str] = {}
        if wanted.count(None) != len(wanted):
            names = {s.name for s in budget.sections}
            for i in compress(range(len(wanted)), map(is_not, wanted, repeat(None))):
                if wanted[i] in names:
                    explicit[i] = wanted[i]
        return cls(sources, by_source, explicit)

    def __getitem__(self, i: int) -> str:
        return self.explicit.get(i) or self.by_source.get(self.sources[i], UNASSIGNED)

    def names(self) -> list[str]:
        out = list(map(self.by_source.get, self.sources, repeat(UNASSIGNED)))
        for i, name in self.explicit.items():
            out[i] = name
        return out


@dataclass(slots=True)
class Units:
    """The candidates of a pack as parallel lists, and its units.

    A unit (an item, or items packed all-or-none) is named by its first candidate index, its
    key; ``cost``, ``priority``, ``score`` and ``conversation`` are indexed by key and hold the
    unit's values (for a unit of one, the item's own). ``members`` lists the candidates of the
    units of more than one; ``others`` and ``history`` hold each section's units in candidate
    order, conversation history apart."""

    items: Sequence[ContextItem]
    cost: list[int]
    priority: list[int]
    score: list[float]
    conversation: list[bool]
    members: dict[int, list[int]] = field(default_factory=dict)
    others: dict[str, list[int]] = field(default_factory=dict)
    history: dict[str, list[int]] = field(default_factory=dict)
    sizes: Counter[str] = field(default_factory=Counter)  # candidates per section

    def add(self, name: str, idxs: list[int]) -> None:
        """Queue a unit of several candidates (it may hold just one: part of a group that
        spans sections) in its section."""
        key = idxs[0]
        conversation = any(map(self.conversation.__getitem__, idxs))
        if len(idxs) > 1:
            self.members[key] = idxs
            self.cost[key] = sum(map(self.cost.__getitem__, idxs))
            self.priority[key] = max(map(self.priority.__getitem__, idxs))
            self.score[key] = max(map(self.score.__getitem__, idxs))
            self.conversation[key] = conversation
        (self.history if conversation else self.others)[name].append(key)

    def idxs(self, key: int) -> list[int]:
        return self.members.get(key) or [key]

    def contiguous(self, name: str) -> None:
        """Merge conversation units whose turns interleave (a tool call, another turn, then
        the result; a ``group_id`` spanning turns) into one unit. History is taken newest
        first, whole units at a time; a unit that spans another unit's turns would otherwise
        leave a gap, and the kept history would not be a suffix."""
        keys, members = self.history[name], self.members
        multi = members.keys() & keys
        if not multi:
            return
        items, conversation = self.items, SourceType.CONVERSATION
        turns = {}
        for key in multi:
            conv = [i for i in members[key] if items[i].source is conversation]
            turns[key] = (conv[0], conv[-1])
        # Most units of several turns hold adjacent turns (a call and its results): when no
        # unit starts inside another's span and each starts at its key, nothing changes.
        starts = sorted(turns[k][0] if k in turns else k for k in keys)
        if all(
            lo == key and bisect_right(starts, lo) == bisect_left(starts, hi)
            for key, (lo, hi) in turns.items()
        ):
            return
        spans = [(*turns[k], k) if k in turns else (k, k, k) for k in keys]
        spans.sort()
        merged: list[tuple[int, int]] = []  # (last turn index, key)
        for lo, hi, key in spans:
            if merged and lo < merged[-1][0]:
                last, prev = merged[-1]
                idxs = sorted(self.idxs(prev) + self.idxs(key))
                new = idxs[0]
                cost = self.cost[prev] + self.cost[key]
                priority = max(self.priority[prev], self.priority[key])
                score = max(self.score[prev], self.score[key])
                self.members[new] = idxs
                self.cost[new], self.priority[new], self.score[new] = cost, priority, score
                self.conversation[new] = True
                merged[-1] = (max(last, hi), new)
            else:
                merged.append((hi, key))
        self.history[name] = [key for _, key in merged]


def build_units(
    items: Sequence[ContextItem],
    fields: list[dict[str, Any]],
    sources: list[SourceType],
    costs: list[int],
    section_of: SectionMap,
    status: list[Status],
) -> tuple[Units, list[int], dict[str, int]]:
    """The units of every section, with pinned units kept and orphaned tool traffic dropped
    (their statuses set); also the kept pinned candidates and the tokens they take per section.
    """
    n = len(items)
    everything = range(n)
    conversation = list(map(is_, sources, repeat(SourceType.CONVERSATION)))
    units = Units(
        items,
        costs,
        list(map(itemgetter("priority"), fields)),
        list(map(itemgetter("score"), fields)),
        conversation,
    )
    names = {UNASSIGNED, *section_of.by_source.values(), *section_of.explicit.values()}
    units.others = {name: [] for name in names}
    units.history = {name: [] for name in names}
    # Only conversation items carry a message (``ContextItem`` checks it).
    messages = map(itemgetter("message"), compress(fields, conversation))
    ids = _tool_ids(compress(everything, conversation), messages)
    grouped = set(ids)
    group_ids = list(map(itemgetter("group_id"), fields))
    if group_ids.count(None) != n:
        grouped.update(compress(everything, map(is_not, group_ids, repeat(None))))
    pins = list(map(itemgetter("pinned"), fields))
    pinned = set(compress(everything, pins)) if True in pins else set()
    special = sorted(pinned | grouped)

    # Candidates sharing a group (in one section) form one unit; they take the careful path
    # in candidate order, like pinned candidates and tool traffic.
    in_group: dict[int, list[int]] = {}
    if grouped:
        candidates = sorted(grouped)
        parents = _group_parents(items, candidates, ids)
        members: dict[tuple[str, int], list[int]] = {}
        for i in candidates:
            members.setdefault((section_of[i], parents[i]), []).append(i)
        in_group = {i: idxs for idxs in members.values() if len(idxs) > 1 for i in idxs}
    if in_group:  # units of several items overwrite their key's slots: work on copies
        units.cost = costs.copy()
        units.priority = units.priority.copy()
        units.score = units.score.copy()
    # A unit of one item is appended to its section's queue by a C-level loop (``list.append``
    # mapped over (queue, index) pairs); the careful path's units join them after, and the
    # queues are put back in candidate order.
    queues = {
        source: (units.history if source is SourceType.CONVERSATION else units.others)[name]
        for source, name in section_of.by_source.items()
    }
    queue_of = list(map(queues.get, sources, repeat(units.others[UNASSIGNED])))
    for i, name in section_of.explicit.items():
        queue_of[i] = (units.history if conversation[i] else units.others)[name]
    careful: list[int] = []
    for i in special:
        queue_of[i] = careful
    any(map(list.append, queue_of, everything))
    for name in names:
        units.sizes[name] = len(units.others[name]) + len(units.history[name])
    units.sizes.update(section_of[i] for i in special)

    kept: list[int] = []
    pinned_used: dict[str, int] = {}
    for i in special:
        name = section_of[i]
        idxs = in_group.get(i, [i])
        if idxs[0] != i:
            continue  # a later member of a group already handled at its first member
        is_conversation = any(map(conversation.__getitem__, idxs))
        tools = is_conversation and not ids.keys().isdisjoint(idxs)
        if not pinned.isdisjoint(idxs):
            if tools:
                lonely = _lonely_tool_traffic(items, idxs, ids)
                if lonely:  # a pinned group never carries orphaned tool traffic in
                    orphan = _orphan_reason(idxs, ids) or "tool traffic without its partner"
                    for j in lonely:
                        status[j] = (DROPPED, 0, orphan)
                    idxs = [j for j in idxs if j not in lonely]
            pinned_used[name] = pinned_used.get(name, 0) + sum(map(costs.__getitem__, idxs))
            kept.extend(idxs)
            for j in idxs:
                status[j] = PINNED
            continue
        if tools:
            reason = _orphan_reason(idxs, ids)
            if reason is not None:
                for j in idxs:
                    status[j] = (DROPPED, 0, reason)
                continue
        units.add(name, idxs)

    if special:
        for name in names:
            units.others[name].sort()
            units.history[name].sort()
            units.contiguous(name)
    return units, kept, pinned_used
