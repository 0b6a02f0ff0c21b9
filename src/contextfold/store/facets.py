"""The facets of the memory store: the parts of ``MemoryStorage`` that the hot paths do not
use together with its sessions and turns, each a Protocol of its own that the store exposes as
an attribute — ``store.records``, ``store.vocab``, ``store.jobs``, ``store.costs``,
``store.paging`` and ``store.transfer``.

A backend implements each facet as a class of its own over the connection (or pool) it shares
with the store; the facet classes do not inherit from the store nor from each other, and what
one needs of another part of the store is passed to it when it is made.

>>> from contextfold.tokens import CharCounter
>>> from contextfold.store.sqlite.memory import MemoryStore
>>> store = MemoryStore(counter=CharCounter())
>>> store.vocab.set_alias("k8s", "kubernetes")
>>> store.vocab.aliases(), store.jobs.pending_jobs()
({'k8s': 'kubernetes'}, 0)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from datetime import datetime
from typing import Literal, Protocol, runtime_checkable

from contextfold.store.models import (
    CostEntry,
    CostReport,
    Depth,
    Job,
    SessionDump,
    StoredRecord,
    TagRollForward,
    TagSummary,
    WorkingSetEntry,
)

__all__ = [
    "CostStorage",
    "JobStorage",
    "PagingStorage",
    "RecordStorage",
    "TransferStorage",
    "VocabularyStorage",
]


@runtime_checkable
class RecordStorage(Protocol):
    """``MemoryStorage.records``: the request records the dashboard reads (written by every
    process) and the Responses API's response links."""

    def put_records(
        self,
        records: Sequence[tuple[str, str, str]],
        *,
        origin: str,
        keep: int = 500,
        max_bytes: int = 16 * 1024 * 1024,
    ) -> None:
        """Write ``(id, session_id, body)`` records in one transaction (an id already stored
        is replaced, keeping its place), each drawing a new ``change``; then drop the oldest
        (by first write) past the newest ``keep`` or past ``max_bytes`` of bodies (the newest
        one always stays)."""
        ...

    def recent_records(
        self, limit: int = 500, *, session_id: str | None = None
    ) -> list[StoredRecord]:
        """The newest records (by first write), newest first; one session's when given."""
        ...

    def record(self, record_id: str) -> StoredRecord | None: ...

    def records_after(self, change: int, *, limit: int = 1000) -> list[StoredRecord]:
        """Records written (or rewritten) after ``change``, in the order of their changes."""
        ...

    def records_cursor(self) -> int:
        """The latest ``change`` drawn (0 when none): where a poll of ``records_after``
        starts."""
        ...

    def put_response_link(
        self, principal: str, name: str, session_id: str, seq: int, start: int
    ) -> None:
        """Remember that the principal's response id (or ``conversation:<id>``) ``name``
        names the stored turn ``(session_id, seq)``, its chain starting at ``start``
        (replacing what the name named before; deleted with the session)."""
        ...

    def response_link(self, principal: str, name: str) -> tuple[str, int, int] | None:
        """``(session_id, seq, start)`` that ``put_response_link`` stored for the name."""
        ...


@runtime_checkable
class VocabularyStorage(Protocol):
    """``MemoryStorage.vocab``: tag aliases (store-wide or per session), the tags the splitter
    examined and the related-tag counts."""

    def set_alias(self, alias: str, canonical: str, *, session_id: str | None = None) -> None:
        """``alias`` → ``canonical`` in every session, or only in ``session_id``
        (``ConfigError`` when there is no such session)."""
        ...

    def aliases(self, session_id: str | None = None) -> dict[str, str]:
        """The store-wide aliases, or only the ones scoped to ``session_id``."""
        ...

    def remove_alias(self, alias: str, *, session_id: str | None = None) -> bool:
        """Remove a store-wide (or ``session_id``-scoped) alias; whether it existed."""
        ...

    def record_split(self, session_id: str, tag: str, sub_tags: Sequence[str]) -> bool:
        """Record that the splitter examined ``tag`` and split it into ``sub_tags`` (none: kept
        as it is). Once per tag: ``False``, nothing written, when it was recorded already."""
        ...

    def tag_splits(self, session_id: str) -> dict[str, tuple[str, ...]]:
        """Every tag the splitter examined in the session with its sub-tags."""
        ...

    def related_tag_counts(self, session_id: str) -> dict[str, int]:
        """How many of the session's turns carry each related tag."""
        ...


