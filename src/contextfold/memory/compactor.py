"""Compaction: when the live conversation nears the window, old turns become segment summaries.

* ``TokenMonitor`` says whether the live turns (at or above the compaction watermark) cross the
  soft (default 70 %) or hard (85 %) share of the room the context window leaves the history:
  the whole window, or — where the caller noted what each request carries besides its history
  (``MemoryEngine.note_fixed_tokens``: the proxy does; system prompt, tools, memory, the
  reply's reserve) — the window less those fixed parts, never below a tenth of the window.
* ``segment_turns`` groups contiguous turns by topic: a turn joins the running segment while
  its tags overlap the segment's recent tags (untagged turns and tool results always join).
* ``Compactor.compact`` takes ONE greedy batch — every turn from the watermark up to the
  protected recent turns — segments it, summarises the segments concurrently (order kept),
  and stores segments and the new watermark in one transaction (``MemoryStorage.compact``).
  Each segment's tags are the union of its turns' tags, so a summary's tags are a superset of
  its sources'. Then each tag touched by the batch gets its one tag summary rebuilt (only
  those: the others are not stale). Raw turns are never changed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Literal, TypeVar

from pydantic import BaseModel, ConfigDict

from contextfold import telemetry
from contextfold.errors import ConfigError
from contextfold.memory.rules import TagRules
from contextfold.memory.summarize import Summarizer
from contextfold.store.models import NewSegment, StoredTurn
from contextfold.store.protocols import MemoryStorage

__all__ = [
    "MIN_HISTORY_SHARE",
    "CompactionReport",
    "Compactor",
    "Level",
    "TokenMonitor",
    "segment_turns",
]

Level = Literal["none", "soft", "hard"]
_T = TypeVar("_T")


#: The least share of the window the history is given room for (``TokenMonitor.room``): fixed
#: parts as large as the window or larger do not make every exchange compact.
MIN_HISTORY_SHARE = 0.1


class TokenMonitor:
    """Two thresholds over the room a context window leaves the history: ``level(tokens,
    fixed)`` is "hard" at or above ``hard * room``, "soft" at or above ``soft * room``, else
    "none"; ``room`` is the window less the ``fixed`` tokens each request carries besides its
    history (none by default: the whole window), at least ``MIN_HISTORY_SHARE`` of it.

    >>> TokenMonitor(1000).level(720)
    'soft'
    >>> TokenMonitor(1000).level(300, fixed=600)  # 400 left for the history: 70 % is 280
    'soft'
    """

    def __init__(self, context_window: int, *, soft: float = 0.70, hard: float = 0.85) -> None:
        if context_window <= 0:
            raise ConfigError(f"context_window must be positive, got {context_window}")
        if not 0 < soft <= hard <= 1:
            raise ConfigError(f"thresholds need 0 < soft <= hard <= 1, got soft={soft} hard={hard}")
        self.context_window = context_window
        self.soft = soft
        self.hard = hard

    def __repr__(self) -> str:
        return f"TokenMonitor({self.context_window}, soft={self.soft}, hard={self.hard})"

    def room(self, fixed: int = 0) -> float:
        """What the window leaves the history beside ``fixed`` tokens (at least
        ``MIN_HISTORY_SHARE`` of the window)."""
        window = self.context_window
        return max(window - fixed, window * MIN_HISTORY_SHARE) if fixed > 0 else window

    def level(self, tokens: int, fixed: int = 0) -> Level:
        """The threshold ``tokens`` of live history cross, beside ``fixed`` tokens."""
        room = self.room(fixed)
        if tokens >= self.hard * room:
            return "hard"
        if tokens >= self.soft * room:
            return "soft"
        return "none"


class CompactionReport(BaseModel):
    """What one compaction did. ``tokens_freed`` = the compacted turns' tokens minus their
    segment summaries' tokens (what leaves the live window)."""

    model_config = ConfigDict(frozen=True)
    session_id: str
    level: Level
    turns_compacted: int
    segments_compacted: int
    tokens_compacted: int
    summary_tokens: int
    tokens_freed: int
    watermark_before: int
    watermark_after: int
    segment_ids: tuple[int, ...]
    tag_summaries_rebuilt: tuple[str, ...]
    duration_ms: float


def _chain_open(turns: Sequence[StoredTurn]) -> bool:
    """Whether a tool call among ``turns`` still waits for its result."""
    pending: set[str] = set()
    for turn in turns:
        pending.update(turn.message.tool_use_ids)
        pending.difference_update(turn.message.tool_result_ids)
    return bool(pending)


