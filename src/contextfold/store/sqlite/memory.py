"""The conversation-memory store: sessions, raw turns and everything derived from them, in SQLite.

Raw turns are append-only and content-hashed: no method updates or deletes one, and triggers
refuse an ``UPDATE`` or ``DELETE`` of a turn from anywhere — except ``delete_session``, which
marks its session in the ``turn_deletions`` guard table for the length of its transaction.
Everything else (tags, segments, tag summaries, the working set) is derived and may be rebuilt.

Compaction is one transaction: ``compact`` inserts the new segments and moves the session's
``compaction_watermark`` (turns with ``seq`` below it are compacted) together, so a crash at any
point leaves the old state or the new one, and never touches a raw turn.

Turn text and segment summaries are indexed by FTS5 external-content tables (porter stemming),
kept in sync by triggers; ``search_turns`` and ``search_segments`` rank with ``bm25()``.

The store is the core (``MemoryStorage``) and its facets (``store/facets.py``), each a class
over the store's connections (``memory_db.MemoryDb``), by responsibility over these modules:

- ``memory.py`` — ``MemoryStore``: sessions, raw turns, tags, turn vectors, turn search, and
  its facets as attributes;
- ``memory_segments.py`` — compaction, segments and segment search (``SqliteSegments``, a
  part of the core: the store's methods of these names call it);
- ``memory_branches.py`` — principals, branches (forks) and exchanges committed with their
  derive job (``SqliteBranches``, a part of the core as well);
- ``memory_jobs.py`` — the jobs table (``store.jobs``: ``SqliteJobs``);
- ``memory_state.py`` — tag summaries and the working set (``store.paging``:
  ``SqlitePaging``), the cost log (``store.costs``: ``SqliteCosts``);
- ``memory_vocab.py`` — aliases (store-wide and per session), tag splits, related-tag counts
  (``store.vocab``: ``SqliteVocab``);
- ``memory_transfer.py`` — whole sessions dumped and loaded as they were (``store.transfer``:
  ``SqliteTransfer``; ``contextfold store migrate`` and the markdown export);
- ``memory_records.py`` — the dashboard's request records and the Responses API's response
  links, shared by every process (``store.records``: ``SqliteRecords``);
- ``memory_db.py`` — ``MemoryDb``, the connections the store and its facets share, and the
  turn-writing helpers;
- ``memory_schema.py`` — ``MIGRATIONS``, the ordered ``m00N_…`` schema migrations;
- ``store/models.py`` — the row models (``StoredTurn``, ``NewSegment``, …) and ``Depth``;
- ``memory_fts.py`` — the FTS5 query built from free text (``store/text.query_terms``).

>>> from contextfold.items import Message
>>> from contextfold.tokens import CharCounter
>>> store = MemoryStore(counter=CharCounter())
>>> sid = store.create_session("demo")
>>> store.append_turns(sid, [Message(role="user", content="Deploy the API on Friday")])
[1]
>>> [turn.message.text() for turn, _ in store.search_turns(sid, "deploying")]
['Deploy the API on Friday']
"""

from __future__ import annotations

import json
import sqlite3
import uuid
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from contextfold.errors import ConfigError
from contextfold.items import Message
from contextfold.store.models import (
    CostReport,
    Depth,
    Job,
    NewSegment,
    PendingDerive,
    SessionRecord,
    StoredSegment,
    StoredTurn,
    TagSummary,
    TurnRow,
    WorkingSetEntry,
    _iso,
    _now,
    vector_matrix,
)
from contextfold.store.sqlite import memory_fts, select_in
from contextfold.store.sqlite.connection import pairs
from contextfold.store.sqlite.memory_branches import SqliteBranches
from contextfold.store.sqlite.memory_db import MemoryDb, insert_turns, last_seq, turn_rows
from contextfold.store.sqlite.memory_fts import _fts_query
from contextfold.store.sqlite.memory_jobs import SqliteJobs
from contextfold.store.sqlite.memory_records import SqliteRecords
from contextfold.store.sqlite.memory_schema import MIGRATIONS
from contextfold.store.sqlite.memory_schema import m001_create_memory as m001_create_memory
from contextfold.store.sqlite.memory_schema import m002_create_fts as m002_create_fts
from contextfold.store.sqlite.memory_schema import (
    m003_related_tags_and_vectors as m003_related_tags_and_vectors,
)
from contextfold.store.sqlite.memory_schema import (
    m004_session_scoped_fts as m004_session_scoped_fts,
)
from contextfold.store.sqlite.memory_segments import SqliteSegments
from contextfold.store.sqlite.memory_state import SqliteCosts, SqlitePaging
from contextfold.store.sqlite.memory_transfer import SqliteTransfer
from contextfold.store.sqlite.memory_vocab import SqliteVocab
from contextfold.tokens import TiktokenCounter, TokenCounter

