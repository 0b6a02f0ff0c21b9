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

import hashlib
import json
import re
import sqlite3
import uuid
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, NamedTuple

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field

from contextfold.errors import ConfigError, StoreError
from contextfold.items import Message
from contextfold.retrieval.sparse import analyze
from contextfold.store.sqlite import MigrationRegistry, connect, transaction
from contextfold.tokens import TiktokenCounter, TokenCounter

__all__ = [
    "MIGRATIONS",
    "CostReport",
    "Depth",
    "MemoryStore",
    "NewSegment",
    "SessionRecord",
    "StoredSegment",
    "StoredTurn",
    "TagSummary",
    "TurnRow",
    "WorkingSetEntry",
]

MIGRATIONS = MigrationRegistry("memory")

Depth = Literal["none", "summary", "segments", "full"]


class TurnRow(NamedTuple):
    """A stored turn's plain columns (no message parsing): the fast read path."""

    seq: int
    role: str
    text: str
    created_at: datetime
    token_count: int


# A turn's tags with their weights, and its related tags.
_TurnTags = tuple[dict[str, float], list[str]]

_IMMUTABLE_TURNS = "raw turns are append-only: a turn is never updated or deleted"


@MIGRATIONS.migration
def m001_create_memory(conn: sqlite3.Connection) -> None:
    conn.execute(
        "CREATE TABLE sessions ("
        " id TEXT PRIMARY KEY, created_at TEXT NOT NULL, metadata TEXT NOT NULL DEFAULT '{}',"
        " compaction_watermark INTEGER NOT NULL DEFAULT 0)"
    )
    conn.execute(
        "CREATE TABLE turns ("
        " id INTEGER PRIMARY KEY,"
        " session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,"
        " seq INTEGER NOT NULL CHECK (seq >= 1), role TEXT NOT NULL,"
        " content_text TEXT NOT NULL, message_json TEXT NOT NULL, content_hash TEXT NOT NULL,"
        " created_at TEXT NOT NULL, token_count INTEGER NOT NULL,"
        " UNIQUE (session_id, seq))"
    )
    # A session in this table may have its turns deleted (only ``delete_session`` writes it,
    # inside the transaction that deletes the session).
    conn.execute("CREATE TABLE turn_deletions (session_id TEXT PRIMARY KEY)")
    conn.execute(
        "CREATE TRIGGER turns_no_update BEFORE UPDATE ON turns"
        f" BEGIN SELECT RAISE(ABORT, '{_IMMUTABLE_TURNS}'); END"
    )
    conn.execute(
        "CREATE TRIGGER turns_no_delete BEFORE DELETE ON turns WHEN NOT EXISTS"
        " (SELECT 1 FROM turn_deletions WHERE session_id = OLD.session_id)"
        f" BEGIN SELECT RAISE(ABORT, '{_IMMUTABLE_TURNS} (use delete_session)'); END"
    )
    conn.execute(
        "CREATE TABLE turn_tags ("
        " session_id TEXT NOT NULL, seq INTEGER NOT NULL, tag TEXT NOT NULL,"
        " weight REAL NOT NULL DEFAULT 1.0, PRIMARY KEY (session_id, seq, tag),"
        " FOREIGN KEY (session_id, seq) REFERENCES turns(session_id, seq) ON DELETE CASCADE)"
    )
    conn.execute("CREATE INDEX turn_tags_by_tag ON turn_tags (session_id, tag, seq)")
    conn.execute(
        "CREATE TABLE segments ("
        " id INTEGER PRIMARY KEY,"
        " session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,"
        " first_seq INTEGER NOT NULL, last_seq INTEGER NOT NULL, summary TEXT NOT NULL,"
        " full_text TEXT NOT NULL, tags TEXT NOT NULL DEFAULT '[]',"
        " summary_tokens INTEGER NOT NULL, full_tokens INTEGER NOT NULL,"
        " created_at TEXT NOT NULL, CHECK (first_seq <= last_seq))"
    )
    conn.execute("CREATE INDEX segments_by_session ON segments (session_id, first_seq)")
    conn.execute(
        "CREATE TABLE segment_turns ("
        " segment_id INTEGER NOT NULL REFERENCES segments(id) ON DELETE CASCADE,"
        " seq INTEGER NOT NULL, PRIMARY KEY (segment_id, seq))"
    )
    conn.execute(
        "CREATE TABLE tag_summaries ("
        " session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,"
        " tag TEXT NOT NULL, summary TEXT NOT NULL, tokens INTEGER NOT NULL,"
        " source_watermark INTEGER NOT NULL, updated_at TEXT NOT NULL,"
        " PRIMARY KEY (session_id, tag))"
    )
    conn.execute("CREATE TABLE aliases (alias TEXT PRIMARY KEY, canonical TEXT NOT NULL)")
    conn.execute(
        "CREATE TABLE working_set ("
        " session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,"
        " tag TEXT NOT NULL,"
        " depth TEXT NOT NULL CHECK (depth IN ('none', 'summary', 'segments', 'full')),"
        " last_used TEXT NOT NULL, tokens INTEGER NOT NULL DEFAULT 0,"
        " PRIMARY KEY (session_id, tag))"
    )
    conn.execute(
        "CREATE TABLE cost_log ("
        " id INTEGER PRIMARY KEY,"
        " session_id TEXT REFERENCES sessions(id) ON DELETE SET NULL,"
        " at TEXT NOT NULL, kind TEXT NOT NULL, model TEXT NOT NULL,"
        " prompt_tokens INTEGER NOT NULL, completion_tokens INTEGER NOT NULL,"
        " cost_usd REAL NOT NULL)"
    )