def segment_turns(
    turns: Sequence[StoredTurn], *, max_tokens: int = 2000, window: int = 2
) -> list[list[StoredTurn]]:
    """Contiguous topic groups: a turn joins the running group when its tags overlap the tags
    of the group's last ``window`` turns, when it has no tags, when it answers (assistant or
    tool role) the group's last turn, or when a tool call of the group awaits its result; a
    group closes at ``max_tokens`` unless a tool chain is open.

    >>> from contextfold.items import Message
    >>> from datetime import datetime
    >>> def t(seq, tags, role="user"):
    ...     return StoredTurn(session_id="s", seq=seq, message=Message(role=role, content="x"),
    ...         created_at=datetime(2024, 1, 1), content_hash="h", token_count=1,
    ...         tags=dict.fromkeys(tags, 1.0))
    >>> groups = segment_turns([t(1, ["db"]), t(2, ["db"], "assistant"), t(3, ["css"])])
    >>> [[turn.seq for turn in g] for g in groups]
    [[1, 2], [3]]
    """
    groups: list[list[StoredTurn]] = []
    tokens = 0
    for turn in turns:
        if groups:
            group = groups[-1]
            recent = {tag for t in group[-window:] for tag in t.tags}
            open_chain = _chain_open(group)
            joins = (
                open_chain
                or not turn.tags
                or turn.message.role in ("tool",)
                or bool(recent & turn.tags.keys())
                or (turn.message.role == "assistant" and group[-1].message.role == "user")
            )
            if joins and (tokens + turn.token_count <= max_tokens or open_chain):
                group.append(turn)
                tokens += turn.token_count
                continue
        groups.append([turn])
        tokens = turn.token_count
    return groups