__all__ = [
    "MIGRATIONS",
    "CostReport",
    "Depth",
    "Job",
    "MemoryStore",
    "NewSegment",
    "SessionRecord",
    "StoredSegment",
    "StoredTurn",
    "TagSummary",
    "TurnRow",
    "WorkingSetEntry",
]

# A turn's tags with their weights, and its related tags.
_TurnTags = tuple[dict[str, float], list[str]]


class MemoryStore:
    """Sessions, raw turns, tags, vectors and segments in one SQLite file (or ``":memory:"``),
    with the store's facets over the same connections: ``records``, ``vocab``, ``jobs``,
    ``costs``, ``paging`` and ``transfer``.

    ``counter`` counts each turn's text once, when it is appended (default ``cl100k_base``).

    >>> from contextfold.tokens import CharCounter
    >>> store = MemoryStore(counter=CharCounter())
    >>> sid = store.create_session()
    >>> hi, hello = Message(role="user", content="hi"), Message(role="assistant", content="hello")
    >>> store.append_turns(sid, [hi, hello])
    [1, 2]
    >>> [turn.seq for turn in store.turns(sid, start=2)]
    [2]
    """

    def __init__(
        self, path: str | Path = ":memory:", *, counter: TokenCounter | None = None
    ) -> None:
        self.path = str(path)
        self.counter: TokenCounter = (
            counter if counter is not None else TiktokenCounter("cl100k_base")
        )
        self._db = MemoryDb(self.path)
        MIGRATIONS.apply(self._db.conn)
        # The parts of the core kept in modules of their own, and the facets.
        self._segments = SqliteSegments(self._db, self.counter)
        self._branches = SqliteBranches(self._db, self)
        self.records = SqliteRecords(self._db)
        self.vocab = SqliteVocab(self._db)
        self.jobs = SqliteJobs(self._db)
        self.costs = SqliteCosts(self._db)
        self.paging = SqlitePaging(self._db, self.counter)
        self.transfer = SqliteTransfer(self._db, self)

    @property
    def _conn(self) -> sqlite3.Connection:
        """This thread's connection."""
        return self._db.conn

    def _tx(self) -> AbstractContextManager[sqlite3.Connection]:
        """A write transaction on this thread's connection (``MemoryDb.tx``)."""
        return self._db.tx()

    def close(self) -> None:
        self._db.close()

    # -- sessions -------------------------------------------------------------------------------

    def create_session(
        self,
        session_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        *,
        principal: str = "",
    ) -> str:
        """Create a session (a random id when none is given) and return its id. ``principal``
        scopes it to one caller (see ``memory_branches.py``)."""
        sid = session_id or uuid.uuid4().hex
        try:
            with self._tx() as conn:
                conn.execute(
                    "INSERT INTO sessions (id, created_at, metadata, principal)"
                    " VALUES (?, ?, ?, ?)",
                    (sid, _iso(_now()), json.dumps(dict(metadata or {})), principal),
                )
        except sqlite3.IntegrityError as exc:
            raise ConfigError(f"session {sid!r} already exists") from exc
        return sid

    def session(self, session_id: str) -> SessionRecord:
        row = self._conn.execute("SELECT * FROM sessions WHERE id = ?", (session_id,)).fetchone()
        if row is None:
            raise ConfigError(f"unknown session {session_id!r}; create it with create_session")
        return SessionRecord(
            id=row["id"],
            created_at=datetime.fromisoformat(row["created_at"]),
            metadata=json.loads(row["metadata"]),
            compaction_watermark=row["compaction_watermark"],
            principal=row["principal"],
            parent_id=row["parent_id"],
            fork_seq=row["fork_seq"],
            derived_seq=row["derived_seq"],
            born=row["born"],
            generation=row["generation"],
        )

    def session_version(self, session_id: str) -> tuple[int, int] | None:
        row = self._conn.execute(
            "SELECT born, generation FROM sessions WHERE id = ?", (session_id,)
        ).fetchone()
        return None if row is None else (int(row[0]), int(row[1]))

    def sessions(self) -> list[str]:
        return [r[0] for r in self._conn.execute("SELECT id FROM sessions ORDER BY created_at, id")]

    def delete_session(self, session_id: str) -> bool:
        """Delete a session and everything stored for it (its cost log rows are kept, detached).
        The only way raw turns are ever deleted. Returns whether the session existed."""
        with self._tx() as conn:
            conn.execute(
                "INSERT OR IGNORE INTO turn_deletions (session_id) VALUES (?)", (session_id,)
            )
            conn.execute("DELETE FROM turns WHERE session_id = ?", (session_id,))
            deleted = conn.execute("DELETE FROM sessions WHERE id = ?", (session_id,)).rowcount
            conn.execute("DELETE FROM turn_deletions WHERE session_id = ?", (session_id,))
        return bool(deleted)

    # -- turns ----------------------------------------------------------------------------------

    def batch(self) -> AbstractContextManager[sqlite3.Connection]:
        """One transaction around several writes (each write method joins it):
        ``with store.batch(): ...`` commits them together or not at all."""
        return self._tx()

    def last_seq(self, session_id: str) -> int:
        """The seq of the session's last turn (0 when it has none)."""
        return last_seq(self._conn, session_id)

    def append_turns(
        self,
        session_id: str,
        messages: Sequence[Message],
        *,
        timestamps: Sequence[datetime] | None = None,
        partial: Sequence[bool] | None = None,
    ) -> list[int]:
        """Append turns in one transaction; returns their seqs (consecutive, from 1 per session).
        ``timestamps`` (one per message) default to now; naive ones are taken as UTC.
        ``partial`` flags the turns that were cut off (a reply whose stream broke off)."""
        if timestamps is not None and len(timestamps) != len(messages):
            raise ConfigError(
                f"{len(messages)} messages need as many timestamps, got {len(timestamps)}"
            )
        self.session(session_id)
        rows = turn_rows(self.counter, messages, timestamps, partial)
        with self._tx() as conn:
            return insert_turns(conn, session_id, rows)

    def turns(
        self, session_id: str, start: int | None = None, end: int | None = None
    ) -> list[StoredTurn]:
        """The session's turns with ``start <= seq <= end`` (either bound optional), in order."""
        lo = start if start is not None else 1
        hi = end if end is not None else 2**62
        rows = self._conn.execute(
            "SELECT * FROM turns WHERE session_id = ? AND seq BETWEEN ? AND ? ORDER BY seq",
            (session_id, lo, hi),
        ).fetchall()
        tags = self._tags(session_id, lo, hi)
        return [self._turn(row, tags.get(row["seq"], ({}, []))) for row in rows]

    def _tags(self, session_id: str, lo: int, hi: int) -> dict[int, _TurnTags]:
        found: dict[int, _TurnTags] = {}
        for row in self._conn.execute(
            "SELECT seq, tag, weight, related FROM turn_tags WHERE session_id = ?"
            " AND seq BETWEEN ? AND ? ORDER BY seq, weight DESC, tag",
            (session_id, lo, hi),
        ):
            tags, related = found.setdefault(row[0], ({}, []))
            if row[3]:
                related.append(row[1])
            else:
                tags[row[1]] = row[2]
        return found

    @staticmethod
    def _turn(row: sqlite3.Row, tags: _TurnTags = ({}, [])) -> StoredTurn:
        return StoredTurn(
            session_id=row["session_id"],
            seq=row["seq"],
            message=Message.model_validate(json.loads(row["message_json"])),
            created_at=datetime.fromisoformat(row["created_at"]),
            content_hash=row["content_hash"],
            token_count=row["token_count"],
            tags=tags[0],
            related_tags=tuple(tags[1]),
            partial=bool(row["partial"]),
        )

    # -- tags -----------------------------------------------------------------------------------

    def tag_turn(self, session_id: str, seq: int, tag: str, weight: float = 1.0) -> None:
        """Add (or re-weight) one tag of a turn."""
        self._write_tags(session_id, [seq], [(session_id, seq, tag, weight, 0)], replace=False)

    def set_turn_tags(
        self,
        session_id: str,
        seq: int,
        tags: Mapping[str, float],
        related: Sequence[str] = (),
    ) -> None:
        """Replace all tags (and related tags) of a turn."""
        self.set_tags_many(session_id, {seq: (tags, related)})

    def set_tags_many(
        self, session_id: str, tagged: Mapping[int, tuple[Mapping[str, float], Sequence[str]]]
    ) -> None:
        """Replace the tags and related tags of several turns in one transaction
        (``tagged`` maps a seq to its tags with weights and its related tags)."""
        rows: list[tuple[str, int, str, float, int]] = []
        for seq, (tags, related) in tagged.items():
            rows.extend((session_id, seq, tag, float(w), 0) for tag, w in tags.items())
            rows.extend((session_id, seq, tag, 0.5, 1) for tag in related if tag not in tags)
        self._write_tags(session_id, list(tagged), rows, replace=True)

    def _write_tags(
        self,
        session_id: str,
        seqs: Sequence[int],
        rows: Sequence[tuple[str, int, str, float, int]],
        *,
        replace: bool,
    ) -> None:
        try:
            with self._tx() as conn:
                if replace:
                    conn.executemany(
                        "DELETE FROM turn_tags WHERE session_id = ? AND seq = ?",
                        [(session_id, seq) for seq in seqs],
                    )
                conn.executemany(
                    "INSERT INTO turn_tags (session_id, seq, tag, weight, related)"
                    " VALUES (?, ?, ?, ?, ?) ON CONFLICT (session_id, seq, tag) DO UPDATE"
                    " SET weight = excluded.weight, related = excluded.related",
                    rows,
                )
        except sqlite3.IntegrityError as exc:
            known = {
                r[0]
                for r in self._conn.execute(
                    "SELECT seq FROM turns WHERE session_id = ?", (session_id,)
                )
            }
            missing = ", ".join(str(seq) for seq in seqs if seq not in known)
            raise ConfigError(f"session {session_id!r} has no turn {missing}") from exc

    def tag_counts(
        self, session_id: str, *, before: int | None = None, since: int | None = None
    ) -> dict[str, int]:
        """How many turns of the session carry each tag (related tags not counted); only the
        turns with seq < ``before`` when given (``before=watermark``: the compacted turns) and
        seq >= ``since`` when given (``since=old_watermark``: the turns a compaction added).
        Without either: the counts kept on write (``tag_stats``), one row per tag."""
        if before is None and since is None:
            return pairs(
                self._conn,
                "SELECT tag, turns FROM tag_stats WHERE session_id = ? AND turns > 0 ORDER BY tag",
                (session_id,),
            )
        rows = self._conn.execute(
            "SELECT tag, COUNT(*) FROM turn_tags WHERE session_id = ? AND related = 0"
            " AND seq < ? AND seq >= ? GROUP BY tag ORDER BY tag",
            (session_id, before if before is not None else 2**62, since or 0),
        )
        return {r[0]: int(r[1]) for r in rows}

    def turns_tagged(
        self, session_id: str, tags: Sequence[str]
    ) -> dict[int, list[tuple[str, bool]]]:
        """The turns carrying any of ``tags`` (as a tag or a related tag): seq -> the matching
        (tag, related) pairs."""
        found: dict[int, list[tuple[str, bool]]] = {}
        query = "SELECT seq, tag, related FROM turn_tags WHERE session_id = ? AND tag IN ({})"
        for row in select_in(self._conn, query, tags, before=(session_id,)):
            found.setdefault(row[0], []).append((row[1], bool(row[2])))
        return found

    def tag_overlap_scores(
        self, session_id: str, weights: Mapping[str, tuple[float, float]]
    ) -> dict[int, float]:
        """For each turn carrying any tag of ``weights``: the sum, over its matching tags, of
        the tag's weight — the first of the pair where the turn has it as a tag, the second
        where as a related tag. Summed inside SQLite: on a long session this is the hot loop
        of tag recall."""
        scores: dict[int, float] = {}
        items = list(weights.items())
        for start in range(0, len(items), 300):
            chunk = items[start : start + 300]
            values = ",".join("(?, ?, ?)" for _ in chunk)
            params = [v for tag, (direct, related) in chunk for v in (tag, direct, related)]
            for seq, score in self._conn.execute(
                f"WITH w(tag, direct, rel) AS (VALUES {values})"
                " SELECT t.seq, SUM(CASE WHEN t.related THEN w.rel ELSE w.direct END)"
                " FROM turn_tags t JOIN w ON w.tag = t.tag WHERE t.session_id = ?"
                " GROUP BY t.seq",
                (*params, session_id),
            ):
                scores[seq] = scores.get(seq, 0.0) + score
        return scores

    def tag_overlap_top(
        self, session_id: str, weights: Mapping[str, tuple[float, float]], limit: int
    ) -> tuple[list[tuple[int, float]], float]:
        """The ``limit`` best turns of ``tag_overlap_scores`` as (seq, score), best first (ties:
        the later turn first), and the lowest score of all the turns that matched (so a caller
        scales the kept scores as it would have scaled them all). One query when ``weights``
        fit one (up to 300 tags): only the kept rows leave SQLite."""
        items = list(weights.items())
        if len(items) > 300:
            scores = self.tag_overlap_scores(session_id, weights)
            ordered = sorted(scores.items(), key=lambda kv: (-kv[1], -kv[0]))
            return ordered[:limit], min(scores.values(), default=0.0)
        values = ",".join("(?, ?, ?)" for _ in items)
        params = [v for tag, (direct, related) in items for v in (tag, direct, related)]
        rows = self._conn.execute(
            f"WITH w(tag, direct, rel) AS (VALUES {values}),"
            " s(seq, score) AS (SELECT t.seq, SUM(CASE WHEN t.related THEN w.rel ELSE w.direct"
            " END) FROM turn_tags t JOIN w ON w.tag = t.tag WHERE t.session_id = ?"
            " GROUP BY t.seq)"
            " SELECT seq, score, MIN(score) OVER () FROM s ORDER BY score DESC, seq DESC LIMIT ?",
            (*params, session_id, limit),
        ).fetchall()
        if not rows:
            return [], 0.0
        return [(int(r[0]), float(r[1])) for r in rows], float(rows[0][2])

    def tag_last_seen(
        self, session_id: str, tags: Sequence[str] | None = None
    ) -> dict[str, datetime]:
        """When each tag of the session (each of ``tags`` when given: a read of their turns
        only) was last on a turn."""
        query = (
            "SELECT tt.tag, MAX(t.created_at) FROM turn_tags tt JOIN turns t"
            " ON t.session_id = tt.session_id AND t.seq = tt.seq"
            " WHERE tt.session_id = ? AND tt.related = 0{} GROUP BY tt.tag"
        )
        if tags is None:
            rows = self._conn.execute(query.format(""), (session_id,)).fetchall()
        else:
            in_tags = query.format(" AND tt.tag IN ({})")
            rows = select_in(self._conn, in_tags, tags, before=(session_id,))
        return {r[0]: datetime.fromisoformat(r[1]) for r in rows}

    def active_tokens(self, session_id: str) -> int:
        """Tokens of the session's turns at or above its compaction watermark."""
        row = self._conn.execute(
            "SELECT COALESCE(SUM(t.token_count), 0) FROM turns t JOIN sessions s"
            " ON s.id = t.session_id WHERE t.session_id = ? AND t.seq >= s.compaction_watermark",
            (session_id,),
        ).fetchone()
        return int(row[0])

    # -- turn vectors ---------------------------------------------------------------------------

    def turns_without_vectors(
        self, session_id: str, model: str, *, after: int = 0
    ) -> list[tuple[int, str]]:
        """(seq, text) of the session's turns after seq ``after`` with no vector from ``model``
        yet, in order (``after=last_vector_seq(...)``: only the turns stored since the last
        vector, read through the primary key instead of a scan of the whole session)."""
        rows = self._conn.execute(
            "SELECT t.seq, t.content_text FROM turns t WHERE t.session_id = ? AND t.seq > ?"
            " AND NOT EXISTS (SELECT 1 FROM turn_vectors v WHERE v.session_id = t.session_id"
            " AND v.model = ? AND v.seq = t.seq) ORDER BY t.seq",
            (session_id, after, model),
        )
        return [(int(r[0]), r[1]) for r in rows]

    def last_vector_seq(self, session_id: str, model: str) -> int:
        """The highest seq of the session with a vector from ``model`` (0 when none): one
        look-up in the vectors' primary key. Vectors are written in seq order (``Recaller.
        ensure_vectors``, a branch's copy of its parent's), so every turn up to it has one."""
        row = self._conn.execute(
            "SELECT MAX(seq) FROM turn_vectors WHERE session_id = ? AND model = ?",
            (session_id, model),
        ).fetchone()
        return int(row[0] or 0)

    def add_turn_vectors(
        self, session_id: str, model: str, seqs: Sequence[int], vectors: npt.NDArray[Any]
    ) -> None:
        """Store one float32 vector per turn (rows of ``vectors``, aligned with ``seqs``)."""
        if len(seqs) != len(vectors):
            raise ConfigError(f"{len(seqs)} seqs need as many vectors, got {len(vectors)}")
        matrix = np.ascontiguousarray(vectors, dtype=np.float32)
        with self._tx() as conn:
            conn.executemany(
                "INSERT OR REPLACE INTO turn_vectors (session_id, seq, model, vector)"
                " VALUES (?, ?, ?, ?)",
                [
                    (session_id, seq, model, row.tobytes())
                    for seq, row in zip(seqs, matrix, strict=True)
                ],
            )

    def turn_vectors(
        self, session_id: str, model: str, *, after: int = 0
    ) -> tuple[list[int], npt.NDArray[np.float32]]:
        """The seqs (> ``after``) with a vector from ``model`` and their vectors, in seq order
        (counted, then read a chunk at a time into one matrix, in one snapshot:
        ``vector_matrix``)."""
        cursor = self._conn.cursor()
        cursor.row_factory = None  # plain tuples
        where = " FROM turn_vectors WHERE session_id = ? AND model = ? AND seq > ?"
        params = (session_id, model, after)
        with memory_fts.snapshot(self._conn):
            (count,) = cursor.execute("SELECT COUNT(*)" + where, params).fetchone()
            if not count:
                return [], np.zeros((0, 0), dtype=np.float32)
            cursor.execute("SELECT seq, vector" + where + " ORDER BY seq", params)
            return vector_matrix(cursor.fetchmany, int(count))

    # -- search ---------------------------------------------------------------------------------

    def search_turns(
        self, session_id: str, query: str, limit: int = 10
    ) -> list[tuple[StoredTurn, float]]:
        """Turns matching any word of ``query``, best first, with their score (``-bm25()``,
        higher is better)."""
        match = _fts_query(query, "content_text", session_id)
        if match is None:
            return []
        rows = self._conn.execute(
            "SELECT t.*, -bm25(turns_fts, 1, 0) AS score FROM turns_fts JOIN turns t ON t.id ="
            " turns_fts.rowid WHERE turns_fts MATCH ? AND t.session_id = ?"
            " ORDER BY bm25(turns_fts, 1, 0), t.seq LIMIT ?",
            (match, session_id, limit),
        ).fetchall()
        if not rows:
            return []
        seqs = [r["seq"] for r in rows]
        tags = self._tags(session_id, min(seqs), max(seqs))
        return [(self._turn(r, tags.get(r["seq"], ({}, []))), float(r["score"])) for r in rows]

    def search_turn_seqs(
        self, session_id: str, query: str, limit: int = 10, *, common_limit: int | None = None
    ) -> list[tuple[int, float]]:
        """Like ``search_turns`` but only (seq, score) pairs: the fast path for ranking.
        With ``common_limit``, a query word in more than that many of the session's turns is
        left out (each word's turns are counted up to the limit, no further); a query of only
        such words finds nothing. What the search reads does not grow with the session
        (``memory_fts``)."""
        return memory_fts.search_turn_seqs(
            self._conn, session_id, query, limit, common_limit, last_seq(self._conn, session_id)
        )

    def search_turn_seqs_many(
        self,
        session_id: str,
        queries: Sequence[str],
        limit: int = 10,
        *,
        common_limit: int | None = None,
    ) -> list[list[tuple[int, float]]]:
        """``search_turn_seqs`` of each query; with ``common_limit``, each distinct word read
        once (``memory_fts.search_turn_seqs_many``)."""
        turns = last_seq(self._conn, session_id)
        if common_limit is None or len(queries) < 2:
            return [
                memory_fts.search_turn_seqs(self._conn, session_id, q, limit, common_limit, turns)
                for q in queries
            ]
        return memory_fts.search_turn_seqs_many(
            self._conn, session_id, queries, limit, common_limit, turns
        )

    def turn_texts_after(self, session_id: str, after: int) -> list[tuple[int, str, str, str]]:
        """(seq, role, text, content hash) of the turns after seq ``after``, in order — the
        cheapest read of new turns (no message parsing, no dates)."""
        cursor = self._conn.cursor()
        cursor.row_factory = None  # plain tuples
        return cursor.execute(
            "SELECT seq, role, content_text, content_hash FROM turns"
            " WHERE session_id = ? AND seq > ? ORDER BY seq",
            (session_id, after),
        ).fetchall()

    def turn_texts_with_incarnation(
        self, session_id: str, after: int
    ) -> tuple[int | None, list[tuple[int, str, str, str]]]:
        """The session's incarnation (``None`` when there is no such session) and
        ``turn_texts_after(session_id, after)``, in one query: one snapshot, so the turns are
        those of that incarnation."""
        born, rows = self._after_with_incarnation(
            session_id, after, "t.role, t.content_text, t.content_hash"
        )
        return born, [(row[0], row[1], row[2], row[3]) for row in rows]

    def turn_openings_with_incarnation(
        self, session_id: str, after: int, chars: int
    ) -> tuple[int | None, list[tuple[int, str]]]:
        """The session's incarnation and (seq, first ``chars`` characters of the text) of its
        turns after ``after``, in one query."""
        born, rows = self._after_with_incarnation(
            session_id, after, f"substr(t.content_text, 1, {int(chars)})"
        )
        return born, [(row[0], row[1]) for row in rows]

    def _after_with_incarnation(
        self, session_id: str, after: int, columns: str
    ) -> tuple[int | None, list[tuple[Any, ...]]]:
        """The session's ``born`` (``None`` when there is no such session) and ``seq,
        <columns>`` (of ``turns t``) of its turns after ``after``, in order: one query, one
        snapshot."""
        cursor = self._conn.cursor()
        cursor.row_factory = None  # plain tuples
        rows = cursor.execute(
            f"SELECT s.born, t.seq, {columns} FROM sessions s"
            " LEFT JOIN turns t ON t.session_id = s.id AND t.seq > ?"
            " WHERE s.id = ? ORDER BY t.seq",
            (after, session_id),
        ).fetchall()
        if not rows:
            return None, []
        return int(rows[0][0]), [tuple(row[1:]) for row in rows if row[1] is not None]

    def turn_hash(self, session_id: str, seq: int) -> str | None:
        """The content hash of one turn (``None`` when it is not stored)."""
        row = self._conn.execute(
            "SELECT content_hash FROM turns WHERE session_id = ? AND seq = ?", (session_id, seq)
        ).fetchone()
        return None if row is None else str(row[0])

    def _turn_columns(
        self, session_id: str, seqs: Sequence[int], columns: str
    ) -> list[tuple[Any, ...]]:
        """``seq, <columns>`` of the given turns (read 500 seqs per query; seqs not stored
        are left out)."""
        cursor = self._conn.cursor()
        cursor.row_factory = None  # plain tuples
        rows: list[tuple[Any, ...]] = []
        for start in range(0, len(seqs), 500):
            chunk = list(seqs[start : start + 500])
            marks = ",".join("?" * len(chunk))
            rows += cursor.execute(
                f"SELECT seq, {columns} FROM turns WHERE session_id = ? AND seq IN ({marks})",
                (session_id, *chunk),
            ).fetchall()
        return rows

    def turn_times(self, session_id: str, seqs: Sequence[int]) -> dict[int, datetime]:
        """When each given turn was said (seqs not stored are left out)."""
        rows = self._turn_columns(session_id, seqs, "created_at")
        return {seq: datetime.fromisoformat(stamp) for seq, stamp in rows}

    def turn_openings(self, session_id: str, seqs: Sequence[int], chars: int) -> dict[int, str]:
        """The first ``chars`` characters of each given turn's text (seqs not stored are left
        out)."""
        return dict(self._turn_columns(session_id, seqs, f"substr(content_text, 1, {int(chars)})"))

    def turn_token_counts(self, session_id: str, seqs: Sequence[int]) -> dict[int, int]:
        """The token count of each given turn (seqs not stored are left out)."""
        return dict(self._turn_columns(session_id, seqs, "token_count"))

    def turn_token_counts_after(
        self, session_id: str, after: int
    ) -> tuple[int | None, list[tuple[int, int]]]:
        """The session's ``born`` and (seq, token count) of its turns after ``after``, in order
        (one query: one snapshot)."""
        born, rows = self._after_with_incarnation(session_id, after, "t.token_count")
        return born, [(row[0], row[1]) for row in rows]

    def turn_rows(self, session_id: str, seqs: Sequence[int]) -> dict[int, TurnRow]:
        """Role, text, time and token count of the given turns, without parsing messages."""
        rows = self._turn_columns(session_id, seqs, "role, content_text, created_at, token_count")
        return {r[0]: TurnRow(r[0], r[1], r[2], datetime.fromisoformat(r[3]), r[4]) for r in rows}

    # -- compaction and segments (``memory_segments.py``) ----------------------------------------

    def topic_counts(self, session_id: str) -> tuple[int, dict[str, int]]:
        return self._segments.topic_counts(session_id)

    def compact(
        self,
        session_id: str,
        segments: Sequence[NewSegment],
        watermark: int,
        *,
        _before_commit: Callable[[], None] | None = None,
    ) -> list[int]:
        return self._segments.compact(
            session_id, segments, watermark, _before_commit=_before_commit
        )

    def segments(
        self, session_id: str, *, tag: str | None = None, full_text: bool = True
    ) -> list[StoredSegment]:
        return self._segments.segments(session_id, tag=tag, full_text=full_text)

    def search_segments(
        self, session_id: str, query: str, limit: int = 10
    ) -> list[tuple[StoredSegment, float]]:
        return self._segments.search_segments(session_id, query, limit)

    # -- lookups, branches and exchanges (``memory_branches.py``) --------------------------------

    def principal_of(self, session_id: str) -> str | None:
        return self._branches.principal_of(session_id)

    def turns_with_key(
        self, principal: str, key: str, *, session_id: str | None = None, limit: int = 20
    ) -> list[tuple[str, int]]:
        return self._branches.turns_with_key(principal, key, session_id=session_id, limit=limit)

    def latest_session(self, principal: str) -> tuple[str, int] | None:
        return self._branches.latest_session(principal)

    def turn_keys(self, session_id: str, lo: int, hi: int) -> dict[int, str]:
        return self._branches.turn_keys(session_id, lo, hi)

    def fork(self, session_id: str, upto: int, *, session_id_new: str | None = None) -> str:
        return self._branches.fork(session_id, upto, session_id_new=session_id_new)

    def commit_exchange(
        self,
        session_id: str,
        messages: Sequence[Message],
        *,
        partial: Sequence[bool] | None = None,
        expect_last: int | None = None,
        timestamps: Sequence[datetime] | None = None,
    ) -> list[int]:
        return self._branches.commit_exchange(
            session_id, messages, partial=partial, expect_last=expect_last, timestamps=timestamps
        )

    def mark_derived(self, session_id: str, seq: int) -> None:
        self._branches.mark_derived(session_id, seq)

    def begin_derive(
        self,
        session_id: str,
        *,
        context: int = 0,
        append: Sequence[Message] = (),
        timestamps: Sequence[datetime] | None = None,
    ) -> PendingDerive:
        return self._branches.begin_derive(
            session_id, context=context, append=append, timestamps=timestamps
        )

    def write_derived(
        self,
        session_id: str,
        tagged: Mapping[int, tuple[Mapping[str, float], Sequence[str]]],
        derived_seq: int,
    ) -> tuple[int, int]:
        return self._branches.write_derived(session_id, tagged, derived_seq)
