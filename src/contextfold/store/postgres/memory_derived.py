"""``PostgresMemoryStore``'s per-turn derived data: tags and related tags (with the sums tag
recall ranks by, computed in the server) and turn vectors (float32 ``bytea``, returned as the
numpy matrix the SQLite store returns; recall scans them exactly in numpy — pgvector is not
used, so the store needs no extension). A derive done in line writes what it derived in one
round trip (``write_derived``), as it reads what it starts from (``begin_derive``, in
``memory.py``).

``PostgresDerived`` holds these methods, a part of the store's core: ``PostgresMemoryStore``'s
methods of the same names (``memory.py``) call it.
Text is compared in byte order (``COLLATE "C"``), as SQLite's ``BINARY``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import numpy as np
import numpy.typing as npt

from contextfold.errors import ConfigError
from contextfold.store.models import vector_matrix
from contextfold.store.postgres.connection import Database, from_text, utc

__all__ = ["PostgresDerived"]


def _tag_rows(
    session_id: str, tagged: Mapping[int, tuple[Mapping[str, float], Sequence[str]]]
) -> list[tuple[str, int, str, float, bool]]:
    """The tag rows of ``set_tags_many``'s ``tagged``: (session, seq, tag, weight, related)."""
    rows: list[tuple[str, int, str, float, bool]] = []
    for seq, (tags, related) in tagged.items():
        rows.extend((session_id, seq, tag, float(w), False) for tag, w in tags.items())
        rows.extend((session_id, seq, tag, 0.5, True) for tag in related if tag not in tags)
    return rows


def _tag_arrays(
    rows: Sequence[tuple[str, int, str, float, bool]],
) -> tuple[list[int], list[str], list[float], list[bool]]:
    """Tag rows as the parallel arrays ``cf_set_tags`` takes (seqs, tags, weights, related);
    a (seq, tag) given twice keeps its last row, as the SQLite upsert."""
    unique = {(seq, tag): (weight, related) for _, seq, tag, weight, related in rows}
    return (
        [seq for seq, _ in unique],
        [tag for _, tag in unique],
        [weight for weight, _ in unique.values()],
        [related for _, related in unique.values()],
    )


def _tag_json(rows: Sequence[tuple[str, int, str, float, bool]]) -> str:
    """Tag rows as ``cf_write_derived`` takes them: a JSON array of [seq, tag, weight,
    related], each (seq, tag) once (its last row, as the SQLite upsert keeps)."""
    unique = {(seq, tag): (weight, related) for _, seq, tag, weight, related in rows}
    return json.dumps(
        [[seq, tag, weight, related] for (seq, tag), (weight, related) in unique.items()],
        ensure_ascii=False,
        separators=(",", ":"),
        allow_nan=False,
    )