def _segment_tags(group: Sequence[StoredTurn]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    weights: dict[str, float] = {}
    for turn in group:
        for tag, weight in turn.tags.items():
            weights[tag] = weights.get(tag, 0.0) + weight
    tags = tuple(sorted(weights, key=lambda t: (-weights[t], t)))
    related = tuple(
        dict.fromkeys(r for turn in group for r in turn.related_tags if r not in weights)
    )
    return tags, related


class Compactor:
    """Greedy-batch compaction of one session (see the module docstring).

    ``summary_ratio`` sets each segment summary's budget as a share of the segment's tokens
    (at least ``min_summary_tokens``); ``tag_summary_tokens`` caps each tag summary."""

    def __init__(
        self,
        store: MemoryStorage,
        summarizer: Summarizer,
        monitor: TokenMonitor,
        *,
        protected_recent: int = 6,
        rules: TagRules | None = None,
        summary_ratio: float = 0.3,
        min_summary_tokens: int = 48,
        tag_summary_tokens: int = 200,
        max_segment_tokens: int = 2000,
        max_concurrent: int = 4,
    ) -> None:
        if protected_recent < 0:
            raise ConfigError(f"protected_recent must be >= 0, got {protected_recent}")
        self.store = store
        self.summarizer = summarizer
        self.monitor = monitor
        self.protected_recent = protected_recent
        self.rules = rules if rules is not None else TagRules([])
        self.summary_ratio = summary_ratio
        self.min_summary_tokens = min_summary_tokens
        self.tag_summary_tokens = tag_summary_tokens
        self.max_segment_tokens = max_segment_tokens
        self.max_concurrent = max(1, max_concurrent)
        # Called with the session's id after each compaction (its writes all done): the engine
        # reads again there what the compaction changed and the next recall reads.
        self.on_compacted: Callable[[str], None] | None = None

    def __repr__(self) -> str:
        return f"Compactor({self.monitor!r}, protected_recent={self.protected_recent})"

    def level(self, session_id: str, fixed: int = 0) -> Level:
        """The threshold the session's live turns cross beside ``fixed`` tokens
        (``TokenMonitor.level``)."""
        return self.monitor.level(self.store.active_tokens(session_id), fixed)

    def maybe_compact(
        self,
        session_id: str,
        *,
        upto: int | None = None,
        live_tokens: int | None = None,
        fixed: int = 0,
    ) -> CompactionReport | None:
        """Compact when the live turns cross a threshold; ``None`` when they do not (or when
        nothing outside the protected turns is left to compact). ``upto``: compact no turn
        past this seq (the turns after it are not tagged yet). ``live_tokens``: the live
        turns' tokens when the caller has just read them (``MemoryStorage.begin_derive``).
        ``fixed``: what each request carries besides them (the engine's
        ``note_fixed_tokens``): the thresholds are shares of what the window leaves the
        history beside it (``TokenMonitor.level``)."""
        level = (
            self.level(session_id, fixed)
            if live_tokens is None
            else self.monitor.level(live_tokens, fixed)
        )
        if level == "none":
            return None
        return self.compact(session_id, level=level, upto=upto)

    def _batch(self, session_id: str, upto: int | None = None) -> list[StoredTurn]:
        watermark = max(self.store.session(session_id).compaction_watermark, 1)
        live = self.store.turns(session_id, start=watermark)
        end = max(0, len(live) - self.protected_recent)
        if upto is not None:
            end = min(end, max(0, upto - watermark + 1))
        # Never end the batch inside a tool chain: a call and its result compact together.
        while end > 0 and _chain_open(live[:end]):
            end -= 1
        return live[:end]

    def compact(
        self, session_id: str, *, level: Level = "soft", upto: int | None = None
    ) -> CompactionReport | None:
        """Compact everything between the watermark and the protected recent turns now (no
        turn past ``upto`` when given; ``None`` when that is nothing)."""
        started = time.perf_counter()
        before = self.store.session(session_id).compaction_watermark
        batch = self._batch(session_id, upto)
        if not batch:
            return None
        groups = segment_turns(batch, max_tokens=self.max_segment_tokens)
        summaries = self._map(self._summarize_group, groups)
        segments = []
        for group, summary in zip(groups, summaries, strict=True):
            tags, related = _segment_tags(group)
            segments.append(
                NewSegment(
                    first_seq=group[0].seq,
                    last_seq=group[-1].seq,
                    summary=summary,
                    full_text="\n".join(t.message.text() for t in group),
                    tags=tags,
                    related_tags=related,
                    summary_tokens=self.store.counter.count(summary),
                    full_tokens=sum(t.token_count for t in group),
                )
            )
        after = batch[-1].seq + 1
        ids = self.store.compact(session_id, segments, after)
        rebuilt = self.rebuild_tag_summaries(
            session_id, {tag for seg in segments for tag in seg.tags}
        )
        compacted = sum(t.token_count for t in batch)
        summary_tokens = sum(seg.summary_tokens or 0 for seg in segments)
        report = CompactionReport(
            session_id=session_id,
            level=level,
            turns_compacted=len(batch),
            segments_compacted=len(ids),
            tokens_compacted=compacted,
            summary_tokens=summary_tokens,
            tokens_freed=compacted - summary_tokens,
            watermark_before=before,
            watermark_after=after,
            segment_ids=tuple(ids),
            tag_summaries_rebuilt=tuple(rebuilt),
            duration_ms=(time.perf_counter() - started) * 1000,
        )
        telemetry.record_compaction(report)
        if self.on_compacted is not None:
            self.on_compacted(session_id)
        return report

    def _map(self, fn: Callable[[_T], str], items: Sequence[_T]) -> list[str]:
        """``fn`` over ``items`` in order: concurrently for a summarizer that waits on a
        model (``concurrent = True``), in this thread for a CPU-bound one (the GIL would only
        add overhead)."""
        if self.max_concurrent > 1 and getattr(self.summarizer, "concurrent", False):
            with ThreadPoolExecutor(self.max_concurrent) as pool:
                return list(pool.map(fn, items))
        return [fn(item) for item in items]

    def _summarize_group(self, group: Sequence[StoredTurn]) -> str:
        tags, _ = _segment_tags(group)
        tokens = sum(t.token_count for t in group)
        budget = max(self.min_summary_tokens, int(tokens * self.summary_ratio))
        prompt = self.rules.for_tag(tags[0]).summary_prompt if tags else None
        texts = [t.message.text() for t in group]
        return self.summarizer.summarize(texts, max_tokens=budget, tags=tags, instructions=prompt)

    def rebuild_tag_summaries(self, session_id: str, tags: set[str] | None = None) -> list[str]:
        """Rebuild the tag summary of each tag in ``tags`` (default: every tag with segments
        its summary has not taken in, or with no summary yet); returns the tags rebuilt (a
        tag whose summary another process stored meanwhile is left to that one).

        Rebuilds roll forward: the input is the tag's current summary plus the summaries of
        its segments compacted after that summary's watermark (earliest first), so each
        compaction costs what it added, not the whole history again. A tag with no summary
        yet starts from all of its segments. Input already within ``tag_summary_tokens`` is
        stored as is."""
        # Only the segments each tag's summary has not taken in (their summaries, not their
        # full text), read with the summary itself in one snapshot: another process rolling
        # the same summary forward in between cannot make a segment count twice or be lost.
        since = self.store.paging.segments_since_summary(
            session_id, None if tags is None else sorted(tags)
        )
        todo = sorted(since)

        def build(tag: str) -> str:
            read = since[tag]
            parts = [*([] if read.summary is None else [read.summary]), *read.segments]
            # One text per line: an extractive summary's lines each carry their own speaker.
            texts = [line for part in parts for line in part.splitlines() if line.strip()]
            joined = "\n".join(texts)
            if self.store.counter.count(joined) <= self.tag_summary_tokens:
                return joined  # already short enough: nothing to summarise
            rule = self.rules.for_tag(tag)
            return self.summarizer.summarize(
                texts,
                max_tokens=self.tag_summary_tokens,
                tags=(tag,),
                instructions=rule.summary_prompt,
            )

        texts = self._map(build, todo)
        rebuilt = []
        for tag, text in zip(todo, texts, strict=True):
            # It covers the newest segment it read; stored only if the summary it rolled
            # forward is still the one stored (else another process stored a newer one).
            read = since[tag]
            if self.store.paging.upsert_tag_summary(
                session_id, tag, text, read.last_seq, replaces=read.source_watermark
            ):
                rebuilt.append(tag)
        return rebuilt