@MIGRATIONS.migration
def m002_create_fts(conn: sqlite3.Connection) -> None:
    # External-content FTS5 tables: the text lives once, in turns / segments; the triggers
    # follow the pattern of the FTS5 documentation (a 'delete' command removes the old row).
    for table, column, fts in (
        ("turns", "content_text", "turns_fts"),
        ("segments", "summary", "segments_fts"),
    ):
        conn.execute(
            f"CREATE VIRTUAL TABLE {fts} USING fts5({column}, content='{table}',"
            " content_rowid='id', tokenize='porter unicode61')"
        )
        conn.execute(
            f"CREATE TRIGGER {fts}_ai AFTER INSERT ON {table} BEGIN"
            f" INSERT INTO {fts} (rowid, {column}) VALUES (NEW.id, NEW.{column}); END"
        )
        conn.execute(
            f"CREATE TRIGGER {fts}_ad AFTER DELETE ON {table} BEGIN"
            f" INSERT INTO {fts} ({fts}, rowid, {column}) VALUES ('delete', OLD.id, OLD.{column});"
            " END"
        )
        conn.execute(
            f"CREATE TRIGGER {fts}_au AFTER UPDATE ON {table} BEGIN"
            f" INSERT INTO {fts} ({fts}, rowid, {column}) VALUES ('delete', OLD.id, OLD.{column});"
            f" INSERT INTO {fts} (rowid, {column}) VALUES (NEW.id, NEW.{column}); END"
        )
        # Index whatever an m001-only database already holds.
        conn.execute(f"INSERT INTO {fts} ({fts}) VALUES ('rebuild')")


@MIGRATIONS.migration
def m003_related_tags_and_vectors(conn: sqlite3.Connection) -> None:
    # ``related`` tags are alternate terms for cross-vocabulary recall (weighted lower, and not
    # counted as the turn's topics); segments keep theirs too. Turn vectors hold the dense
    # embedding of each turn per embedder name, as float32 bytes.
    conn.execute("ALTER TABLE turn_tags ADD COLUMN related INTEGER NOT NULL DEFAULT 0")
    conn.execute("ALTER TABLE segments ADD COLUMN related_tags TEXT NOT NULL DEFAULT '[]'")
    conn.execute(
        "CREATE TABLE turn_vectors ("
        " session_id TEXT NOT NULL, seq INTEGER NOT NULL, model TEXT NOT NULL,"
        " vector BLOB NOT NULL, PRIMARY KEY (session_id, model, seq),"
        " FOREIGN KEY (session_id, seq) REFERENCES turns(session_id, seq) ON DELETE CASCADE)"
    )


