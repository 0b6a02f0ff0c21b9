"""The conversation-memory schema: ``MIGRATIONS``, the ordered registry of ``MemoryStore``'s
SQLite migrations.

Each migration's function name is its permanent id, recorded in every database it has run
on: never rename one, never reorder them, and add changes only as a new ``m00N_…`` at the end.

- ``m001_create_memory`` — sessions, raw turns (triggers refuse an ``UPDATE`` or ``DELETE``
  unless ``turn_deletions`` names the session), turn tags, segments, tag summaries, aliases,
  the working set and the cost log.
- ``m002_create_fts`` — FTS5 external-content indexes over turn text and segment summaries.
- ``m003_related_tags_and_vectors`` — related tags on turns and segments; turn vectors.
- ``m004_session_scoped_fts`` — the FTS5 indexes rebuilt with the session id as a column.
- ``m005_branches_and_jobs`` — sessions get a principal (whose credential wrote them), the
  branch they were forked from and how far their turns are derived; turns get a match key
  and a partial flag; the jobs table holds derived work (tags, vectors, compaction).
- ``m006_segment_ids_never_reused`` — segment ids are never reused (``segments``
  rebuilt with ``AUTOINCREMENT``, ids kept, with ``segment_turns``, the FTS triggers and
  index).
- ``m007_generations_and_records`` — sessions get ``born`` and ``generation`` (numbers drawn
  from one store-wide counter: when the session row is made, and again by every write that
  changes its derived state in place), so the caches of every process sharing the file can
  tell a session was rewritten; ``request_records`` keeps the dashboard's records.
- ``m008_response_links`` — the Responses API ids the proxy relayed (``previous_response_id``,
  ``conversation``), per principal, with the stored turn each names: a chain started through
  one process is continued through another.
- ``m009_scoped_aliases_and_splits`` — aliases scoped to one session (``session_aliases``)
  and the tags the splitter has examined (``tag_splits``: the sub-tags, none for a tag
  judged uniform), both gone with their session.
- ``m010_tag_stats`` — ``tag_stats``: per session and tag, the turns carrying it, how many
  of them are compacted (below the watermark) and the segments carrying it, kept by triggers
  on every write of a turn's tags or a segment and every move of the watermark, so a recall
  reads counts (one row per tag) instead of counting every tag row and segment of the
  session.
- ``m011_related_tag_stats`` — ``related_tag_stats``: per session and tag, the turns carrying
  it as a related tag, kept by triggers on every write of a turn's tags, so the inbound
  vocabulary reads one row per related tag instead of counting every related tag row of the
  session after each write.
- ``m012_turn_token_counts`` — an index of the turns' token counts by session and seq, so a
  recall's kept token counts (``turn_token_counts_after``) read the index alone, not every
  row of the turns' text (at 100k turns 150–360 ms through the table, on the loaded machine).
- ``m013_tag_stats_segment_last_seq`` — ``tag_stats.segment_last_seq``: each tag's newest
  segment (its ``last_seq``), kept by the segment trigger, and an index of segments by
  ``last_seq``, so "is any tag summary behind?" reads one row per tag, not every segment.
- ``m014_covering_indexes`` — narrow indexes that answer recall's reads without the turns'
  rows (full-text hits' seqs, a tag row's ``related`` flag, a candidate's time).
- ``m015_tool_call_keys`` — stored tool calls' match keys made again with ``message_key``
  (arguments set to false or null not read), so a call resent with a tool's unset options
  filled in is known as the stored one.
"""

from __future__ import annotations

import sqlite3

from contextfold.items import Message
from contextfold.store.models import match_key, message_key
from contextfold.store.sqlite import MigrationRegistry

__all__ = [
    "MIGRATIONS",
    "m001_create_memory",
    "m002_create_fts",
    "m003_related_tags_and_vectors",
    "m004_session_scoped_fts",
    "m005_branches_and_jobs",
    "m006_segment_ids_never_reused",
    "m007_generations_and_records",
    "m008_response_links",
    "m009_scoped_aliases_and_splits",
    "m010_tag_stats",
    "m011_related_tag_stats",
    "m012_turn_token_counts",
    "m013_tag_stats_segment_last_seq",
    "m014_covering_indexes",
    "m015_tool_call_keys",
]

MIGRATIONS = MigrationRegistry("memory")

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


