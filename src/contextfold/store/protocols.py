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
- *Incarnations.* A session gets an incarnation when it is created (``create_session``,
  ``fork``, ``load_session``): an integer from a store-wide counter that only grows, across
  every process sharing the store and whatever their clocks, so a session deleted and created
  again under its id has a new, larger one. A reader that keeps what it read of a session
  (``turn_keys``, ``TurnKeys``) compares it to tell a rewrite from turns appended
  (``turn_texts_with_incarnation``).
- *Scoping.* A session belongs to one principal (the keyed hash of the credential that wrote
  it, ``''`` for the library's own). Lookups by content (``turns_with_key``,
  ``latest_session``) never cross principals.
- *Branch ancestry.* ``fork(session, upto)`` makes a session whose turns are its parent's
  ``1..upto`` with their tags, vectors and wholly-contained segments, and nothing the parent
  said later; ``SessionRecord.parent_id``/``fork_seq`` record where it came from.
- *Work items.* Jobs are claimed by one worker at a time across every process sharing the
  store (``claim_job``): a running job whose lease has passed, or whose owner is gone, is
  claimed again; at most one job of a kind is pending per session.
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
        """The stored session; ``ConfigError`` when there is none."""
        ...

    def sessions(self) -> list[str]: ...

    def delete_session(self, session_id: str) -> bool:
        """Delete the session and everything stored for it (its cost rows stay, detached)."""
        ...

    def principal_of(self, session_id: str) -> str | None: ...

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

    def turn_texts_with_incarnation(
        self, session_id: str, after: int
    ) -> tuple[int | None, list[tuple[int, str, str, str]]]:
        """The session's incarnation and ``turn_texts_after(session_id, after)``, read in one
        snapshot (one query where the backend can): ``(None, [])`` when there is no such
        session. ``TurnKeys`` calls it on every request, with ``after`` its last known seq: a
        changed incarnation means the session was deleted and created again since."""
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

    def fork(self, session_id: str, upto: int, *, session_id_new: str | None = None) -> str:
        """A new branch holding the turns ``1..upto`` of ``session_id``; its id. ``ConfigError``
        (nothing written) when the session or the turn is missing ("unknown session", "no
        turn"), or when ``session_id_new`` exists already ("already exists", as
        ``create_session``)."""
        ...

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

    # -- moving whole sessions (migration, export) ---------------------------------------------

    def dump_session(self, session_id: str) -> SessionDump:
        """Everything stored for the session (``KeyError`` when there is none)."""
        ...

    def load_session(self, dump: SessionDump) -> None:
        """Write a dumped session as it was: the same id, seqs, hashes, times, tags,
        watermark, branch and derived seq (``ConfigError`` when the id exists)."""
        ...
