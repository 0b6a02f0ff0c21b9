"""Assembly: the memory block of one request, within the memory budget, in a cache-stable order.

Order, most stable first (so provider prompt caches keep hitting): the ``<context-topics>``
hint (changes only at compaction), paged-in topics (change on expand/collapse), then the
dynamic part — summaries (all tag summaries for a broad question, segment summaries earliest
first for a temporal one, the matched topics' summaries otherwise) and the recalled raw turns,
verbatim, in conversation order under date headers; a recalled question (a turn ending with
``?``) is packed as if ranked ``question_demotion`` times further down. A recalled turn that is
mostly an older version of what the caller's history already holds (``Held``: a file re-sent
after an edit) is left out. Raw turns come before summaries for a specific question (only a
raw turn holds a detail verbatim); a broad or temporal question gives summaries up to
``summary_share`` of the budget first. The rendered block is counted whole and is never over
budget.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from functools import lru_cache

from pydantic import BaseModel, ConfigDict

from contextfold._bounded import SessionLRU
from contextfold.items import ContextItem, SourceType
from contextfold.memory.config import AssemblySettings
from contextfold.memory.paging import PagedTopic
from contextfold.memory.recall import RankedTurn
from contextfold.memory.rules import TagRules
from contextfold.memory.tagging import TagResult
from contextfold.memory.turn_lengths import LineCosts, line_key
from contextfold.store.models import TagSummary, TurnRow
from contextfold.store.protocols import MemoryStorage
from contextfold.tokens import TokenCounter

__all__ = ["MIN_MEMORY_TOKENS", "Assembler", "Held", "MemoryBlock", "MemoryBudget", "Room"]

#: Lines shorter than this (stripped) say little about whose text it is (``}``, ``else:``).
_LINE = 8


def _lines(text: str) -> set[str]:
    """The distinct lines of ``text`` of at least ``_LINE`` characters, whitespace collapsed."""
    return {" ".join(line.split()) for line in text.splitlines() if len(line.strip()) >= _LINE}


class Held:
    """What the caller's history already holds, to leave out recalled turns that are older
    versions of it. The rule: a turn with at least 3 lines of 8 or more characters is held
    when at least half of those lines appear (whitespace collapsed) anywhere in the history.
    A file re-sent after an edit keeps most of its lines, so its pre-edit copy is not
    recalled beside it; a turn that merely quotes a line or two of the history still is.

    >>> held = Held(["def area(r):\\n    return 3.14159 * r * r\\n# area of a circle, in m2"])
    >>> held.holds("def area(r):\\n    return 3.14 * r * r\\n# area of a circle, in m2")
    True
    >>> held.holds("Unrelated words here.\\nAnd another long line.\\nThird line of text.")
    False
    """

    __slots__ = ("_lines", "_texts", "left_out")

    def __init__(self, texts: Iterable[str]) -> None:
        self._texts = texts  # read once, on the first turn long enough to compare
        self._lines: set[str] | None = None
        self.left_out = 0  # turns the assembler left out for it

    def holds(self, text: str) -> bool:
        mine = _lines(text)
        if len(mine) < 3:
            return False
        if self._lines is None:  # built once, and only when a candidate is long enough
            self._lines = set().union(*map(_lines, self._texts))
        return 2 * len(mine & self._lines) >= len(mine)


class MemoryBudget(BaseModel):
    """Where the memory budget went, in tokens (``used`` counts the whole rendered block,
    wrappers included)."""

    model_config = ConfigDict(frozen=True)
    budget: int
    hint: int = 0
    paged: int = 0
    summaries: int = 0
    turns: int = 0
    used: int = 0
    turns_recalled: int = 0
    turns_skipped: int = 0
    turns_held: int = 0  # older versions of what the history holds (``Held``), left out


#: A memory budget the window leaves below this gets no memory at all (``Room``): a block that
#: small holds no more than its own wrappers.
MIN_MEMORY_TOKENS = 64


@dataclass(frozen=True, slots=True)
class Room:
    """What a request leaves of the model's window for its history and memory together: the
    window less the reply's reserve, the system prompt's framing, the tools and everything
    else sent besides the history (``tokens``), and what each message of the history costs
    (``history``, one count per message given to ``on_message_inbound``, the system prompt
    included). Memory then gets at most what the history sent leaves of ``tokens``, and none
    below ``MIN_MEMORY_TOKENS``: memory never pushes the request past the window.

    The history sent is the messages the filter keeps, unless the caller sends more:
    ``sent(kept)`` then names every message it sends when the filter keeps ``kept`` (the
    proxy's: turns the provider holds for a chained request, a tool call kept with its
    result, a user turn kept first — messages the filter removed that still go).

    >>> Room(tokens=1000, history=(300, 400)).left([1])  # the first one compacted: not sent
    600
    >>> Room(tokens=1000, history=(300, 400), sent=lambda kept: [0, *kept]).left([1])
    300
    """

    tokens: int
    history: Sequence[int]
    sent: Callable[[list[int]], Iterable[int]] | None = None

    def left(self, kept: Iterable[int]) -> int:
        """The tokens left for memory beside the history sent when the filter keeps the
        messages ``kept`` (indices)."""
        indices = list(kept)
        if self.sent is not None:
            indices = list(self.sent(indices))
        costs = self.history
        return self.tokens - sum(costs[i] for i in set(indices))


@dataclass
class MemoryBlock:
    text: str
    items: list[ContextItem]
    budget: MemoryBudget


@dataclass
class _Part:
    kind: str
    text: str
    tokens: int
    meta: dict[str, object] = field(default_factory=dict)
    priority: int = 5


def _day(moment: datetime) -> str:
    return _date_header(moment.date())


@lru_cache(maxsize=4096)
def _date_header(day: date) -> str:
    """A day's header line (made once per day: a recall asks for it two or three times per
    ranked turn)."""
    return f"[{day.day} {day:%B %Y}]"


def _is_question(text: str) -> bool:
    return text.rstrip().endswith(("?", "？"))


def _questions_later(
    ranked: Sequence[RankedTurn], rows: Mapping[int, TurnRow], demotion: float
) -> Sequence[RankedTurn]:
    """``ranked`` in packing order: a turn that is a question (``_is_question``) goes where
    rank × ``demotion`` would put it, ties to the turn recall ranked first.

    A question echoes what is asked, so recall ranks it high, but the answer is in the turns
    around it: on LoCoMo's tune split 26 % of the stored turns end with a question mark and
    8–14 % of the evidence cited in categories 1–4 does (docs/memory.md, "Questions packed
    later").
    """
    if demotion <= 1:
        return ranked
    keys = [
        (i + 1) * demotion
        if (row := rows.get(hit.seq)) is not None and _is_question(row.text)
        else i + 1
        for i, hit in enumerate(ranked)
    ]
    return [ranked[i] for i in sorted(range(len(ranked)), key=lambda i: (keys[i], i))]


class Assembler:
    def __init__(
        self,
        store: MemoryStorage,
        counter: TokenCounter,
        rules: TagRules,
        settings: AssemblySettings,
        *,
        sessions: int = 1000,
    ) -> None:
        self.store = store
        self.counter = counter
        self.rules = rules
        self.settings = settings
        # Per session, for the ``sessions`` most recently used (rebuilt from the store).
        self._topic_cache: SessionLRU[tuple[tuple[object, ...], list[str], str]] = SessionLRU(
            sessions
        )
        # Keyed by the session's numbers (``MemoryStorage.session_version``) besides the
        # watermark: a session another process deleted and wrote again, or whose summaries it
        # rebuilt, is read again.
        self._summary_cache: SessionLRU[tuple[tuple[int, int], dict[str, TagSummary]]] = SessionLRU(
            sessions
        )
        self._compacted_cache: SessionLRU[tuple[tuple[int, int], dict[str, int]]] = SessionLRU(
            sessions
        )

    def _topics(
        self, sid: str, now: datetime, tools: bool | str, limit: int
    ) -> tuple[list[str], str]:
        """The live stored topics (summarised or segmented, TTL not run out), best first by
        rule priority then compacted turn count, and the ``<context-topics>`` hint listing
        them within ``limit`` tokens. Both change only at compaction (or at a TTL's day
        boundary), so they are cached per compaction watermark: for one budget, the hint stays
        byte-identical between compactions."""
        record = self.store.session(sid)
        watermark = record.compaction_watermark
        key = (sid, record.born, watermark, now.date().isoformat(), tools, limit)
        cached = self._topic_cache.peek(sid)
        if cached is not None and cached[0] == key:
            return cached[1], cached[2]
        # A topic's count is the compacted turns tagged with it (not the turns of the segments
        # carrying it: a long segment carries every tag of its turns, so that count said
        # "409 turns" of a tag 14 turns had), for the tags a segment carries.
        counts = self._compacted_counts(sid, record.born, watermark)
        # When a tag was last seen matters only to the tags with a TTL rule: only theirs is read.
        ttl = (
            [tag for tag in counts if self.rules.for_tag(tag).ttl_days is not None]
            if self.rules.has_ttl
            else []
        )
        last_seen = self.store.tag_last_seen(sid, tags=ttl) if ttl else {}
        live = [
            tag
            for tag in counts
            if tag not in last_seen or not self.rules.expired(tag, last_seen[tag], now)
        ]
        if len(self.rules):
            live.sort(key=lambda t: (-self.rules.priority(t), -counts[t], t))
        else:  # every tag at the default priority: by count, then name (stable sorts, in C)
            live.sort()
            live.sort(key=counts.__getitem__, reverse=True)
        hint = self._hint(live, counts, max(watermark - 1, 0), tools, limit)
        self._topic_cache.put(sid, (key, live, hint))
        return live, hint

    def kept_topics(self, sid: str) -> tuple[int, int, dict[str, int]] | None:
        """The compacted topics' counts kept for the session, with the ``born`` and watermark
        they hold for (``memory.snapshots``)."""
        cached = self._compacted_cache.peek(sid)
        return None if cached is None else (cached[0][0], cached[0][1], cached[1])

    def adopt_topics(self, sid: str, born: int, watermark: int, counts: dict[str, int]) -> None:
        """Keep the compacted topics' counts an earlier process saved, where none are kept (the
        caller has checked the session is still where they were read: same generation)."""
        if self._compacted_cache.peek(sid) is None:
            self._compacted_cache.put(sid, ((born, watermark), counts))

    def rewarm(self, sid: str) -> None:
        """Read the compacted topics' counts a compaction just changed (``_compacted_counts``),
        so the next recall does not."""
        record = self.store.session(sid)
        self._compacted_counts(sid, record.born, record.compaction_watermark)

    def _compacted_counts(self, sid: str, born: int, watermark: int) -> dict[str, int]:
        """The compacted turns' tag counts, for the tags a segment carries: read once per
        compaction from the counts the store keeps on write (``topic_counts``, one row per
        tag), and kept per session."""
        cached = self._compacted_cache.peek(sid)
        if cached is not None and cached[0] == (born, watermark):
            return cached[1]
        read_at, counts = self.store.topic_counts(sid)
        self._compacted_cache.put(sid, ((born, read_at), counts))
        return counts

    def _cached_summaries(self, sid: str) -> dict[str, TagSummary]:
        """Tag summaries change only at compaction or a rebuild, both of which draw a new
        generation for the session: cached per (born, generation)."""
        record = self.store.session(sid)
        key = (record.born, record.generation)
        cached = self._summary_cache.peek(sid)
        if cached is None or cached[0] != key:
            cached = (key, self.store.paging.tag_summaries(sid))
            self._summary_cache.put(sid, cached)
        return cached[1]

    def _hint(
        self,
        tags: list[str],
        counts: dict[str, int],
        compacted: int,
        tools: bool | str,
        limit: int,
    ) -> str:
        if not self.settings.context_hint_enabled or not tags:
            return ""
        lines = ["<context-topics>"]
        if tools == "weak":
            lines.append("Use expand_topic to read one of these topics in detail.")
        elif tools:
            lines.append(
                "Use find_quote for specific facts, expand_topic for detail on a topic, "
                "collapse_topic to free budget."
            )
        # One line of topic names with their turn counts: the model learns what it can ask
        # for, and the detail stays in memory (recall, expand_topic) instead of the prefix.
        lead = "Earlier topics (turns): "
        used = self.counter.count("\n".join([*lines, lead, "</context-topics>"]))
        # A tag on most of the compacted turns (the speakers' names, the project's name) is a
        # constant of the conversation, not a topic: the hint leaves it out.
        topics = [t for t in tags if counts.get(t, 0) * 2 <= compacted]
        names: list[str] = []
        for tag in topics[: self.settings.context_hint_topics]:
            entry = f"{tag} ({counts.get(tag, 0)})"
            cost = self.counter.count((", " if names else "") + entry)
            if used + cost > limit:
                break
            names.append(entry)
            used += cost
        if not names:
            return ""
        return "\n".join([*lines, lead + ", ".join(names), "</context-topics>"])

    def _summaries(self, sid: str, tags: TagResult, live: list[str]) -> list[_Part]:
        if tags.temporal:
            return [
                _Part(
                    "segment",
                    seg.summary,
                    seg.summary_tokens,
                    {"segment_id": seg.id, "first_seq": seg.first_seq, "tags": list(seg.tags)},
                )
                for seg in self.store.segments(sid, full_text=False)  # earliest first
            ]
        # A broad question takes every live topic's summary (cached per generation); a
        # specific one reads its own tags' summaries only.
        if tags.broad:
            summaries = self._cached_summaries(sid)
        else:
            summaries = self.store.paging.tag_summaries(sid, tags=tags.tags) if tags.tags else {}
        wanted = live if tags.broad else [t for t in tags.tags if t in summaries]
        return [
            _Part(
                "tag_summary",
                f"{tag}: {summaries[tag].summary}",
                summaries[tag].tokens + 3,
                {"tag": tag},
                self.rules.priority(tag),
            )
            for tag in wanted
            if tag in summaries
        ]

    def assemble(
        self,
        sid: str,
        ranked: Sequence[RankedTurn],
        *,
        tags: TagResult,
        paged: Sequence[PagedTopic],
        budget: int,
        tools: bool | str = False,
        now: datetime | None = None,
        held: Held | None = None,
        dashboard: Callable[[list[str]], str] | None = None,
        lines: LineCosts | None = None,
    ) -> MemoryBlock:
        """``tools``: the memory tools are offered (``"weak"``/``"strong"``: to a model of
        that tier, ``delegation.py``); ``dashboard(topics)``: the strong tier's budget
        dashboard, placed after the hint when it fits (counted as hint tokens); ``lines``:
        the session's kept turn facts, where each recalled turn's line cost is kept once
        counted (``TurnLengths.lines``)."""
        now = now or datetime.now(UTC)
        hint_limit = min(
            self.settings.context_hint_max_tokens, int(budget * self.settings.context_hint_share)
        )
        live, hint = self._topics(sid, now, tools, hint_limit)
        room = budget
        hint_tokens = self.counter.count(hint) if hint else 0
        if hint_tokens > room:
            hint, hint_tokens = "", 0
        room -= hint_tokens
        board = dashboard(live) if dashboard is not None else ""
        board_tokens = self.counter.count(board) + 1 if board else 0
        if board and board_tokens <= room // 2:
            hint = f"{hint}\n{board}" if hint else board
            hint_tokens += board_tokens
            room -= board_tokens
        paged_parts: list[_Part] = []
        for topic in paged:
            text = f"## {topic.tag} ({topic.depth})\n{topic.text}"
            cost = self.counter.count(text) + 1
            if cost <= room - 8:
                paged_parts.append(
                    _Part("paged", text, cost, {"tag": topic.tag, "depth": topic.depth})
                )
                room -= cost
        summary_parts: list[_Part] = []
        summaries = self._summaries(sid, tags, live)
        first_summaries = tags.broad or tags.temporal
        if first_summaries:
            cap = int(room * self.settings.summary_share)
            summary_parts, room = self._take(summaries, min(cap, room), room)
        turn_parts, skipped, room = self._turns(sid, ranked, room, held, lines)
        if not first_summaries and summaries:
            summary_parts, room = self._take(summaries, room, room)
        block = self._render(
            budget, hint, hint_tokens, paged_parts, summary_parts, turn_parts, skipped
        )
        if held is not None and held.left_out:
            block.budget = block.budget.model_copy(update={"turns_held": held.left_out})
        return block

    def _take(self, parts: list[_Part], cap: int, room: int) -> tuple[list[_Part], int]:
        taken, used = [], 0
        for part in parts:
            if used + part.tokens + 1 <= cap:
                taken.append(part)
                used += part.tokens + 1
        return taken, room - used

    def _turns(
        self,
        sid: str,
        ranked: Sequence[RankedTurn],
        room: int,
        held: Held | None = None,
        lines: LineCosts | None = None,
    ) -> tuple[list[_Part], int, int]:
        room -= self.counter.count("<memory>\n") + self.counter.count("\n</memory>")
        if room <= 0 or not ranked:
            return [], len(ranked), max(room, 0)
        seqs = [r.seq for r in ranked]
        rows = self.store.turn_rows(sid, seqs)
        ranked = _questions_later(ranked, rows, self.settings.question_demotion)
        name = line_key(self.counter)
        known = dict(zip(seqs, lines.lines(seqs, name), strict=True)) if lines is not None else {}
        counted: list[tuple[int, int]] = []
        chosen: list[tuple[TurnRow, RankedTurn]] = []
        days: set[str] = set()
        skipped = 0
        for hit in ranked:
            row = rows.get(hit.seq)
            if row is None:
                continue
            if held is not None and held.holds(row.text):
                held.left_out += 1
                continue
            # Each turn and date header is a line: its cost is its text with the newline that
            # ends it (with cl100k the newline nearly always merges into the final
            # punctuation). The rendered block is counted again whole (see _render).
            cost = known.get(hit.seq, 0)
            if not cost:
                cost = self.counter.count(row.text + "\n")
                counted.append((hit.seq, cost))
            day = _day(row.created_at)
            if day not in days:
                cost += self.counter.count(day + "\n")
            if cost > room:
                skipped += 1
                continue
            days.add(day)
            chosen.append((row, hit))
            room -= cost
        if lines is not None and counted:
            lines.set_lines(counted, name)
        chosen.sort(key=lambda pair: pair[0].seq)
        parts = [
            _Part(
                "turn",
                row.text,
                row.token_count,
                {
                    "seq": row.seq,
                    "role": row.role,
                    "day": _day(row.created_at),
                    "score": hit.score,
                    "signals": hit.ranks,
                },
            )
            for row, hit in chosen
        ]
        return parts, skipped, room

    def _render(
        self,
        budget: int,
        hint: str,
        hint_tokens: int,
        paged: list[_Part],
        summaries: list[_Part],
        turns: list[_Part],
        skipped: int,
    ) -> MemoryBlock:
        def text_of(turn_parts: list[_Part]) -> str:
            blocks = [hint] if hint else []
            if paged:
                blocks.append(
                    "<memory-topics>\n" + "\n".join(p.text for p in paged) + "\n</memory-topics>"
                )
            body: list[str] = [p.text for p in summaries]
            day = None
            for part in turn_parts:
                if part.meta["day"] != day:
                    day = part.meta["day"]
                    body.append(str(day))
                body.append(part.text)
            if body:
                blocks.append("<memory>\n" + "\n".join(body) + "\n</memory>")
            return "\n".join(blocks)

        text = text_of(turns)
        used = self.counter.count(text) if text else 0
        # Exact check of the rendered whole: drop the lowest-ranked turns until it fits.
        while used > budget and turns:
            worst = min(turns, key=lambda p: float(p.meta["score"]))  # type: ignore[arg-type]
            turns.remove(worst)
            skipped += 1
            text = text_of(turns)
            used = self.counter.count(text) if text else 0
        items = [
            ContextItem(
                content=part.text,
                source=SourceType.MEMORY,
                section="memory",
                priority=min(10, max(1, part.priority)),
                score=float(part.meta.get("score", 0.0)),  # type: ignore[arg-type]
                metadata={"kind": part.kind, **part.meta},
            )
            for part in [
                *([_Part("hint", hint, hint_tokens)] if hint else []),
                *paged,
                *summaries,
                *turns,
            ]
        ]
        return MemoryBlock(
            text=text,
            items=items,
            budget=MemoryBudget(
                budget=budget,
                hint=hint_tokens,
                paged=sum(p.tokens for p in paged),
                summaries=sum(p.tokens for p in summaries),
                turns=sum(p.tokens for p in turns),
                used=used,
                turns_recalled=len(turns),
                turns_skipped=skipped,
            ),
        )