@MIGRATIONS.migration
def m005_branches_and_jobs(conn: sqlite3.Connection) -> None:
    # A conversation is a tree of sessions: a branch (``parent_id``, ``fork_seq``) starts as a
    # copy of its parent's turns up to ``fork_seq``. ``principal`` is the keyed hash of the
    # credential that wrote the session ('' for the library's own sessions); a lookup never
    # crosses principals. Turns up to ``derived_seq`` are tagged and embedded; the rest wait
    # for a ``derive`` job.
    conn.execute("ALTER TABLE sessions ADD COLUMN principal TEXT NOT NULL DEFAULT ''")
    conn.execute("ALTER TABLE sessions ADD COLUMN parent_id TEXT")
    conn.execute("ALTER TABLE sessions ADD COLUMN fork_seq INTEGER")
    conn.execute("ALTER TABLE sessions ADD COLUMN derived_seq INTEGER NOT NULL DEFAULT 0")
    conn.execute(
        "UPDATE sessions SET derived_seq ="
        " (SELECT COALESCE(MAX(seq), 0) FROM turns WHERE session_id = sessions.id)"
    )
    conn.execute("CREATE INDEX sessions_by_principal ON sessions (principal)")
    conn.execute("ALTER TABLE turns ADD COLUMN match_key TEXT NOT NULL DEFAULT ''")
    conn.execute("ALTER TABLE turns ADD COLUMN partial INTEGER NOT NULL DEFAULT 0")
    # Raw turns refuse updates; the new key column of the rows already stored is filled in
    # here, with the guard lifted for this transaction only.
    conn.execute("DROP TRIGGER turns_no_update")
    conn.create_function("match_key", 2, match_key, deterministic=True)
    conn.execute("UPDATE turns SET match_key = match_key(role, content_text)")
    conn.execute(
        "CREATE TRIGGER turns_no_update BEFORE UPDATE ON turns"
        f" BEGIN SELECT RAISE(ABORT, '{_IMMUTABLE_TURNS}'); END"
    )
    conn.execute("CREATE INDEX turns_by_key ON turns (match_key)")
    conn.execute(
        "CREATE TABLE jobs ("
        " id INTEGER PRIMARY KEY AUTOINCREMENT,"
        " session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,"
        " kind TEXT NOT NULL,"
        " state TEXT NOT NULL DEFAULT 'pending'"
        " CHECK (state IN ('pending', 'running', 'failed')),"
        " attempts INTEGER NOT NULL DEFAULT 0, owner TEXT, lease_until REAL,"
        " error TEXT, created_at TEXT NOT NULL)"
    )
    # At most one pending job of a kind per session: a job derives everything the session
    # has not derived yet, so a second one would find nothing to do.
    conn.execute(
        "CREATE UNIQUE INDEX jobs_one_pending ON jobs (session_id, kind) WHERE state = 'pending'"
    )
    conn.execute("CREATE INDEX jobs_by_state ON jobs (state, id)")


#: The columns of ``segments`` as m001 and m003 left them, in their order.
_SEGMENT_COLUMNS = (
    "id, session_id, first_seq, last_seq, summary, full_text, tags, summary_tokens,"
    " full_tokens, created_at, related_tags"
)


