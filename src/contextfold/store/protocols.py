"""The storage interfaces: what the engine, retrieval, graph and server code may ask of a store.

Every backend (``store/sqlite/``: the embedded default; ``store/postgres/``: many processes
and hosts sharing one database) implements these Protocols, and the conformance suite under
``tests/store/`` runs unchanged against each. The invariants below are the contract: a
backend that breaks one fails the suite.

**Memory store invariants** (``MemoryStorage``):

- *Raw turns are append-only.* A turn is never updated; seqs run 1, 2, 3 … per session with
  no gap; ``content_hash`` is the SHA-256 of the message's canonical JSON. Only
  ``delete_session`` removes turns (all of one session's, with everything derived).
- *Atomic writes.* ``append_turns``, ``commit_exchange`` (turns + their ``derive`` job),
  ``compact`` (segments + watermark) and ``set_tags_many`` are each one transaction: after a
  crash a reader sees all of it or none of it. ``batch()`` makes several writes one.
- *Ids are never reused.* Session ids are unique for the store's life; segment and job ids
  only grow. ``commit_exchange(expect_last=n)`` raises ``BranchMoved`` instead of appending
  when another writer moved the session past ``n`` (optimistic concurrency across processes).
- *Scoping.* A session belongs to one principal (the keyed hash of the credential that wrote
  it, ``''`` for the library's own). Lookups by content (``turns_with_key``,
  ``latest_session``) never cross principals.
- *Branch ancestry.* ``fork(session, upto)`` makes a session whose turns are its parent's
  ``1..upto`` with their tags, vectors and wholly-contained segments, and nothing the parent
  said later; ``SessionRecord.parent_id``/``fork_seq`` record where it came from.
- *Work items.* Jobs are claimed by one worker at a time across every process sharing the
  store (``claim_job``): a running job whose lease has passed, or whose owner is gone, is
  claimed again; at most one job of a kind is pending per session.
- *Generations.* ``session_version`` is ``(born, generation)``, numbers drawn from one
  store-wide increasing counter: ``born`` when the session row is made (``create_session``,
  ``fork``, ``load_session``: a session deleted and written again under the same id gets a new
  one), ``generation`` then and again on every write that changes the session's derived state
  in place — its turn tags (``tag_turn``, ``set_turn_tags``, ``set_tags_many``), segments and
  watermark (``compact``), tag summaries. Appends (turns, vectors) draw nothing. A process
  caching anything of a session keys it by these, so another process's writes never leave it
  stale.
- *Request records* (the dashboard's, ``put_records``): upserted by id, each write drawing a
  new store-wide ``change``; the newest ``keep`` by first write, and at most ``max_bytes`` of
  bodies, are kept.
- *Ranking is the backend's to keep identical.* ``search_turns``/``search_segments`` score
  with the same BM25 (FTS5's: k1 1.2, b 0.75, the whole table's statistics) over the same
  terms (``store.text.query_terms``; Porter-stemmed ``unicode61`` tokens), so a recall gives
  the same answer whichever backend holds the conversation.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from contextfold.items import Message
from contextfold.store.models import (
    CostEntry,
    CostReport,
    Depth,
    Job,
    NewSegment,
    SessionDump,
    SessionRecord,
    StoredRecord,
    StoredSegment,
    StoredTurn,
    TagSummary,
    TurnRow,
    WorkingSetEntry,
)
from contextfold.tokens import TokenCounter

__all__ = ["MemoryStorage"]


@runtime_checkable
class MemoryStorage(Protocol):
    """Conversation memory: sessions, raw turns and everything derived from them."""

    #: Where the store lives, as given (a file path, ``":memory:"`` or a database URL with
    #: its password masked).
    path: str
    #: Counts each turn's text once, when it is appended.
    counter: TokenCounter

    def close(self) -> None: ...

    def batch(self) -> AbstractContextManager[Any]:
        """One transaction around several writes of this thread: all of them or none."""
        ...

    # -- sessions ------------------------------------------------------------------------------

    def create_session(
        self,
        session_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        *,
        principal: str = "",
    ) -> str:
        """A new session (a random id when none is given); ``ConfigError`` when the id exists."""
        ...

    def session(self, session_id: str) -> SessionRecord:
        """The stored session; ``KeyError`` when there is none."""
        ...

    def sessions(self) -> list[str]: ...

    def delete_session(self, session_id: str) -> bool:
        """Delete the session and everything stored for it (its cost rows stay, detached)."""
        ...

    def principal_of(self, session_id: str) -> str | None: ...

    def session_version(self, session_id: str) -> tuple[int, int] | None:
        """``(born, generation)`` of the session (see the module docstring), ``None`` when
        there is none: one indexed read, for the caches of every process to check. Read
        inside ``batch()`` it holds until the batch ends: no other writer changes the session
        in between (``MemoryEngine`` updates its cached vocabulary by it; SQLite's
        ``BEGIN IMMEDIATE`` gives that, a server database locks the session's row)."""
        ...

    def latest_session(self, principal: str) -> tuple[str, int] | None:
        """(session, last seq) of the principal's conversation that stored a turn last."""
        ...

    # -- raw turns -----------------------------------------------------------------------------

    def last_seq(self, session_id: str) -> int: ...

    def append_turns(
        self,
        session_id: str,
        messages: Sequence[Message],
        *,
        timestamps: Sequence[datetime] | None = None,
        partial: Sequence[bool] | None = None,
    ) -> list[int]:
        """Append turns in one transaction; their seqs, consecutive after the last one."""
        ...

    def commit_exchange(
        self,
        session_id: str,
        messages: Sequence[Message],
        *,
        partial: Sequence[bool] | None = None,
        expect_last: int | None = None,
    ) -> list[int]:
        """Append ``messages`` and queue the session's ``derive`` job in one transaction;
        ``BranchMoved`` when ``expect_last`` is given and the session's last seq differs."""
        ...

    def turns(
        self, session_id: str, start: int | None = None, end: int | None = None
    ) -> list[StoredTurn]: ...

    def turn_rows(self, session_id: str, seqs: Sequence[int]) -> dict[int, TurnRow]: ...

    def turn_times(self, session_id: str, seqs: Sequence[int]) -> dict[int, datetime]: ...

    def turn_token_counts(self, session_id: str, seqs: Sequence[int]) -> dict[int, int]: ...

    def turn_texts_after(self, session_id: str, after: int) -> list[tuple[int, str, str, str]]:
        """(seq, role, text, content hash) of the turns after ``after``, in order."""
        ...

    def turn_hash(self, session_id: str, seq: int) -> str | None: ...

    def turn_keys(self, session_id: str, lo: int, hi: int) -> dict[int, str]:
        """seq -> match key of the turns with ``lo <= seq <= hi``; correct when another
        process has appended, or deleted and rewritten the session, since the last call."""
        ...

    def turns_with_key(
        self, principal: str, key: str, *, session_id: str | None = None, limit: int = 20
    ) -> list[tuple[str, int]]:
        """(session, seq) of the principal's turns with match key ``key``, newest first."""
        ...

    def active_tokens(self, session_id: str) -> int:
        """Tokens of the session's turns at or above its compaction watermark."""
        ...

    def fork(self, session_id: str, upto: int, *, session_id_new: str | None = None) -> str: ...

    # -- tags ----------------------------------------------------------------------------------

    def tag_turn(self, session_id: str, seq: int, tag: str, weight: float = 1.0) -> None: ...

    def set_turn_tags(
        self,
        session_id: str,
        seq: int,
        tags: Mapping[str, float],
        related: Sequence[str] = (),
    ) -> None: ...

    def set_tags_many(
        self,
        session_id: str,
        tagged: Mapping[int, tuple[Mapping[str, float], Sequence[str]]],
    ) -> None: ...

    def tag_counts(
        self, session_id: str, *, before: int | None = None, since: int | None = None
    ) -> dict[str, int]: ...

    def turns_tagged(
        self, session_id: str, tags: Sequence[str]
    ) -> dict[int, list[tuple[str, bool]]]: ...

    def tag_overlap_scores(
        self, session_id: str, weights: Mapping[str, tuple[float, float]]
    ) -> dict[int, float]: ...

    def tag_overlap_top(
        self, session_id: str, weights: Mapping[str, tuple[float, float]], limit: int
    ) -> tuple[list[tuple[int, float]], float]: ...

    def tag_last_seen(
        self, session_id: str, tags: Sequence[str] | None = None
    ) -> dict[str, datetime]: ...

    # -- vectors -------------------------------------------------------------------------------

    def turns_without_vectors(
        self, session_id: str, model: str, *, after: int = 0
    ) -> list[tuple[int, str]]: ...

    def last_vector_seq(self, session_id: str, model: str) -> int: ...

    def add_turn_vectors(
        self, session_id: str, model: str, seqs: Sequence[int], vectors: npt.NDArray[Any]
    ) -> None: ...

    def turn_vectors(
        self, session_id: str, model: str, *, after: int = 0
    ) -> tuple[list[int], npt.NDArray[np.float32]]: ...

    # -- full text -----------------------------------------------------------------------------

    def search_turns(
        self, session_id: str, query: str, limit: int = 10
    ) -> list[tuple[StoredTurn, float]]:
        """Turns matching any of ``query_terms(query)``, best first (higher score is better;
        ties by seq)."""
        ...

    def search_turn_seqs(
        self, session_id: str, query: str, limit: int = 10
    ) -> list[tuple[int, float]]: ...

    def search_segments(
        self, session_id: str, query: str, limit: int = 10
    ) -> list[tuple[StoredSegment, float]]: ...

    # -- compaction ----------------------------------------------------------------------------

    def compact(
        self,
        session_id: str,
        segments: Sequence[NewSegment],
        watermark: int,
        *,
        _before_commit: Callable[[], None] | None = None,
    ) -> list[int]:
        """Store ``segments`` and move the watermark in one transaction; raw turns untouched."""
        ...

    def segments(self, session_id: str) -> list[StoredSegment]: ...

    def upsert_tag_summary(
        self,
        session_id: str,
        tag: str,
        summary: str,
        source_watermark: int,
        *,
        tokens: int | None = None,
    ) -> None: ...

    def tag_summaries(self, session_id: str) -> dict[str, TagSummary]: ...

    # -- aliases, working set, costs -----------------------------------------------------------

    def set_alias(self, alias: str, canonical: str) -> None: ...

    def aliases(self) -> dict[str, str]: ...

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

    # -- jobs ----------------------------------------------------------------------------------

    def mark_derived(self, session_id: str, seq: int) -> None: ...

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

    # -- request records (the dashboard's, from every process) --------------------------------

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

    # -- Responses API chains ------------------------------------------------------------------

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

    # -- moving whole sessions (migration, export) ---------------------------------------------

    def dump_session(self, session_id: str) -> SessionDump:
        """Everything stored for the session (``KeyError`` when there is none)."""
        ...

    def load_session(self, dump: SessionDump) -> None:
        """Write a dumped session as it was: the same id, seqs, hashes, times, tags,
        watermark, branch and derived seq (``ConfigError`` when the id exists)."""
        ...