@MIGRATIONS.migration
def m004_session_scoped_fts(conn: sqlite3.Connection) -> None:
    # The full-text tables get the session id as a second indexed column, so a search can
    # intersect its terms with one session's posting list instead of ranking the matches of
    # every session in the file and filtering afterwards (a proxy store holds many sessions).
    for table, column, fts in (
        ("turns", "content_text", "turns_fts"),
        ("segments", "summary", "segments_fts"),
    ):
        for suffix in ("ai", "ad", "au"):
            conn.execute(f"DROP TRIGGER {fts}_{suffix}")
        conn.execute(f"DROP TABLE {fts}")
        columns = f"{column}, session_id"
        conn.execute(
            f"CREATE VIRTUAL TABLE {fts} USING fts5({columns}, content='{table}',"
            " content_rowid='id', tokenize='porter unicode61')"
        )
        new = f"NEW.{column}, NEW.session_id"
        old = f"OLD.{column}, OLD.session_id"
        conn.execute(
            f"CREATE TRIGGER {fts}_ai AFTER INSERT ON {table} BEGIN"
            f" INSERT INTO {fts} (rowid, {columns}) VALUES (NEW.id, {new}); END"
        )
        conn.execute(
            f"CREATE TRIGGER {fts}_ad AFTER DELETE ON {table} BEGIN"
            f" INSERT INTO {fts} ({fts}, rowid, {columns}) VALUES ('delete', OLD.id, {old}); END"
        )
        conn.execute(
            f"CREATE TRIGGER {fts}_au AFTER UPDATE ON {table} BEGIN"
            f" INSERT INTO {fts} ({fts}, rowid, {columns}) VALUES ('delete', OLD.id, {old});"
            f" INSERT INTO {fts} (rowid, {columns}) VALUES (NEW.id, {new}); END"
        )
        conn.execute(f"INSERT INTO {fts} ({fts}) VALUES ('rebuild')")


_FROZEN = ConfigDict(frozen=True)


class SessionRecord(BaseModel):
    """A stored session; turns with ``seq < compaction_watermark`` are compacted."""

    model_config = _FROZEN
    id: str
    created_at: datetime
    metadata: dict[str, Any]
    compaction_watermark: int


class StoredTurn(BaseModel):
    """One raw turn as stored: the full message (tool calls included), its tags and counts."""

    model_config = _FROZEN
    session_id: str
    seq: int
    message: Message
    created_at: datetime
    content_hash: str
    token_count: int
    tags: dict[str, float] = Field(default_factory=dict)
    related_tags: tuple[str, ...] = ()


class NewSegment(BaseModel):
    """A segment to store at compaction: turns ``first_seq..last_seq`` (inclusive) with their
    summary and full text; token counts left ``None`` are counted by the store's counter."""

    model_config = _FROZEN
    first_seq: int
    last_seq: int
    summary: str
    full_text: str
    tags: tuple[str, ...] = ()
    related_tags: tuple[str, ...] = ()
    summary_tokens: int | None = None
    full_tokens: int | None = None


class StoredSegment(BaseModel):
    """A stored segment; ``seqs`` are its source turns."""

    model_config = _FROZEN
    id: int
    session_id: str
    first_seq: int
    last_seq: int
    summary: str
    full_text: str
    tags: tuple[str, ...]
    summary_tokens: int
    full_tokens: int
    created_at: datetime
    seqs: tuple[int, ...]
    related_tags: tuple[str, ...] = ()


class TagSummary(BaseModel):
    """One summary per tag; ``stale`` when the tag has turns after ``source_watermark``."""

    model_config = _FROZEN
    session_id: str
    tag: str
    summary: str
    tokens: int
    source_watermark: int
    stale: bool


class WorkingSetEntry(BaseModel):
    """A topic of a session's working set and the depth it is paged in at."""

    model_config = _FROZEN
    tag: str
    depth: Depth
    last_used: datetime
    tokens: int


class CostReport(BaseModel):
    """Sums over the cost log (``by_kind`` maps a kind to its cost in USD)."""

    model_config = _FROZEN
    calls: int
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float
    by_kind: dict[str, float]


def _now() -> datetime:
    return datetime.now(UTC)


def _iso(moment: datetime) -> str:
    aware = moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
    return aware.astimezone(UTC).isoformat(timespec="microseconds")


def _message_json(message: Message) -> str:
    return json.dumps(
        message.model_dump(mode="json"), sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )


# Words a question is made of but an answer rarely shares: interrogatives, auxiliaries,
# pronouns and fillers. BM25's own stop list (Lucene's 33 words) keeps them, and in an OR
# query every one of them pulls in turns that only share the grammar of the question.
_WORDS = re.compile(r"\w")