@MIGRATIONS.migration
def m006_segment_ids_never_reused(conn: sqlite3.Connection) -> None:
    # Segment ids never come back: a plain INTEGER PRIMARY KEY hands the largest id out again
    # once its row is deleted (a session's newest segment, with ``delete_session``). SQLite
    # cannot add AUTOINCREMENT to a table, so ``segments`` is rebuilt with its ids. Its rows
    # and those of ``segment_turns`` (which references it, ON DELETE CASCADE) are first set
    # aside and both tables dropped, child first: with foreign keys on, dropping ``segments``
    # while ``segment_turns`` referenced it would cascade to its rows. Dropping ``segments``
    # drops its FTS triggers too; the external-content index ``segments_fts`` is keyed by
    # the kept ids and is rebuilt from the new table all the same.
    conn.execute(f"CREATE TEMP TABLE m006_segments AS SELECT {_SEGMENT_COLUMNS} FROM segments")
    conn.execute(
        "CREATE TEMP TABLE m006_segment_turns AS SELECT segment_id, seq FROM segment_turns"
    )
    conn.execute("DROP TABLE segment_turns")
    conn.execute("DROP TABLE segments")
    conn.execute(
        "CREATE TABLE segments ("
        " id INTEGER PRIMARY KEY AUTOINCREMENT,"
        " session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,"
        " first_seq INTEGER NOT NULL, last_seq INTEGER NOT NULL, summary TEXT NOT NULL,"
        " full_text TEXT NOT NULL, tags TEXT NOT NULL DEFAULT '[]',"
        " summary_tokens INTEGER NOT NULL, full_tokens INTEGER NOT NULL,"
        " created_at TEXT NOT NULL, related_tags TEXT NOT NULL DEFAULT '[]',"
        " CHECK (first_seq <= last_seq))"
    )
    conn.execute("CREATE INDEX segments_by_session ON segments (session_id, first_seq)")
    conn.execute(
        "CREATE TABLE segment_turns ("
        " segment_id INTEGER NOT NULL REFERENCES segments(id) ON DELETE CASCADE,"
        " seq INTEGER NOT NULL, PRIMARY KEY (segment_id, seq))"
    )
    # Ids inserted as they were; AUTOINCREMENT's counter starts past the largest.
    conn.execute(
        f"INSERT INTO segments ({_SEGMENT_COLUMNS})"
        f" SELECT {_SEGMENT_COLUMNS} FROM temp.m006_segments ORDER BY id"
    )
    conn.execute(
        "INSERT INTO segment_turns (segment_id, seq)"
        " SELECT segment_id, seq FROM temp.m006_segment_turns ORDER BY segment_id, seq"
    )
    conn.execute("DROP TABLE temp.m006_segments")
    conn.execute("DROP TABLE temp.m006_segment_turns")
    columns, new, old = (
        "summary, session_id",
        "NEW.summary, NEW.session_id",
        "OLD.summary, OLD.session_id",
    )
    conn.execute(
        "CREATE TRIGGER segments_fts_ai AFTER INSERT ON segments BEGIN"
        f" INSERT INTO segments_fts (rowid, {columns}) VALUES (NEW.id, {new}); END"
    )
    conn.execute(
        "CREATE TRIGGER segments_fts_ad AFTER DELETE ON segments BEGIN"
        f" INSERT INTO segments_fts (segments_fts, rowid, {columns})"
        f" VALUES ('delete', OLD.id, {old}); END"
    )
    conn.execute(
        "CREATE TRIGGER segments_fts_au AFTER UPDATE ON segments BEGIN"
        f" INSERT INTO segments_fts (segments_fts, rowid, {columns})"
        f" VALUES ('delete', OLD.id, {old});"
        f" INSERT INTO segments_fts (rowid, {columns}) VALUES (NEW.id, {new}); END"
    )
    conn.execute("INSERT INTO segments_fts (segments_fts) VALUES ('rebuild')")


def _bump(session: str) -> str:
    """The trigger body that draws a new generation for ``session`` (NEW.x / OLD.x)."""
    return (
        "UPDATE store_counters SET value = value + 1 WHERE name = 'generation';"
        " UPDATE sessions SET generation ="
        " (SELECT value FROM store_counters WHERE name = 'generation')"
        f" WHERE id = {session};"
    )


@MIGRATIONS.migration
def m007_generations_and_records(conn: sqlite3.Connection) -> None:
    # One store-wide counter: a session row gets ``born`` (never changed, never drawn twice,
    # so a session deleted and written again under the same id is told apart) and
    # ``generation`` (drawn again by every write that changes its tags, segments, watermark
    # or tag summaries in place). Appends (turns, vectors) draw nothing: a cache follows them
    # by reading what was stored after the last seq it holds.
    conn.execute("CREATE TABLE store_counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL)")
    conn.execute("ALTER TABLE sessions ADD COLUMN born INTEGER NOT NULL DEFAULT 0")
    conn.execute("ALTER TABLE sessions ADD COLUMN generation INTEGER NOT NULL DEFAULT 0")
    conn.execute("UPDATE sessions SET born = rowid, generation = rowid")
    conn.execute(
        "INSERT INTO store_counters (name, value) VALUES"
        " ('generation', (SELECT COALESCE(MAX(rowid), 0) FROM sessions)), ('records', 0)"
    )
    conn.execute(
        "CREATE TRIGGER sessions_born AFTER INSERT ON sessions BEGIN"
        " UPDATE store_counters SET value = value + 1 WHERE name = 'generation';"
        " UPDATE sessions SET born = (SELECT value FROM store_counters WHERE name = 'generation'),"
        " generation = (SELECT value FROM store_counters WHERE name = 'generation')"
        " WHERE id = NEW.id; END"
    )
    conn.execute(
        "CREATE TRIGGER sessions_watermark AFTER UPDATE OF compaction_watermark ON sessions"
        f" BEGIN {_bump('NEW.id')} END"
    )
    for table in ("turn_tags", "segments", "tag_summaries"):
        conn.execute(
            f"CREATE TRIGGER {table}_gen_ai AFTER INSERT ON {table}"
            f" BEGIN {_bump('NEW.session_id')} END"
        )
        conn.execute(
            f"CREATE TRIGGER {table}_gen_au AFTER UPDATE ON {table}"
            f" BEGIN {_bump('NEW.session_id')} END"
        )
        conn.execute(
            f"CREATE TRIGGER {table}_gen_ad AFTER DELETE ON {table}"
            f" BEGIN {_bump('OLD.session_id')} END"
        )
    # The dashboard's request records, from every process: ``body`` is the record's JSON
    # (opaque here); ``pos`` orders them as first written (retention drops the lowest);
    # ``change`` is drawn from the ``records`` counter at each write, so a reader polls for
    # what changed after the last number it saw.
    conn.execute(
        "CREATE TABLE request_records ("
        " pos INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE,"
        " session_id TEXT NOT NULL, origin TEXT NOT NULL, change INTEGER NOT NULL,"
        " size INTEGER NOT NULL, body TEXT NOT NULL)"
    )
    conn.execute("CREATE INDEX request_records_by_change ON request_records (change)")
    conn.execute("CREATE INDEX request_records_by_session ON request_records (session_id, pos)")