@runtime_checkable
class JobStorage(Protocol):
    """``MemoryStorage.jobs``: the queue of derived work that every process shares (see the
    *Work items* invariant of ``MemoryStorage``)."""

    def enqueue_job(self, session_id: str, kind: str = "derive") -> None: ...

    def drop_pending_job(self, session_id: str, kind: str = "derive") -> None: ...

    def claim_job(
        self, owner: str, *, lease: float = 60.0, skip: AbstractSet[str] = frozenset()
    ) -> Job | None:
        """The oldest claimable job (pending, or running past its lease), now ``owner``'s;
        two workers never hold one job at once, whichever processes they run in."""
        ...

    def finish_job(self, job_id: int, owner: str | None = None) -> bool: ...

    def fail_job(
        self, job_id: int, error: str, *, retry: bool = True, owner: str | None = None
    ) -> bool: ...

    def release_jobs(self, owner: str) -> int: ...

    def release_jobs_of_dead(self, alive: Callable[[int], bool] | None = None) -> int: ...

    def pending_jobs(self) -> int: ...

    def job_counts(self) -> dict[str, int]: ...


@runtime_checkable
class CostStorage(Protocol):
    """``MemoryStorage.costs``: the log of LLM calls with their cost."""

    def log_cost(
        self,
        session_id: str | None,
        kind: str,
        model: str,
        prompt_tokens: int,
        completion_tokens: int,
        cost_usd: float,
        *,
        at: datetime | None = None,
    ) -> None: ...

    def cost_report(self, session_id: str | None = None) -> CostReport: ...

    def cost_entries(self) -> list[CostEntry]:
        """The whole cost log, oldest first."""
        ...


@runtime_checkable
class PagingStorage(Protocol):
    """``MemoryStorage.paging``: the one summary per tag and each session's working set (the
    topics paged in, at which depth)."""

    def upsert_tag_summary(
        self,
        session_id: str,
        tag: str,
        summary: str,
        source_watermark: int,
        *,
        tokens: int | None = None,
        replaces: int | Literal["any"] | None = "any",
    ) -> bool:
        """Store the one summary of ``tag``, covering its turns up to ``source_watermark``;
        whether it was stored. ``replaces`` makes the write a compare-and-set: it happens only
        while the stored summary's ``source_watermark`` is still ``replaces`` (``None``: while
        the tag has no summary), so a roll-forward that read an older summary than another
        process has since stored leaves that one in place. ``"any"`` writes unconditionally."""
        ...

    def tag_summaries(
        self, session_id: str, tags: Sequence[str] | None = None
    ) -> dict[str, TagSummary]:
        """The tag summaries by tag (only those of ``tags`` when given)."""
        ...

    def segments_since_summary(
        self, session_id: str, tags: Sequence[str] | None = None
    ) -> dict[str, TagRollForward]:
        """What each tag's summary has not taken in yet, by tag: for each tag a segment
        carries (only those of ``tags`` when given), its summary as stored and the summaries
        of its segments whose ``last_seq`` is past that summary's ``source_watermark`` (all of
        its segments when it has no summary), earliest first, with the largest ``last_seq``
        among them; a tag with none is left out. One consistent read (one statement): the
        summary and the segments are as they stood at one moment, so a roll-forward from them
        takes each segment once. Which tags have some is known from per-tag counters (the
        newest segment's ``last_seq`` beside the summary's watermark), without reading any
        segment; then only those tags' newer segments are read, their summaries only, not
        their full text (a compaction's read, ``docs/memory.md``)."""
        ...

    def set_working_set(
        self,
        session_id: str,
        tag: str,
        depth: Depth,
        tokens: int,
        *,
        last_used: datetime | None = None,
    ) -> None: ...

    def working_set(self, session_id: str) -> dict[str, WorkingSetEntry]: ...


@runtime_checkable
class TransferStorage(Protocol):
    """``MemoryStorage.transfer``: whole sessions moved as they were (``contextfold store
    migrate``, the markdown export)."""

    def dump_session(self, session_id: str) -> SessionDump:
        """Everything stored for the session (``KeyError`` when there is none)."""
        ...

    def load_session(self, dump: SessionDump) -> None:
        """Write a dumped session as it was: the same id, seqs, hashes, times, tags,
        watermark, branch and derived seq (``ConfigError`` when the id exists)."""
        ...