QUESTION_STOPWORDS = frozenset(
    """
    what whats when where which who whom whose why how
    do does did doing done have has had having am were been being can could would should
    shall may might must i me my mine myself you your yours yourself he him his himself she
    her hers herself we us our ours its them theirs themselves
    about any anything some something ever also just so very much many more most other
    than too from up out over again once here there now all both each few own same only
    tell know think
    """.split()  # noqa: SIM905 - a word list reads best as words
)


def _quoted(text: str) -> str:
    return '"' + text.replace('"', '""') + '"'


def _fts_query(query: str, column: str, session_id: str) -> str | None:
    """An FTS5 query: any of the query's words in ``column``, stop words (and the grammar of a
    question: ``QUESTION_STOPWORDS``) removed, each quoted (so no character of the user's text
    is FTS5 syntax), within the session's rows; ``None`` when no word is left. A query of
    nothing but such words keeps them. The session phrase narrows the search inside the index;
    callers still compare ``session_id`` exactly (a phrase also matches inside a longer id)."""
    words = analyze(query, stemmer=None)
    terms = dict.fromkeys(w for w in words if w not in QUESTION_STOPWORDS) or dict.fromkeys(words)
    if not terms:
        return None
    match = f"{column} : (" + " OR ".join(_quoted(term) for term in terms) + ")"
    if _WORDS.search(session_id):
        match += f" AND session_id : {_quoted(session_id)}"
    return match