@MIGRATIONS.migration
def m008_response_links(conn: sqlite3.Connection) -> None:
    # ``name``: a response id, or ``conversation:<id>``; (session_id, seq) the stored reply it
    # names and ``start`` the first turn of the chain the provider holds. Gone with the session.
    conn.execute(
        "CREATE TABLE response_links ("
        " principal TEXT NOT NULL, name TEXT NOT NULL,"
        " session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,"
        " seq INTEGER NOT NULL, start INTEGER NOT NULL, PRIMARY KEY (principal, name))"
    )
    conn.execute("CREATE INDEX response_links_by_session ON response_links (session_id)")


@MIGRATIONS.migration
def m009_scoped_aliases_and_splits(conn: sqlite3.Connection) -> None:
    # ``sub_tags``: a JSON list, empty when the tag was examined and judged uniform (each tag
    # is examined once).
    conn.execute(
        "CREATE TABLE session_aliases ("
        " session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,"
        " alias TEXT NOT NULL, canonical TEXT NOT NULL, PRIMARY KEY (session_id, alias))"
    )
    conn.execute(
        "CREATE TABLE tag_splits ("
        " session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,"
        " tag TEXT NOT NULL, sub_tags TEXT NOT NULL DEFAULT '[]', created_at TEXT NOT NULL,"
        " PRIMARY KEY (session_id, tag))"
    )
    # A change to either draws a new generation for its session: every process's cache of
    # them (keyed by the generation) sees it.
    for table in ("session_aliases", "tag_splits"):
        for suffix, event, row in (("ai", "INSERT", "NEW"), ("au", "UPDATE", "NEW")):
            conn.execute(
                f"CREATE TRIGGER {table}_gen_{suffix} AFTER {event} ON {table}"
                f" BEGIN {_bump(row + '.session_id')} END"
            )
        conn.execute(
            f"CREATE TRIGGER {table}_gen_ad AFTER DELETE ON {table}"
            f" BEGIN {_bump('OLD.session_id')} END"
        )


def _compacted(row: str) -> str:
    """1 when the tag row ``row`` (``NEW`` or ``OLD``) is below its session's watermark."""
    return (
        f"({row}.seq < COALESCE((SELECT compaction_watermark FROM sessions"
        f" WHERE id = {row}.session_id), 0))"
    )