class PostgresDerived:
    """The part of ``PostgresMemoryStore``'s core that holds turn tags and turn vectors (and
    the derive's one-call write); the store's methods of these names call it. Made with the
    store's ``Database``."""

    def __init__(self, db: Database) -> None:
        self._db = db

    # -- tags -----------------------------------------------------------------------------------

    def tag_turn(self, session_id: str, seq: int, tag: str, weight: float = 1.0) -> None:
        """Add (or re-weight) one tag of a turn."""
        self._write_tags(session_id, [seq], [(session_id, seq, tag, weight, False)], replace=False)

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
        """Replace the tags and related tags of several turns in one transaction."""
        self._write_tags(session_id, list(tagged), _tag_rows(session_id, tagged), replace=True)

    def write_derived(
        self,
        session_id: str,
        tagged: Mapping[int, tuple[Mapping[str, float], Sequence[str]]],
        derived_seq: int,
    ) -> tuple[int, int]:
        """``set_tags_many`` and ``mark_derived`` in one call of ``cf_write_derived``
        (``schema.m006``), under the session's row lock; (generation before, after). The
        given seqs' tags are replaced: the last row of a (seq, tag) given twice is kept."""
        with self._db.statement() as conn:
            row = conn.execute(
                "SELECT missing, before, after FROM cf_write_derived(%s, %s::int[], %s::jsonb, %s)",
                (
                    session_id,
                    list(tagged),
                    _tag_json(_tag_rows(session_id, tagged)),
                    derived_seq,
                ),
            ).fetchone()
        if row is not None and row[0]:
            raise ConfigError(
                f"session {session_id!r} has no turn {', '.join(str(s) for s in row[0])}"
            )
        if row is None or row[1] is None:
            raise ConfigError(f"unknown session {session_id!r}")
        return int(row[1]), int(row[2])

    def _write_tags(
        self,
        session_id: str,
        seqs: Sequence[int],
        rows: Sequence[tuple[str, int, str, float, bool]],
        *,
        replace: bool,
    ) -> None:
        """Write tag rows (the tags of ``seqs`` replaced first when ``replace``) in one call of
        ``cf_set_tags``; a (seq, tag) given twice keeps its last row, as the SQLite upsert.
        ``ConfigError`` naming the seqs with no turn (nothing written)."""
        with self._db.statement() as conn:
            row = conn.execute(
                "SELECT cf_set_tags(%s, %s::int[], %s::int[], %s::text[], %s::float8[],"
                " %s::bool[])",
                (session_id, list(seqs) if replace else [], *_tag_arrays(rows)),
            ).fetchone()
        missing = row[0] if row is not None else []
        if missing:
            raise ConfigError(
                f"session {session_id!r} has no turn {', '.join(str(s) for s in missing)}"
            )

    def tag_counts(
        self, session_id: str, *, before: int | None = None, since: int | None = None
    ) -> dict[str, int]:
        """How many turns of the session carry each tag (related tags not counted); only the
        turns with seq < ``before`` and seq >= ``since`` when given. Without either: the
        counts kept on write (``tag_stats``), one row per tag."""
        if before is None and since is None:
            with self._db.read() as conn:
                rows = conn.execute(
                    "SELECT tag, turns FROM tag_stats WHERE session_id = %s AND turns > 0"
                    ' ORDER BY tag COLLATE "C"',
                    (session_id,),
                ).fetchall()
            return {r[0]: int(r[1]) for r in rows}
        with self._db.read() as conn:
            rows = conn.execute(
                "SELECT tag, COUNT(*) FROM turn_tags WHERE session_id = %s AND NOT related"
                ' AND seq < %s AND seq >= %s GROUP BY tag ORDER BY tag COLLATE "C"',
                (session_id, before if before is not None else 2**62, since or 0),
            ).fetchall()
        return {r[0]: int(r[1]) for r in rows}

    def topic_counts(self, session_id: str) -> tuple[int, dict[str, int]]:
        """The session's compaction watermark and, read with it (one statement), for each tag
        a segment carries, how many compacted turns carry it, from the counts kept on write
        (``tag_stats``)."""
        with self._db.read() as conn:
            rows = conn.execute(
                "SELECT s.compaction_watermark, t.tag, t.compacted FROM sessions s"
                " LEFT JOIN tag_stats t ON t.session_id = s.id AND t.compacted > 0"
                ' AND t.segments > 0 WHERE s.id = %s ORDER BY t.tag COLLATE "C"',
                (session_id,),
            ).fetchall()
        if not rows:
            raise ConfigError(f"unknown session {session_id!r}")
        return int(rows[0][0]), {r[1]: int(r[2]) for r in rows if r[1] is not None}

    def turns_tagged(
        self, session_id: str, tags: Sequence[str]
    ) -> dict[int, list[tuple[str, bool]]]:
        """The turns carrying any of ``tags`` (as a tag or a related tag): seq -> the matching
        (tag, related) pairs."""
        found: dict[int, list[tuple[str, bool]]] = {}
        with self._db.read() as conn:
            for seq, tag, related in conn.execute(
                "SELECT seq, tag, related FROM turn_tags WHERE session_id = %s AND tag = ANY(%s)",
                (session_id, list(tags)),
            ):
                found.setdefault(seq, []).append((tag, bool(related)))
        return found

    _WEIGHTS = (
        "WITH w(tag, direct, rel) AS (SELECT * FROM unnest(%s::text[], %s::float8[],"
        " %s::float8[])), s(seq, score) AS (SELECT t.seq, SUM(CASE WHEN t.related THEN w.rel"
        " ELSE w.direct END) FROM turn_tags t JOIN w ON w.tag = t.tag WHERE t.session_id = %s"
        " GROUP BY t.seq)"
    )

    @staticmethod
    def _weight_params(
        session_id: str, weights: Mapping[str, tuple[float, float]]
    ) -> tuple[Any, ...]:
        tags = list(weights)
        return (
            tags,
            [float(weights[t][0]) for t in tags],
            [float(weights[t][1]) for t in tags],
            session_id,
        )

    def tag_overlap_scores(
        self, session_id: str, weights: Mapping[str, tuple[float, float]]
    ) -> dict[int, float]:
        """For each turn carrying any tag of ``weights``: the sum, over its matching tags, of
        the tag's weight (the first of the pair for a tag, the second for a related tag)."""
        with self._db.read() as conn:
            rows = conn.execute(
                self._WEIGHTS + " SELECT seq, score FROM s",
                self._weight_params(session_id, weights),
            ).fetchall()
        return {int(r[0]): float(r[1]) for r in rows}

    def tag_overlap_top(
        self, session_id: str, weights: Mapping[str, tuple[float, float]], limit: int
    ) -> tuple[list[tuple[int, float]], float]:
        """The ``limit`` best turns of ``tag_overlap_scores`` as (seq, score), best first
        (ties: the later turn first), and the lowest score of all the turns that matched."""
        with self._db.read() as conn:
            rows = conn.execute(
                self._WEIGHTS + " SELECT seq, score, MIN(score) OVER () FROM s"
                " ORDER BY score DESC, seq DESC LIMIT %s",
                (*self._weight_params(session_id, weights), limit),
            ).fetchall()
        if not rows:
            return [], 0.0
        return [(int(r[0]), float(r[1])) for r in rows], float(rows[0][2])

    def tag_last_seen(
        self, session_id: str, tags: Sequence[str] | None = None
    ) -> dict[str, datetime]:
        """When each tag of the session (each of ``tags`` when given) was last on a turn."""
        query = (
            "SELECT tt.tag, MAX(t.created_at) FROM turn_tags tt JOIN turns t"
            " ON t.session_id = tt.session_id AND t.seq = tt.seq"
            " WHERE tt.session_id = %s AND NOT tt.related{} GROUP BY tt.tag"
        )
        with self._db.read() as conn:
            if tags is None:
                rows = conn.execute(query.format(""), (session_id,)).fetchall()
            else:
                rows = conn.execute(
                    query.format(" AND tt.tag = ANY(%s)"), (session_id, list(tags))
                ).fetchall()
        return {r[0]: utc(r[1]) for r in rows}

    # -- turn vectors ---------------------------------------------------------------------------

    def turns_without_vectors(
        self, session_id: str, model: str, *, after: int = 0
    ) -> list[tuple[int, str]]:
        """(seq, text) of the session's turns after seq ``after`` with no vector from
        ``model`` yet, in order."""
        with self._db.read() as conn:
            rows = conn.execute(
                "SELECT t.seq, t.content_text FROM turns t WHERE t.session_id = %s"
                " AND t.seq > %s AND NOT EXISTS (SELECT 1 FROM turn_vectors v"
                " WHERE v.session_id = t.session_id AND v.model = %s AND v.seq = t.seq)"
                " ORDER BY t.seq",
                (session_id, after, model),
            ).fetchall()
        return [(int(r[0]), from_text(r[1])) for r in rows]

    def last_vector_seq(self, session_id: str, model: str) -> int:
        """The highest seq of the session with a vector from ``model`` (0 when none)."""
        with self._db.read() as conn:
            row = conn.execute(
                "SELECT MAX(seq) FROM turn_vectors WHERE session_id = %s AND model = %s",
                (session_id, model),
            ).fetchone()
        return int(row[0] or 0) if row else 0

    def add_turn_vectors(
        self, session_id: str, model: str, seqs: Sequence[int], vectors: npt.NDArray[Any]
    ) -> None:
        """Store one float32 vector per turn (rows of ``vectors``, aligned with ``seqs``)."""
        if len(seqs) != len(vectors):
            raise ConfigError(f"{len(seqs)} seqs need as many vectors, got {len(vectors)}")
        matrix = np.ascontiguousarray(vectors, dtype=np.float32)
        with self._db.tx() as conn, conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO turn_vectors (session_id, seq, model, vector)"
                " VALUES (%s, %s, %s, %s) ON CONFLICT (session_id, model, seq)"
                " DO UPDATE SET vector = excluded.vector",
                [
                    (session_id, seq, model, row.tobytes())
                    for seq, row in zip(seqs, matrix, strict=True)
                ],
            )

    def turn_vectors(
        self, session_id: str, model: str, *, after: int = 0
    ) -> tuple[list[int], npt.NDArray[np.float32]]:
        """The seqs (> ``after``) with a vector from ``model`` and their vectors, in order."""
        with self._db.read() as conn:
            cursor = conn.execute(
                "SELECT seq, vector FROM turn_vectors WHERE session_id = %s AND model = %s"
                " AND seq > %s ORDER BY seq",
                (session_id, model, after),
            )
            # Converted a chunk at a time into one matrix (``vector_matrix``).
            return vector_matrix(cursor.fetchmany, max(cursor.rowcount, 0))