class MemoryStore:
    """Sessions, raw turns, tags, segments, tag summaries, aliases, working sets and costs in one
    SQLite file (or ``":memory:"``).

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
        self.counter: TokenCounter = counter or TiktokenCounter("cl100k_base")
        self._conn = connect(self.path)
        MIGRATIONS.apply(self._conn)

    def close(self) -> None:
        self._conn.close()

    # -- sessions -------------------------------------------------------------------------------

    def create_session(
        self, session_id: str | None = None, metadata: Mapping[str, Any] | None = None
    ) -> str:
        """Create a session (a random id when none is given) and return its id."""
        sid = session_id or uuid.uuid4().hex
        try:
            with transaction(self._conn) as conn:
                conn.execute(
                    "INSERT INTO sessions (id, created_at, metadata) VALUES (?, ?, ?)",
                    (sid, _iso(_now()), json.dumps(dict(metadata or {}))),
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
        )

    def sessions(self) -> list[str]:
        return [r[0] for r in self._conn.execute("SELECT id FROM sessions ORDER BY created_at, id")]

    def delete_session(self, session_id: str) -> bool:
        """Delete a session and everything stored for it (its cost log rows are kept, detached).
        The only way raw turns are ever deleted. Returns whether the session existed."""
        with transaction(self._conn) as conn:
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
        return transaction(self._conn)

    def last_seq(self, session_id: str) -> int:
        """The seq of the session's last turn (0 when it has none)."""
        return self._last_seq(self._conn, session_id)

    def append_turns(
        self,
        session_id: str,
        messages: Sequence[Message],
        *,
        timestamps: Sequence[datetime] | None = None,
    ) -> list[int]:
        """Append turns in one transaction; returns their seqs (consecutive, from 1 per session).
        ``timestamps`` (one per message) default to now; naive ones are taken as UTC."""
        if timestamps is not None and len(timestamps) != len(messages):
            raise ConfigError(
                f"{len(messages)} messages need as many timestamps, got {len(timestamps)}"
            )
        self.session(session_id)
        now = _now()
        rows = []
        for i, message in enumerate(messages):
            body = _message_json(message)
            text = message.text()
            rows.append(
                (
                    message.role,
                    text,
                    body,
                    hashlib.sha256(body.encode("utf-8")).hexdigest(),
                    _iso(timestamps[i] if timestamps is not None else now),
                    self.counter.count(text),
                )
            )
        with transaction(self._conn) as conn:
            first = self._last_seq(conn, session_id) + 1
            seqs = list(range(first, first + len(rows)))
            conn.executemany(
                "INSERT INTO turns (session_id, seq, role, content_text, message_json,"
                " content_hash, created_at, token_count) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [(session_id, seq, *row) for seq, row in zip(seqs, rows, strict=True)],
            )
        return seqs

    @staticmethod
    def _last_seq(conn: sqlite3.Connection, session_id: str) -> int:
        row = conn.execute(
            "SELECT COALESCE(MAX(seq), 0) FROM turns WHERE session_id = ?", (session_id,)
        ).fetchone()
        return int(row[0])

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
            with transaction(self._conn) as conn:
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

    def tag_counts(self, session_id: str, *, before: int | None = None) -> dict[str, int]:
        """How many turns of the session carry each tag (related tags not counted); only the
        turns with seq < ``before`` when given (``before=watermark``: the compacted turns)."""
        rows = self._conn.execute(
            "SELECT tag, COUNT(*) FROM turn_tags WHERE session_id = ? AND related = 0"
            " AND seq < ? GROUP BY tag ORDER BY tag",
            (session_id, before if before is not None else 2**62),
        )
        return {r[0]: int(r[1]) for r in rows}

    def turns_tagged(
        self, session_id: str, tags: Sequence[str]
    ) -> dict[int, list[tuple[str, bool]]]:
        """The turns carrying any of ``tags`` (as a tag or a related tag): seq -> the matching
        (tag, related) pairs."""
        found: dict[int, list[tuple[str, bool]]] = {}
        for start in range(0, len(tags), 500):
            chunk = list(tags[start : start + 500])
            marks = ",".join("?" * len(chunk))
            for row in self._conn.execute(
                "SELECT seq, tag, related FROM turn_tags WHERE session_id = ?"
                f" AND tag IN ({marks})",
                (session_id, *chunk),
            ):
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

    def tag_last_seen(self, session_id: str) -> dict[str, datetime]:
        """When each tag of the session was last on a turn."""
        rows = self._conn.execute(
            "SELECT tt.tag, MAX(t.created_at) FROM turn_tags tt JOIN turns t"
            " ON t.session_id = tt.session_id AND t.seq = tt.seq"
            " WHERE tt.session_id = ? AND tt.related = 0 GROUP BY tt.tag",
            (session_id,),
        )
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

    def turns_without_vectors(self, session_id: str, model: str) -> list[tuple[int, str]]:
        """(seq, text) of the session's turns with no vector from ``model`` yet, in order."""
        rows = self._conn.execute(
            "SELECT t.seq, t.content_text FROM turns t WHERE t.session_id = ? AND NOT EXISTS"
            " (SELECT 1 FROM turn_vectors v WHERE v.session_id = t.session_id AND v.model = ?"
            " AND v.seq = t.seq) ORDER BY t.seq",
            (session_id, model),
        )
        return [(int(r[0]), r[1]) for r in rows]

    def add_turn_vectors(
        self, session_id: str, model: str, seqs: Sequence[int], vectors: npt.NDArray[Any]
    ) -> None:
        """Store one float32 vector per turn (rows of ``vectors``, aligned with ``seqs``)."""
        if len(seqs) != len(vectors):
            raise ConfigError(f"{len(seqs)} seqs need as many vectors, got {len(vectors)}")
        matrix = np.ascontiguousarray(vectors, dtype=np.float32)
        with transaction(self._conn) as conn:
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
        """The seqs (> ``after``) with a vector from ``model`` and their vectors, in seq order."""
        rows = self._conn.execute(
            "SELECT seq, vector FROM turn_vectors WHERE session_id = ? AND model = ? AND seq > ?"
            " ORDER BY seq",
            (session_id, model, after),
        ).fetchall()
        if not rows:
            return [], np.zeros((0, 0), dtype=np.float32)
        matrix = np.stack([np.frombuffer(r[1], dtype=np.float32) for r in rows])
        return [int(r[0]) for r in rows], matrix

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
        self, session_id: str, query: str, limit: int = 10
    ) -> list[tuple[int, float]]:
        """Like ``search_turns`` but only (seq, score) pairs: the fast path for ranking."""
        match = _fts_query(query, "content_text", session_id)
        if match is None:
            return []
        rows = self._conn.execute(
            "SELECT t.seq, -bm25(turns_fts, 1, 0) FROM turns_fts JOIN turns t ON t.id ="
            " turns_fts.rowid WHERE turns_fts MATCH ? AND t.session_id = ?"
            " ORDER BY bm25(turns_fts, 1, 0), t.seq LIMIT ?",
            (match, session_id, limit),
        )
        return [(int(r[0]), float(r[1])) for r in rows]

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

    def turn_hash(self, session_id: str, seq: int) -> str | None:
        """The content hash of one turn (``None`` when it is not stored)."""
        row = self._conn.execute(
            "SELECT content_hash FROM turns WHERE session_id = ? AND seq = ?", (session_id, seq)
        ).fetchone()
        return None if row is None else str(row[0])

    def turn_times(self, session_id: str, seqs: Sequence[int]) -> dict[int, datetime]:
        """When each given turn was said (seqs not stored are left out)."""
        found: dict[int, datetime] = {}
        for start in range(0, len(seqs), 500):
            chunk = list(seqs[start : start + 500])
            marks = ",".join("?" * len(chunk))
            for seq, stamp in self._conn.execute(
                f"SELECT seq, created_at FROM turns WHERE session_id = ? AND seq IN ({marks})",
                (session_id, *chunk),
            ):
                found[seq] = datetime.fromisoformat(stamp)
        return found

    def turn_token_counts(self, session_id: str, seqs: Sequence[int]) -> dict[int, int]:
        """The token count of each given turn (seqs not stored are left out)."""
        found: dict[int, int] = {}
        for start in range(0, len(seqs), 500):
            chunk = list(seqs[start : start + 500])
            marks = ",".join("?" * len(chunk))
            found.update(
                self._conn.execute(
                    f"SELECT seq, token_count FROM turns WHERE session_id = ? AND seq IN ({marks})",
                    (session_id, *chunk),
                ).fetchall()
            )
        return found

    def turn_rows(self, session_id: str, seqs: Sequence[int]) -> dict[int, TurnRow]:
        """Role, text, time and token count of the given turns, without parsing messages."""
        found: dict[int, TurnRow] = {}
        for start in range(0, len(seqs), 500):
            chunk = list(seqs[start : start + 500])
            marks = ",".join("?" * len(chunk))
            for r in self._conn.execute(
                "SELECT seq, role, content_text, created_at, token_count FROM turns"
                f" WHERE session_id = ? AND seq IN ({marks})",
                (session_id, *chunk),
            ):
                found[r[0]] = TurnRow(r[0], r[1], r[2], datetime.fromisoformat(r[3]), r[4])
        return found

    def search_segments(
        self, session_id: str, query: str, limit: int = 10
    ) -> list[tuple[StoredSegment, float]]:
        """Segments whose summary matches any word of ``query``, best first, with ``-bm25()``."""
        match = _fts_query(query, "summary", session_id)
        if match is None:
            return []
        rows = self._conn.execute(
            "SELECT s.id, -bm25(segments_fts, 1, 0) AS score FROM segments_fts JOIN segments s"
            " ON s.id = segments_fts.rowid WHERE segments_fts MATCH ? AND s.session_id = ?"
            " ORDER BY bm25(segments_fts, 1, 0), s.first_seq LIMIT ?",
            (match, session_id, limit),
        ).fetchall()
        by_id = {s.id: s for s in self._segments(session_id, [r[0] for r in rows])}
        return [(by_id[r[0]], float(r[1])) for r in rows]

    # -- compaction and segments ----------------------------------------------------------------

    def compact(
        self,
        session_id: str,
        segments: Sequence[NewSegment],
        watermark: int,
        *,
        _before_commit: Callable[[], None] | None = None,
    ) -> list[int]:
        """Store ``segments`` and move the session's watermark to ``watermark`` in ONE
        transaction; returns the new segment ids. Raw turns are never touched.

        ``watermark`` may not go below the current one nor beyond the last turn + 1 (turns
        below it are compacted); every segment must lie within ``[current, watermark)``.
        ``_before_commit`` (tests only) runs after the segments are inserted and before the
        watermark moves."""
        try:
            with transaction(self._conn) as conn:
                row = conn.execute(
                    "SELECT compaction_watermark FROM sessions WHERE id = ?", (session_id,)
                ).fetchone()
                if row is None:
                    raise ConfigError(f"unknown session {session_id!r}")
                current, last = int(row[0]), self._last_seq(conn, session_id)
                self._check_compaction(current, last, segments, watermark)
                ids = [self._insert_segment(conn, session_id, seg) for seg in segments]
                if _before_commit is not None:
                    _before_commit()
                conn.execute(
                    "UPDATE sessions SET compaction_watermark = ? WHERE id = ?",
                    (watermark, session_id),
                )
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"compaction of session {session_id!r} failed: {exc}") from exc
        return ids

    @staticmethod
    def _check_compaction(
        current: int, last: int, segments: Sequence[NewSegment], watermark: int
    ) -> None:
        if watermark < current:
            raise ConfigError(
                f"the compaction watermark only moves forward: {watermark} < current {current}"
            )
        if watermark > last + 1:
            raise ConfigError(
                f"watermark {watermark} is beyond the last turn ({last}); at most {last + 1}"
            )
        for seg in segments:
            if not max(current, 1) <= seg.first_seq <= seg.last_seq < watermark:
                raise ConfigError(
                    f"segment {seg.first_seq}..{seg.last_seq} is not within the turns being "
                    f"compacted ({max(current, 1)}..{watermark - 1})"
                )

    def _insert_segment(self, conn: sqlite3.Connection, session_id: str, seg: NewSegment) -> int:
        summary_tokens = seg.summary_tokens
        if summary_tokens is None:
            summary_tokens = self.counter.count(seg.summary)
        full_tokens = seg.full_tokens
        if full_tokens is None:
            full_tokens = self.counter.count(seg.full_text)
        cursor = conn.execute(
            "INSERT INTO segments (session_id, first_seq, last_seq, summary, full_text, tags,"
            " related_tags, summary_tokens, full_tokens, created_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                session_id,
                seg.first_seq,
                seg.last_seq,
                seg.summary,
                seg.full_text,
                json.dumps(list(seg.tags)),
                json.dumps(list(seg.related_tags)),
                summary_tokens,
                full_tokens,
                _iso(_now()),
            ),
        )
        segment_id = int(cursor.lastrowid or 0)
        conn.executemany(
            "INSERT INTO segment_turns (segment_id, seq) VALUES (?, ?)",
            [(segment_id, seq) for seq in range(seg.first_seq, seg.last_seq + 1)],
        )
        return segment_id

    def segments(self, session_id: str) -> list[StoredSegment]:
        """The session's segments, earliest first."""
        return self._segments(session_id, None)

    def _segments(self, session_id: str, ids: Sequence[int] | None) -> list[StoredSegment]:
        if ids is not None and not ids:
            return []
        where = "" if ids is None else f" AND id IN ({','.join('?' * len(ids))})"
        rows = self._conn.execute(
            f"SELECT * FROM segments WHERE session_id = ?{where} ORDER BY first_seq, id",
            (session_id, *(ids or ())),
        ).fetchall()
        seqs: dict[int, list[int]] = {}
        for r in self._conn.execute(
            "SELECT st.segment_id, st.seq FROM segment_turns st JOIN segments s"
            " ON s.id = st.segment_id WHERE s.session_id = ? ORDER BY st.segment_id, st.seq",
            (session_id,),
        ):
            seqs.setdefault(r[0], []).append(r[1])
        return [
            StoredSegment(
                id=r["id"],
                session_id=r["session_id"],
                first_seq=r["first_seq"],
                last_seq=r["last_seq"],
                summary=r["summary"],
                full_text=r["full_text"],
                tags=tuple(json.loads(r["tags"])),
                related_tags=tuple(json.loads(r["related_tags"])),
                summary_tokens=r["summary_tokens"],
                full_tokens=r["full_tokens"],
                created_at=datetime.fromisoformat(r["created_at"]),
                seqs=tuple(seqs.get(r["id"], ())),
            )
            for r in rows
        ]

    # -- tag summaries --------------------------------------------------------------------------

    def upsert_tag_summary(
        self,
        session_id: str,
        tag: str,
        summary: str,
        source_watermark: int,
        *,
        tokens: int | None = None,
    ) -> None:
        """Store the one summary of ``tag``, covering its turns up to ``source_watermark``."""
        count = self.counter.count(summary) if tokens is None else tokens
        with transaction(self._conn) as conn:
            conn.execute(
                "INSERT INTO tag_summaries (session_id, tag, summary, tokens, source_watermark,"
                " updated_at) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (session_id, tag) DO UPDATE"
                " SET summary = excluded.summary, tokens = excluded.tokens,"
                " source_watermark = excluded.source_watermark, updated_at = excluded.updated_at",
                (session_id, tag, summary, count, source_watermark, _iso(_now())),
            )

    def tag_summaries(self, session_id: str) -> dict[str, TagSummary]:
        """The session's tag summaries by tag, each flagged ``stale`` when its tag has a turn
        after its ``source_watermark``."""
        rows = self._conn.execute(
            "SELECT ts.*, EXISTS (SELECT 1 FROM turn_tags tt WHERE tt.session_id = ts.session_id"
            " AND tt.tag = ts.tag AND tt.related = 0 AND tt.seq > ts.source_watermark) AS stale"
            " FROM tag_summaries ts WHERE ts.session_id = ? ORDER BY ts.tag",
            (session_id,),
        )
        return {
            r["tag"]: TagSummary(
                session_id=r["session_id"],
                tag=r["tag"],
                summary=r["summary"],
                tokens=r["tokens"],
                source_watermark=r["source_watermark"],
                stale=bool(r["stale"]),
            )
            for r in rows
        }

    # -- aliases --------------------------------------------------------------------------------

    def set_alias(self, alias: str, canonical: str) -> None:
        with transaction(self._conn) as conn:
            conn.execute(
                "INSERT INTO aliases (alias, canonical) VALUES (?, ?)"
                " ON CONFLICT (alias) DO UPDATE SET canonical = excluded.canonical",
                (alias, canonical),
            )

    def aliases(self) -> dict[str, str]:
        rows = self._conn.execute("SELECT alias, canonical FROM aliases ORDER BY alias")
        return {r[0]: r[1] for r in rows}

    # -- working set ----------------------------------------------------------------------------

    def set_working_set(
        self,
        session_id: str,
        tag: str,
        depth: Depth,
        tokens: int,
        *,
        last_used: datetime | None = None,
    ) -> None:
        """Record the depth a topic is paged in at (``last_used`` defaults to now)."""
        try:
            with transaction(self._conn) as conn:
                conn.execute(
                    "INSERT INTO working_set (session_id, tag, depth, last_used, tokens)"
                    " VALUES (?, ?, ?, ?, ?) ON CONFLICT (session_id, tag) DO UPDATE SET"
                    " depth = excluded.depth, last_used = excluded.last_used,"
                    " tokens = excluded.tokens",
                    (session_id, tag, depth, _iso(last_used or _now()), tokens),
                )
        except sqlite3.IntegrityError as exc:
            raise ConfigError(
                f"cannot set topic {tag!r} of session {session_id!r} to depth {depth!r}: {exc}"
            ) from exc

    def working_set(self, session_id: str) -> dict[str, WorkingSetEntry]:
        """The session's working set by tag, least recently used first."""
        rows = self._conn.execute(
            "SELECT tag, depth, last_used, tokens FROM working_set WHERE session_id = ?"
            " ORDER BY last_used, tag",
            (session_id,),
        )
        return {
            r["tag"]: WorkingSetEntry(
                tag=r["tag"],
                depth=r["depth"],
                last_used=datetime.fromisoformat(r["last_used"]),
                tokens=r["tokens"],
            )
            for r in rows
        }

    # -- costs ----------------------------------------------------------------------------------

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
    ) -> None:
        """Record one LLM call (``kind`` e.g. ``"tagging"``, ``"summary"``)."""
        with transaction(self._conn) as conn:
            conn.execute(
                "INSERT INTO cost_log (session_id, at, kind, model, prompt_tokens,"
                " completion_tokens, cost_usd) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    session_id,
                    _iso(at or _now()),
                    kind,
                    model,
                    prompt_tokens,
                    completion_tokens,
                    cost_usd,
                ),
            )

    def cost_report(self, session_id: str | None = None) -> CostReport:
        """Sums over the whole log, or over one session's calls."""
        where, params = ("WHERE session_id = ?", (session_id,)) if session_id else ("", ())
        total = self._conn.execute(
            "SELECT COUNT(*), COALESCE(SUM(prompt_tokens), 0), COALESCE(SUM(completion_tokens),"
            f" 0), COALESCE(SUM(cost_usd), 0.0) FROM cost_log {where}",
            params,
        ).fetchone()
        by_kind = self._conn.execute(
            f"SELECT kind, SUM(cost_usd) FROM cost_log {where} GROUP BY kind ORDER BY kind",
            params,
        )
        return CostReport(
            calls=total[0],
            prompt_tokens=total[1],
            completion_tokens=total[2],
            cost_usd=total[3],
            by_kind={r[0]: r[1] for r in by_kind},
        )