@MIGRATIONS.migration
def m010_tag_stats(conn: sqlite3.Connection) -> None:
    # Tags proper only (``related = 0``), as ``tag_counts`` counts them. Rows at zero stay.
    conn.execute(
        "CREATE TABLE tag_stats ("
        " session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,"
        " tag TEXT NOT NULL, turns INTEGER NOT NULL DEFAULT 0,"
        " compacted INTEGER NOT NULL DEFAULT 0, segments INTEGER NOT NULL DEFAULT 0,"
        " PRIMARY KEY (session_id, tag))"
    )
    conn.execute(
        "INSERT INTO tag_stats (session_id, tag, turns, compacted)"
        " SELECT tt.session_id, tt.tag, COUNT(*), SUM(tt.seq < s.compaction_watermark)"
        " FROM turn_tags tt JOIN sessions s ON s.id = tt.session_id WHERE tt.related = 0"
        " GROUP BY tt.session_id, tt.tag"
    )
    conn.execute(
        "INSERT INTO tag_stats (session_id, tag, segments)"
        " SELECT g.session_id, j.value, COUNT(*) FROM segments g, json_each(g.tags) j"
        " WHERE true GROUP BY g.session_id, j.value"
        " ON CONFLICT (session_id, tag) DO UPDATE SET segments = excluded.segments"
    )
    conn.execute(
        "CREATE TRIGGER tag_stats_segment_ai AFTER INSERT ON segments BEGIN"
        " INSERT INTO tag_stats (session_id, tag, segments)"
        " SELECT NEW.session_id, j.value, 1 FROM json_each(NEW.tags) j WHERE true"
        " ON CONFLICT (session_id, tag) DO UPDATE SET segments = segments + 1; END"
    )
    conn.execute(
        "CREATE TRIGGER tag_stats_segment_ad AFTER DELETE ON segments BEGIN"
        " UPDATE tag_stats SET segments = segments - 1 WHERE session_id = OLD.session_id"
        " AND tag IN (SELECT j.value FROM json_each(OLD.tags) j); END"
    )
    add = (
        "INSERT INTO tag_stats (session_id, tag, turns, compacted)"
        f" SELECT NEW.session_id, NEW.tag, 1, {_compacted('NEW')} WHERE NEW.related = 0"
        " ON CONFLICT (session_id, tag) DO UPDATE"
        " SET turns = turns + 1, compacted = compacted + excluded.compacted;"
    )
    remove = (
        f"UPDATE tag_stats SET turns = turns - 1, compacted = compacted - {_compacted('OLD')}"
        " WHERE session_id = OLD.session_id AND tag = OLD.tag AND OLD.related = 0;"
    )
    conn.execute(f"CREATE TRIGGER tag_stats_ai AFTER INSERT ON turn_tags BEGIN {add} END")
    conn.execute(f"CREATE TRIGGER tag_stats_ad AFTER DELETE ON turn_tags BEGIN {remove} END")
    conn.execute(
        "CREATE TRIGGER tag_stats_au AFTER UPDATE OF session_id, seq, tag, related ON turn_tags"
        f" BEGIN {remove} {add} END"
    )
    # A watermark moved: the tags of the turns it passed over change sides.
    span = (
        "FROM turn_tags t WHERE t.session_id = NEW.id AND t.related = 0"
        " AND t.seq >= MIN(OLD.compaction_watermark, NEW.compaction_watermark)"
        " AND t.seq < MAX(OLD.compaction_watermark, NEW.compaction_watermark)"
    )
    conn.execute(
        "CREATE TRIGGER tag_stats_watermark AFTER UPDATE OF compaction_watermark ON sessions"
        " WHEN NEW.compaction_watermark != OLD.compaction_watermark BEGIN"
        " UPDATE tag_stats SET compacted = compacted"
        " + (CASE WHEN NEW.compaction_watermark > OLD.compaction_watermark THEN 1 ELSE -1 END)"
        f" * (SELECT COUNT(*) {span} AND t.tag = tag_stats.tag)"
        f" WHERE session_id = NEW.id AND tag IN (SELECT t.tag {span}); END"
    )


@MIGRATIONS.migration
def m011_related_tag_stats(conn: sqlite3.Connection) -> None:
    # Related tags only (``related = 1``), as ``related_tag_counts`` counts them. Rows at zero
    # stay (and are not read).
    conn.execute(
        "CREATE TABLE related_tag_stats ("
        " session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,"
        " tag TEXT NOT NULL, turns INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (session_id, tag))"
    )
    conn.execute(
        "INSERT INTO related_tag_stats (session_id, tag, turns)"
        " SELECT session_id, tag, COUNT(*) FROM turn_tags WHERE related = 1"
        " GROUP BY session_id, tag"
    )
    add = (
        "INSERT INTO related_tag_stats (session_id, tag, turns)"
        " SELECT NEW.session_id, NEW.tag, 1 WHERE NEW.related = 1"
        " ON CONFLICT (session_id, tag) DO UPDATE SET turns = turns + 1;"
    )
    remove = (
        "UPDATE related_tag_stats SET turns = turns - 1"
        " WHERE session_id = OLD.session_id AND tag = OLD.tag AND OLD.related = 1;"
    )
    conn.execute(f"CREATE TRIGGER related_tag_stats_ai AFTER INSERT ON turn_tags BEGIN {add} END")
    conn.execute(
        f"CREATE TRIGGER related_tag_stats_ad AFTER DELETE ON turn_tags BEGIN {remove} END"
    )
    conn.execute(
        "CREATE TRIGGER related_tag_stats_au AFTER UPDATE OF session_id, seq, tag, related"
        f" ON turn_tags BEGIN {remove} {add} END"
    )


