"""The PostgreSQL memory schema: ``MIGRATIONS``, the ordered registry of its migrations.

Each migration's function name is its permanent id, recorded in every database it has run
on: never rename one, never reorder them, and add changes only as a new ``m00N_…`` at the end.

- ``m001_create_memory`` — the tables of the SQLite store's schema as it stands after its
  ``m005`` (sessions with principal, branch and derived seq; raw turns with match key and
  partial flag; tags, vectors, segments, tag summaries, aliases, working set, cost log,
  jobs); a plpgsql trigger refuses an ``UPDATE`` or ``DELETE`` of a turn unless
  ``turn_deletions`` names its session (only ``delete_session`` writes it, inside its own
  transaction, so no other transaction ever sees the row).
- ``m002_full_text`` — the full-text index of ``store/postgres/fts.py``: each row's terms with
  their token positions (``turn_terms``, ``segment_terms``), each row's token count, and the
  table-wide totals FTS5's bm25 needs, as sharded counters (``fts_totals``: writers of
  different sessions mostly update different rows, and a search sums the shards).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from contextfold.store.postgres.connection import PgMigrationRegistry

if TYPE_CHECKING:
    import psycopg

__all__ = ["FTS_SHARDS", "IMMUTABLE_TURNS", "MIGRATIONS", "m001_create_memory", "m002_full_text"]

MIGRATIONS = PgMigrationRegistry("memory")

IMMUTABLE_TURNS = "raw turns are append-only: a turn is never updated or deleted"
#: Rows per table in ``fts_totals``: a session's counts go to shard ``hash(id) % FTS_SHARDS``.
FTS_SHARDS = 16


@MIGRATIONS.migration
def m001_create_memory(conn: psycopg.Connection[Any]) -> None:
    statements = [
        "CREATE TABLE sessions ("
        " id TEXT PRIMARY KEY, created_at TIMESTAMPTZ NOT NULL,"
        " metadata TEXT NOT NULL DEFAULT '{}',"
        " compaction_watermark INTEGER NOT NULL DEFAULT 0,"
        " principal TEXT NOT NULL DEFAULT '', parent_id TEXT, fork_seq INTEGER,"
        " derived_seq INTEGER NOT NULL DEFAULT 0)",
        "CREATE INDEX sessions_by_principal ON sessions (principal)",
        "CREATE TABLE turns ("
        " id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
        " session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,"
        " seq INTEGER NOT NULL CHECK (seq >= 1), role TEXT NOT NULL,"
        " content_text TEXT NOT NULL, message_json TEXT NOT NULL, content_hash TEXT NOT NULL,"
        " created_at TIMESTAMPTZ NOT NULL, token_count INTEGER NOT NULL,"
        " match_key TEXT NOT NULL DEFAULT '', partial BOOLEAN NOT NULL DEFAULT FALSE,"
        " UNIQUE (session_id, seq))",
        "CREATE INDEX turns_by_key ON turns (match_key)",
        "CREATE TABLE turn_deletions (session_id TEXT PRIMARY KEY)",
        "CREATE FUNCTION turns_append_only() RETURNS trigger LANGUAGE plpgsql AS $$"
        " BEGIN"
        "  IF TG_OP = 'DELETE' AND EXISTS"
        "   (SELECT 1 FROM turn_deletions WHERE session_id = OLD.session_id) THEN"
        "   RETURN OLD;"
        "  END IF;"
        f"  RAISE EXCEPTION '{IMMUTABLE_TURNS} (use delete_session)'"
        "   USING ERRCODE = 'restrict_violation';"
        " END $$",
        "CREATE TRIGGER turns_append_only BEFORE UPDATE OR DELETE ON turns"
        " FOR EACH ROW EXECUTE FUNCTION turns_append_only()",
        "CREATE TABLE turn_tags ("
        " session_id TEXT NOT NULL, seq INTEGER NOT NULL, tag TEXT NOT NULL,"
        " weight DOUBLE PRECISION NOT NULL DEFAULT 1.0,"
        " related BOOLEAN NOT NULL DEFAULT FALSE, PRIMARY KEY (session_id, seq, tag),"
        " FOREIGN KEY (session_id, seq) REFERENCES turns(session_id, seq) ON DELETE CASCADE)",
        "CREATE INDEX turn_tags_by_tag ON turn_tags (session_id, tag, seq)",
        "CREATE TABLE turn_vectors ("
        " session_id TEXT NOT NULL, seq INTEGER NOT NULL, model TEXT NOT NULL,"
        " vector BYTEA NOT NULL, PRIMARY KEY (session_id, model, seq),"
        " FOREIGN KEY (session_id, seq) REFERENCES turns(session_id, seq) ON DELETE CASCADE)",
        "CREATE TABLE segments ("
        " id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
        " session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,"
        " first_seq INTEGER NOT NULL, last_seq INTEGER NOT NULL, summary TEXT NOT NULL,"
        " full_text TEXT NOT NULL, tags TEXT NOT NULL DEFAULT '[]',"
        " related_tags TEXT NOT NULL DEFAULT '[]',"
        " summary_tokens INTEGER NOT NULL, full_tokens INTEGER NOT NULL,"
        " created_at TIMESTAMPTZ NOT NULL, CHECK (first_seq <= last_seq))",
        "CREATE INDEX segments_by_session ON segments (session_id, first_seq)",
        "CREATE TABLE segment_turns ("
        " segment_id BIGINT NOT NULL REFERENCES segments(id) ON DELETE CASCADE,"
        " seq INTEGER NOT NULL, PRIMARY KEY (segment_id, seq))",
        "CREATE TABLE tag_summaries ("
        " session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,"
        " tag TEXT NOT NULL, summary TEXT NOT NULL, tokens INTEGER NOT NULL,"
        " source_watermark INTEGER NOT NULL, updated_at TIMESTAMPTZ NOT NULL,"
        " PRIMARY KEY (session_id, tag))",
        "CREATE TABLE aliases (alias TEXT PRIMARY KEY, canonical TEXT NOT NULL)",
        "CREATE TABLE working_set ("
        " session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,"
        " tag TEXT NOT NULL,"
        " depth TEXT NOT NULL CHECK (depth IN ('none', 'summary', 'segments', 'full')),"
        " last_used TIMESTAMPTZ NOT NULL, tokens INTEGER NOT NULL DEFAULT 0,"
        " PRIMARY KEY (session_id, tag))",
        "CREATE TABLE cost_log ("
        " id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
        " session_id TEXT REFERENCES sessions(id) ON DELETE SET NULL,"
        " at TIMESTAMPTZ NOT NULL, kind TEXT NOT NULL, model TEXT NOT NULL,"
        " prompt_tokens INTEGER NOT NULL, completion_tokens INTEGER NOT NULL,"
        " cost_usd DOUBLE PRECISION NOT NULL)",
        "CREATE TABLE jobs ("
        " id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
        " session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,"
        " kind TEXT NOT NULL,"
        " state TEXT NOT NULL DEFAULT 'pending'"
        " CHECK (state IN ('pending', 'running', 'failed')),"
        " attempts INTEGER NOT NULL DEFAULT 0, owner TEXT, lease_until DOUBLE PRECISION,"
        " error TEXT, created_at TIMESTAMPTZ NOT NULL)",
        # At most one pending job of a kind per session (a second would find nothing to do).
        "CREATE UNIQUE INDEX jobs_one_pending ON jobs (session_id, kind) WHERE state = 'pending'",
        "CREATE INDEX jobs_by_state ON jobs (state, id)",
    ]
    for statement in statements:
        conn.execute(statement)


@MIGRATIONS.migration
def m002_full_text(conn: psycopg.Connection[Any]) -> None:
    statements = [
        # The session id's token count: FTS5 indexes it as the rows' second column.
        "ALTER TABLE sessions ADD COLUMN id_tokens INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE turns ADD COLUMN text_tokens INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE segments ADD COLUMN text_tokens INTEGER NOT NULL DEFAULT 0",
        "CREATE TABLE turn_terms ("
        " session_id TEXT NOT NULL, seq INTEGER NOT NULL, term TEXT NOT NULL,"
        " positions INTEGER[] NOT NULL, PRIMARY KEY (session_id, term, seq),"
        " FOREIGN KEY (session_id, seq) REFERENCES turns(session_id, seq) ON DELETE CASCADE)",
        "CREATE INDEX turn_terms_by_term ON turn_terms (term)",
        "CREATE INDEX turn_terms_by_turn ON turn_terms (session_id, seq)",
        "CREATE TABLE segment_terms ("
        " segment_id BIGINT NOT NULL REFERENCES segments(id) ON DELETE CASCADE,"
        " session_id TEXT NOT NULL, term TEXT NOT NULL, positions INTEGER[] NOT NULL,"
        " PRIMARY KEY (segment_id, term))",
        "CREATE INDEX segment_terms_by_session ON segment_terms (session_id, term)",
        "CREATE INDEX segment_terms_by_term ON segment_terms (term)",
        "CREATE TABLE fts_totals ("
        " tbl TEXT NOT NULL, shard INTEGER NOT NULL, n_rows BIGINT NOT NULL DEFAULT 0,"
        " n_tokens BIGINT NOT NULL DEFAULT 0, PRIMARY KEY (tbl, shard))",
    ]
    for statement in statements:
        conn.execute(statement)
    conn.execute(
        "INSERT INTO fts_totals (tbl, shard) SELECT t, s FROM unnest(ARRAY['turns', 'segments'])"
        " AS t, generate_series(0, %s - 1) AS s",
        (FTS_SHARDS,),
    )