@MIGRATIONS.migration
def m012_turn_token_counts(conn: sqlite3.Connection) -> None:
    conn.execute("CREATE INDEX turns_token_counts ON turns (session_id, seq, token_count)")


@MIGRATIONS.migration
def m013_tag_stats_segment_last_seq(conn: sqlite3.Connection) -> None:
    # A deleted segment leaves the value as it was (segments go only with their session): an
    # upper bound, so a check against it may read segments for nothing, never miss one.
    conn.execute("ALTER TABLE tag_stats ADD COLUMN segment_last_seq INTEGER")
    conn.execute(
        "UPDATE tag_stats SET segment_last_seq = (SELECT MAX(g.last_seq)"
        " FROM segments g, json_each(g.tags) j"
        " WHERE g.session_id = tag_stats.session_id AND j.value = tag_stats.tag)"
    )
    conn.execute("DROP TRIGGER tag_stats_segment_ai")
    conn.execute(
        "CREATE TRIGGER tag_stats_segment_ai AFTER INSERT ON segments BEGIN"
        " INSERT INTO tag_stats (session_id, tag, segments, segment_last_seq)"
        " SELECT NEW.session_id, j.value, 1, NEW.last_seq FROM json_each(NEW.tags) j WHERE true"
        " ON CONFLICT (session_id, tag) DO UPDATE SET segments = segments + 1,"
        " segment_last_seq = MAX(COALESCE(segment_last_seq, excluded.segment_last_seq),"
        " excluded.segment_last_seq); END"
    )
    conn.execute("CREATE INDEX segments_by_last_seq ON segments (session_id, last_seq)")


@MIGRATIONS.migration
def m014_covering_indexes(conn: sqlite3.Connection) -> None:
    # Recall's reads answered from narrow indexes instead of one lookup in ``turns`` (rows of
    # ~0.5 KB: at 100k turns few stay in the page cache) or ``turn_tags`` per row: the session
    # and seq of each full-text hit (``memory_fts``: ``INDEXED BY turns_fts_lookup``), a tag
    # row's ``related`` flag (``tag_overlap_top``) and a candidate's time beside its token
    # count (``turn_times``). Measured at 100k turns: the full-text query 3.4 -> 2.6 ms, the
    # tag signal 2.4 -> 1.6 ms, the times of 3,000 candidates 8.7 -> 4.4 ms.
    conn.execute("CREATE INDEX turns_fts_lookup ON turns (id, session_id, seq)")
    conn.execute("DROP INDEX turn_tags_by_tag")
    conn.execute("CREATE INDEX turn_tags_by_tag ON turn_tags (session_id, tag, seq, related)")
    conn.execute("DROP INDEX turns_token_counts")
    conn.execute(
        "CREATE INDEX turns_token_counts ON turns (session_id, seq, token_count, created_at)"
    )


def _stored_message_key(message_json: str) -> str:
    return message_key(Message.model_validate_json(message_json))


@MIGRATIONS.migration
def m015_tool_call_keys(conn: sqlite3.Connection) -> None:
    # A tool call's match key no longer reads the arguments set to false or null
    # (``message_key``: a client resends a call with the tool's unset options filled in, and
    # each such call forked its conversation). The keys of stored calls are made again that
    # way, with the guard on raw turns lifted for this transaction only.
    conn.execute("DROP TRIGGER turns_no_update")
    conn.create_function("message_key", 1, _stored_message_key, deterministic=True)
    conn.execute(
        "UPDATE turns SET match_key = message_key(message_json)"
        " WHERE role = 'assistant' AND message_json LIKE '%\"tool_use\"%'"
    )
    conn.execute(
        "CREATE TRIGGER turns_no_update BEFORE UPDATE ON turns"
        f" BEGIN SELECT RAISE(ABORT, '{_IMMUTABLE_TURNS}'); END"
    )
