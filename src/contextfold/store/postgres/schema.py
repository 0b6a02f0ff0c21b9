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
  different sessions mostly update different rows, and a search sums the shards); and
  ``cf_append_turns``, the write of new turns as one server-side call (``_APPEND_TURNS``).
- ``m003_generations_records_links`` — sessions' ``born`` and ``generation`` from one
  store-wide sequence (triggers draw them), the dashboard's ``request_records`` and the
  Responses API's ``response_links``, as the SQLite store's ``m007``/``m008``.
- ``m004_set_tags_in_one_call`` — ``cf_set_tags``: a turn's tags replaced in one call.
- ``m005_live_tokens`` — ``sessions.live_tokens``, the tokens of the turns at or above the
  compaction watermark, kept as turns are appended (``cf_append_turns`` redefined) and
  counted again when the watermark moves (a trigger): ``active_tokens`` reads one row instead
  of summing every live turn.
- ``m006_derive_in_one_call`` — appends from one JSON document (``cf_append_json``) and a
  derive done in line in two calls: ``cf_begin_derive`` (the new turns appended, the pending
  job dropped, the session and the turns to derive read) and ``cf_write_derived`` (the tags,
  ``derived_seq`` and the generations around them).
- ``m007_tag_stats`` — ``tag_stats`` (the SQLite store's ``m010``): per session and tag, the
  turns carrying it, how many are compacted and the segments carrying it, kept by triggers
  (on tags per statement, over its transition rows) on every write of tags or segments and
  every move of the watermark.
- ``m008_scoped_aliases_and_splits`` — ``session_aliases`` and ``tag_splits``, as the SQLite
  store's ``m009``.
- ``m009_related_tag_stats`` — ``related_tag_stats`` (the SQLite store's ``m011``): per
  session and tag, the turns carrying it as a related tag, kept by triggers on tags (per
  statement, over its transition rows).
- ``m010_tag_stats_segment_last_seq`` — ``tag_stats.segment_last_seq`` (the SQLite store's
  ``m013``): per session and tag, the newest ``last_seq`` of the segments carrying it, kept by
  the segment trigger and filled from the segments a database holds; and the index
  ``segments_by_last_seq``.
- ``m011_tool_call_keys`` — stored tool calls' match keys made again with ``message_key``
  (the SQLite store's ``m015``): the arguments set to false or null are not read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from contextfold.store.postgres.pool import PgMigrationRegistry

if TYPE_CHECKING:
    import psycopg

__all__ = [
    "BRANCH_MOVED",
    "FTS_SHARDS",
    "IMMUTABLE_TURNS",
    "MIGRATIONS",
    "SESSION_COLUMNS",
    "UNKNOWN_SESSION",
    "m001_create_memory",
    "m002_full_text",
    "m003_generations_records_links",
    "m004_set_tags_in_one_call",
    "m005_live_tokens",
    "m006_derive_in_one_call",
    "m007_tag_stats",
    "m008_scoped_aliases_and_splits",
    "m009_related_tag_stats",
    "m010_tag_stats_segment_last_seq",
    "m011_tool_call_keys",
]

MIGRATIONS = PgMigrationRegistry("memory")

IMMUTABLE_TURNS = "raw turns are append-only: a turn is never updated or deleted"
#: The SQLSTATEs ``cf_append_turns`` raises: the session does not exist; its last seq is not
#: the expected one (the DETAIL holds the last seq).
UNKNOWN_SESSION = "CF001"
BRANCH_MOVED = "CF002"
#: The columns of ``sessions`` a ``SessionRecord`` is read from, in its fields' order.
SESSION_COLUMNS = (
    "id, created_at, metadata, compaction_watermark, principal, parent_id, fork_seq,"
    " derived_seq, born, generation"
)
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
        # No foreign key to turns: a key check per term row would cost more than the row;
        # only the store writes here, and ``delete_session`` deletes a session's terms. Each
        # term row repeats its row's token count (and a segment's its first seq), so a search
        # reads everything it ranks with from the terms table alone.
        "CREATE TABLE turn_terms ("
        " session_id TEXT NOT NULL, seq INTEGER NOT NULL, term TEXT NOT NULL,"
        " positions INTEGER[] NOT NULL, text_tokens INTEGER NOT NULL,"
        " PRIMARY KEY (session_id, term, seq))",
        "CREATE INDEX turn_terms_by_term ON turn_terms (term)",
        "CREATE TABLE segment_terms ("
        " segment_id BIGINT NOT NULL REFERENCES segments(id) ON DELETE CASCADE,"
        " session_id TEXT NOT NULL, term TEXT NOT NULL, positions INTEGER[] NOT NULL,"
        " text_tokens INTEGER NOT NULL, first_seq INTEGER NOT NULL,"
        " PRIMARY KEY (segment_id, term))",
        "CREATE INDEX segment_terms_by_session ON segment_terms (session_id, term)",
        "CREATE INDEX segment_terms_by_term ON segment_terms (term)",
        "CREATE TABLE fts_totals ("
        " tbl TEXT NOT NULL, shard INTEGER NOT NULL, n_rows BIGINT NOT NULL DEFAULT 0,"
        " n_tokens BIGINT NOT NULL DEFAULT 0, PRIMARY KEY (tbl, shard))",
    ]
    for statement in statements:
        conn.execute(statement)
    conn.execute(_APPEND_TURNS)
    conn.execute(
        "INSERT INTO fts_totals (tbl, shard) SELECT t, s FROM unnest(ARRAY['turns', 'segments'])"
        " AS t, generate_series(0, %s - 1) AS s",
        (FTS_SHARDS,),
    )


# Appending turns is the hot write (every exchange of every proxied conversation), and each
# statement is a round trip: this function does the whole append in one — lock the session
# row (seqs never collide, whichever process writes), check the expected last seq, insert the
# turns and their terms, add to the full-text totals and queue the derive job. The caller
# sends the turns as parallel arrays, their terms as (turn index, term, positions) arrays.
_APPEND_TURNS = f"""
CREATE FUNCTION cf_append_turns(
    p_session TEXT, p_expected INTEGER, p_enqueue TEXT, p_shard INTEGER,
    p_roles TEXT[], p_texts TEXT[], p_bodies TEXT[], p_hashes TEXT[],
    p_created TIMESTAMPTZ[], p_tokens INTEGER[], p_keys TEXT[], p_partial BOOLEAN[],
    p_text_tokens INTEGER[], p_term_turn INTEGER[], p_terms TEXT[], p_positions TEXT[]
) RETURNS INTEGER LANGUAGE plpgsql AS $$
DECLARE
    v_id_tokens INTEGER;
    v_last INTEGER;
    v_n INTEGER := COALESCE(array_length(p_roles, 1), 0);
BEGIN
    SELECT id_tokens INTO v_id_tokens FROM sessions WHERE id = p_session FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown session' USING ERRCODE = '{UNKNOWN_SESSION}';
    END IF;
    SELECT COALESCE(MAX(seq), 0) INTO v_last FROM turns WHERE session_id = p_session;
    IF p_expected IS NOT NULL AND v_last <> p_expected THEN
        RAISE EXCEPTION 'branch moved' USING ERRCODE = '{BRANCH_MOVED}', DETAIL = v_last::TEXT;
    END IF;
    IF v_n = 0 THEN
        RETURN v_last;
    END IF;
    INSERT INTO turns (session_id, seq, role, content_text, message_json, content_hash,
                       created_at, token_count, match_key, partial, text_tokens)
    SELECT p_session, v_last + i, p_roles[i], p_texts[i], p_bodies[i], p_hashes[i],
           p_created[i], p_tokens[i], p_keys[i], p_partial[i], p_text_tokens[i]
    FROM generate_series(1, v_n) AS i;
    INSERT INTO turn_terms (session_id, seq, term, positions, text_tokens)
    SELECT p_session, v_last + k, t, p::INTEGER[], p_text_tokens[k]
    FROM unnest(p_term_turn, p_terms, p_positions) AS u(k, t, p);
    UPDATE fts_totals
    SET n_rows = n_rows + v_n,
        n_tokens = n_tokens + v_n * v_id_tokens
                   + (SELECT COALESCE(SUM(x), 0) FROM unnest(p_text_tokens) AS x)
    WHERE tbl = 'turns' AND shard = p_shard;
    IF p_enqueue IS NOT NULL THEN
        INSERT INTO jobs (session_id, kind, created_at) VALUES (p_session, p_enqueue, now())
        ON CONFLICT (session_id, kind) WHERE state = 'pending' DO NOTHING;
    END IF;
    RETURN v_last;
END $$
"""


@MIGRATIONS.migration
def m003_generations_records_links(conn: psycopg.Connection[Any]) -> None:
    # A session's ``born`` and ``generation`` come from one store-wide sequence: ``born`` when
    # its row is made (a session deleted and created again under its id gets a larger one),
    # ``generation`` then and again after every statement that changes its tags, segments,
    # watermark or tag summaries in place (statement-level triggers: one draw per session a
    # statement touched, not one per row). Appends draw nothing.
    statements = [
        "CREATE SEQUENCE store_generation",
        "ALTER TABLE sessions ADD COLUMN born BIGINT NOT NULL DEFAULT 0",
        "ALTER TABLE sessions ADD COLUMN generation BIGINT NOT NULL DEFAULT 0",
        "CREATE FUNCTION sessions_born() RETURNS trigger LANGUAGE plpgsql AS $$"
        " BEGIN NEW.born := nextval('store_generation'); NEW.generation := NEW.born;"
        " RETURN NEW; END $$",
        "CREATE TRIGGER sessions_born BEFORE INSERT ON sessions"
        " FOR EACH ROW EXECUTE FUNCTION sessions_born()",
        "CREATE FUNCTION sessions_watermark() RETURNS trigger LANGUAGE plpgsql AS $$"
        " BEGIN NEW.generation := nextval('store_generation'); RETURN NEW; END $$",
        "CREATE TRIGGER sessions_watermark BEFORE UPDATE OF compaction_watermark ON sessions"
        " FOR EACH ROW EXECUTE FUNCTION sessions_watermark()",
        "CREATE FUNCTION sessions_new_generation() RETURNS trigger LANGUAGE plpgsql AS $$"
        " BEGIN"
        "  UPDATE sessions SET generation = nextval('store_generation')"
        "  WHERE id IN (SELECT DISTINCT session_id FROM changed);"
        "  RETURN NULL;"
        " END $$",
        # The dashboard's request records: ``pos`` orders them as first written (retention
        # drops the lowest); ``change`` is drawn from the ``records`` counter row, whose lock
        # makes writers commit in the order of their numbers (a reader polling past the last
        # number it saw never misses a write committed later with a smaller one).
        "CREATE TABLE store_counters (name TEXT PRIMARY KEY, value BIGINT NOT NULL)",
        "INSERT INTO store_counters (name, value) VALUES ('records', 0)",
        "CREATE TABLE request_records ("
        " pos BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, id TEXT NOT NULL UNIQUE,"
        " session_id TEXT NOT NULL, origin TEXT NOT NULL, change BIGINT NOT NULL,"
        " size INTEGER NOT NULL, body TEXT NOT NULL)",
        "CREATE INDEX request_records_by_change ON request_records (change)",
        "CREATE INDEX request_records_by_session ON request_records (session_id, pos)",
        # The Responses API ids the proxy relayed, per principal, with the stored turn each
        # names and the first turn of the chain: gone with the session.
        "CREATE TABLE response_links ("
        " principal TEXT NOT NULL, name TEXT NOT NULL,"
        " session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,"
        " seq INTEGER NOT NULL, start INTEGER NOT NULL, PRIMARY KEY (principal, name))",
        "CREATE INDEX response_links_by_session ON response_links (session_id)",
    ]
    for table in ("turn_tags", "segments", "tag_summaries"):
        for event, rows in (("INSERT", "NEW"), ("UPDATE", "NEW"), ("DELETE", "OLD")):
            statements.append(
                f"CREATE TRIGGER {table}_generation_{event.lower()} AFTER {event} ON {table}"
                f" REFERENCING {rows} TABLE AS changed FOR EACH STATEMENT"
                " EXECUTE FUNCTION sessions_new_generation()"
            )
    for statement in statements:
        conn.execute(statement)


@MIGRATIONS.migration
def m004_set_tags_in_one_call(conn: psycopg.Connection[Any]) -> None:
    # Replacing the tags of derived turns is one server-side call, as appending turns is: the
    # old rows of the given seqs deleted and the new ones inserted from arrays (one row per
    # (seq, tag); the caller sends each pair once), so a derive pays one round trip. Seqs
    # with no turn are returned instead of raised, before anything is written: an error would
    # abort the caller's transaction (a ``batch``), which SQLite's failed statement does not.
    # Planned at each call: a plan cached while the tables were small (no statistics yet on
    # a new database) scans them whole once they have grown, until autovacuum analyzes.
    conn.execute(
        "CREATE FUNCTION cf_set_tags(p_session TEXT, p_replace INTEGER[], p_seq INTEGER[],"
        " p_tag TEXT[], p_weight DOUBLE PRECISION[], p_related BOOLEAN[]) RETURNS INTEGER[]"
        " LANGUAGE plpgsql SET plan_cache_mode = force_custom_plan"
        " AS $$ DECLARE missing INTEGER[]; BEGIN"
        " missing := ARRAY(SELECT DISTINCT s FROM unnest(p_replace || p_seq) AS s"
        "  WHERE NOT EXISTS (SELECT 1 FROM turns t WHERE t.session_id = p_session"
        "  AND t.seq = s) ORDER BY s);"
        " IF cardinality(missing) > 0 THEN RETURN missing; END IF;"
        " IF cardinality(p_replace) > 0 THEN"
        "  DELETE FROM turn_tags WHERE session_id = p_session AND seq = ANY(p_replace);"
        " END IF;"
        " INSERT INTO turn_tags (session_id, seq, tag, weight, related)"
        "  SELECT p_session, u.seq, u.tag, u.weight, u.related"
        "  FROM unnest(p_seq, p_tag, p_weight, p_related) AS u(seq, tag, weight, related)"
        "  ON CONFLICT (session_id, seq, tag) DO UPDATE"
        "  SET weight = excluded.weight, related = excluded.related;"
        " RETURN missing; END $$"
    )


# ``cf_append_turns`` of ``m002`` (same signature, same steps), adding the new live turns'
# tokens to their session's ``live_tokens`` while it holds the row's lock.
_APPEND_TURNS_LIVE = f"""
CREATE OR REPLACE FUNCTION cf_append_turns(
    p_session TEXT, p_expected INTEGER, p_enqueue TEXT, p_shard INTEGER,
    p_roles TEXT[], p_texts TEXT[], p_bodies TEXT[], p_hashes TEXT[],
    p_created TIMESTAMPTZ[], p_tokens INTEGER[], p_keys TEXT[], p_partial BOOLEAN[],
    p_text_tokens INTEGER[], p_term_turn INTEGER[], p_terms TEXT[], p_positions TEXT[]
) RETURNS INTEGER LANGUAGE plpgsql AS $$
DECLARE
    v_id_tokens INTEGER;
    v_watermark INTEGER;
    v_last INTEGER;
    v_n INTEGER := COALESCE(array_length(p_roles, 1), 0);
BEGIN
    SELECT id_tokens, compaction_watermark INTO v_id_tokens, v_watermark
    FROM sessions WHERE id = p_session FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown session' USING ERRCODE = '{UNKNOWN_SESSION}';
    END IF;
    SELECT COALESCE(MAX(seq), 0) INTO v_last FROM turns WHERE session_id = p_session;
    IF p_expected IS NOT NULL AND v_last <> p_expected THEN
        RAISE EXCEPTION 'branch moved' USING ERRCODE = '{BRANCH_MOVED}', DETAIL = v_last::TEXT;
    END IF;
    IF v_n = 0 THEN
        RETURN v_last;
    END IF;
    INSERT INTO turns (session_id, seq, role, content_text, message_json, content_hash,
                       created_at, token_count, match_key, partial, text_tokens)
    SELECT p_session, v_last + i, p_roles[i], p_texts[i], p_bodies[i], p_hashes[i],
           p_created[i], p_tokens[i], p_keys[i], p_partial[i], p_text_tokens[i]
    FROM generate_series(1, v_n) AS i;
    INSERT INTO turn_terms (session_id, seq, term, positions, text_tokens)
    SELECT p_session, v_last + k, t, p::INTEGER[], p_text_tokens[k]
    FROM unnest(p_term_turn, p_terms, p_positions) AS u(k, t, p);
    UPDATE fts_totals
    SET n_rows = n_rows + v_n,
        n_tokens = n_tokens + v_n * v_id_tokens
                   + (SELECT COALESCE(SUM(x), 0) FROM unnest(p_text_tokens) AS x)
    WHERE tbl = 'turns' AND shard = p_shard;
    UPDATE sessions
    SET live_tokens = live_tokens + (SELECT COALESCE(SUM(p_tokens[i]), 0)
                                     FROM generate_series(1, v_n) AS i
                                     WHERE v_last + i >= v_watermark)
    WHERE id = p_session;
    IF p_enqueue IS NOT NULL THEN
        INSERT INTO jobs (session_id, kind, created_at) VALUES (p_session, p_enqueue, now())
        ON CONFLICT (session_id, kind) WHERE state = 'pending' DO NOTHING;
    END IF;
    RETURN v_last;
END $$
"""


@MIGRATIONS.migration
def m005_live_tokens(conn: psycopg.Connection[Any]) -> None:
    # The tokens of a session's live turns (seq >= compaction_watermark), kept in its row: a
    # derive checks them after every exchange, and a sum over the live turns grew with them.
    # Appends add to it under the session's row lock (``cf_append_turns`` redefined with the
    # same signature: ``_APPEND_TURNS_LIVE``); a moved watermark counts them again (rare: a
    # compaction); a fork or a loaded session counts them once its turns are in
    # (``PostgresMemoryStore._count_live``).
    statements = [
        "ALTER TABLE sessions ADD COLUMN live_tokens BIGINT NOT NULL DEFAULT 0",
        "UPDATE sessions s SET live_tokens = (SELECT COALESCE(SUM(t.token_count), 0)"
        " FROM turns t WHERE t.session_id = s.id AND t.seq >= s.compaction_watermark)",
        "CREATE FUNCTION sessions_live_tokens() RETURNS trigger LANGUAGE plpgsql AS $$"
        " BEGIN"
        "  NEW.live_tokens := (SELECT COALESCE(SUM(token_count), 0) FROM turns"
        "   WHERE session_id = NEW.id AND seq >= NEW.compaction_watermark);"
        "  RETURN NEW;"
        " END $$",
        "CREATE TRIGGER sessions_live_tokens BEFORE UPDATE OF compaction_watermark ON sessions"
        " FOR EACH ROW EXECUTE FUNCTION sessions_live_tokens()",
        _APPEND_TURNS_LIVE,
    ]
    for statement in statements:
        conn.execute(statement)


# ``cf_append_turns`` with the new turns as one JSON document instead of twelve arrays
# (``PostgresMemoryStore._appended``): the client dumps one string instead of an array per
# column, which cost more than the whole call on the server. ``p_turns`` holds one
# [role, text, body, hash, created, tokens, key, partial, text tokens] per turn, ``p_terms``
# one [turn index from 1, term, positions] per term. The same steps as ``_APPEND_TURNS_LIVE``.
_APPEND_JSON = f"""
CREATE FUNCTION cf_append_json(
    p_session TEXT, p_expected INTEGER, p_enqueue TEXT, p_shard INTEGER,
    p_turns JSONB, p_terms JSONB
) RETURNS INTEGER LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
    v_id_tokens INTEGER;
    v_watermark INTEGER;
    v_last INTEGER;
    v_n INTEGER := jsonb_array_length(p_turns);
BEGIN
    SELECT id_tokens, compaction_watermark INTO v_id_tokens, v_watermark
    FROM sessions WHERE id = p_session FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown session' USING ERRCODE = '{UNKNOWN_SESSION}';
    END IF;
    SELECT COALESCE(MAX(seq), 0) INTO v_last FROM turns WHERE session_id = p_session;
    IF p_expected IS NOT NULL AND v_last <> p_expected THEN
        RAISE EXCEPTION 'branch moved' USING ERRCODE = '{BRANCH_MOVED}', DETAIL = v_last::TEXT;
    END IF;
    IF v_n = 0 THEN
        RETURN v_last;
    END IF;
    INSERT INTO turns (session_id, seq, role, content_text, message_json, content_hash,
                       created_at, token_count, match_key, partial, text_tokens)
    SELECT p_session, v_last + t.i, t.e->>0, t.e->>1, t.e->>2, t.e->>3,
           (t.e->>4)::TIMESTAMPTZ, (t.e->>5)::INTEGER, t.e->>6, (t.e->>7)::BOOLEAN,
           (t.e->>8)::INTEGER
    FROM jsonb_array_elements(p_turns) WITH ORDINALITY AS t(e, i);
    INSERT INTO turn_terms (session_id, seq, term, positions, text_tokens)
    SELECT p_session, v_last + (u.e->>0)::INTEGER, u.e->>1, (u.e->>2)::INTEGER[],
           (p_turns->((u.e->>0)::INTEGER - 1)->>8)::INTEGER
    FROM jsonb_array_elements(p_terms) AS u(e);
    UPDATE fts_totals
    SET n_rows = n_rows + v_n,
        n_tokens = n_tokens + v_n * v_id_tokens
                   + (SELECT COALESCE(SUM((e->>8)::INTEGER), 0)
                      FROM jsonb_array_elements(p_turns) AS e)
    WHERE tbl = 'turns' AND shard = p_shard;
    UPDATE sessions
    SET live_tokens = live_tokens + (SELECT COALESCE(SUM((t.e->>5)::INTEGER), 0)
                                     FROM jsonb_array_elements(p_turns) WITH ORDINALITY
                                          AS t(e, i)
                                     WHERE v_last + t.i >= v_watermark)
    WHERE id = p_session;
    IF p_enqueue IS NOT NULL THEN
        INSERT INTO jobs (session_id, kind, created_at) VALUES (p_session, p_enqueue, now())
        ON CONFLICT (session_id, kind) WHERE state = 'pending' DO NOTHING;
    END IF;
    RETURN v_last;
END $$
"""

# A derive done in line starts with one call (``PostgresMemoryStore.begin_derive``): append
# the new turns (``cf_append_json``, no job: this derive covers them; with none it only
# checks the session, raising its ``UNKNOWN_SESSION``), drop the session's pending derive job,
# and return the session's row (``SESSION_COLUMNS``, ``live_tokens``) joined to its turns
# after ``derived_seq - p_context`` (one row with NULL turn columns when there are none).
_BEGIN_DERIVE = """
CREATE FUNCTION cf_begin_derive(
    p_session TEXT, p_context INTEGER, p_shard INTEGER, p_turns JSONB, p_terms JSONB
) RETURNS TABLE (
    r_id TEXT, r_created_at TIMESTAMPTZ, r_metadata TEXT, r_watermark INTEGER,
    r_principal TEXT, r_parent_id TEXT, r_fork_seq INTEGER, r_derived_seq INTEGER,
    r_born BIGINT, r_generation BIGINT, r_live_tokens BIGINT,
    r_seq INTEGER, r_role TEXT, r_text TEXT, r_hash TEXT
) LANGUAGE plpgsql SET enable_seqscan = off AS $$
BEGIN
    PERFORM cf_append_json(p_session, NULL, NULL, p_shard, p_turns, p_terms);
    DELETE FROM jobs j
    WHERE j.session_id = p_session AND j.kind = 'derive' AND j.state = 'pending';
    RETURN QUERY
    SELECT s.id, s.created_at, s.metadata, s.compaction_watermark, s.principal, s.parent_id,
           s.fork_seq, s.derived_seq, s.born, s.generation, s.live_tokens,
           t.seq, t.role, t.content_text, t.content_hash
    FROM sessions s
    LEFT JOIN turns t ON t.session_id = s.id AND t.seq > s.derived_seq - p_context
    WHERE s.id = p_session
    ORDER BY t.seq;
END $$
"""

# A derive's write as one call (``PostgresMemoryStore.write_derived``): lock the session's
# row and read its generation; check the seqs (turns are append-only with seqs 1..last and no
# gap, so a seq outside that range is the only kind with no turn: returned, before anything
# is written, like a missing session's absent generation); replace the turns' tags (a plain
# insert once the old rows are gone; its statement trigger draws a new generation); move
# ``derived_seq`` and read the generation again. ``p_tags`` holds one [seq, tag, weight,
# related] per tag row, each (seq, tag) once.
_WRITE_DERIVED = """
CREATE FUNCTION cf_write_derived(
    p_session TEXT, p_seqs INTEGER[], p_tags JSONB, p_derived INTEGER,
    OUT missing INTEGER[], OUT before BIGINT, OUT after BIGINT
) LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
    v_last INTEGER;
    v_lo INTEGER;
    v_hi INTEGER;
BEGIN
    SELECT generation INTO before FROM sessions WHERE id = p_session FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    SELECT COALESCE(MAX(seq), 0) INTO v_last FROM turns WHERE session_id = p_session;
    missing := ARRAY(SELECT DISTINCT s FROM (
                         SELECT unnest(p_seqs) AS s
                         UNION ALL
                         SELECT (e->>0)::INTEGER FROM jsonb_array_elements(p_tags) AS e
                     ) AS given
                     WHERE s < 1 OR s > v_last ORDER BY s);
    IF cardinality(missing) > 0 THEN
        before := NULL;
        RETURN;
    END IF;
    -- Bounded by the seqs' range: the key's two first columns, so no plan reads all the
    -- session's tags (``turn_tags_by_tag`` starts with the session too).
    SELECT MIN(s), MAX(s) INTO v_lo, v_hi FROM unnest(p_seqs) AS s;
    IF EXISTS (SELECT 1 FROM turn_tags WHERE session_id = p_session
               AND seq BETWEEN v_lo AND v_hi AND seq = ANY(p_seqs)) THEN
        DELETE FROM turn_tags WHERE session_id = p_session
        AND seq BETWEEN v_lo AND v_hi AND seq = ANY(p_seqs);
    END IF;
    INSERT INTO turn_tags (session_id, seq, tag, weight, related)
    SELECT p_session, (e->>0)::INTEGER, e->>1, (e->>2)::DOUBLE PRECISION, (e->>3)::BOOLEAN
    FROM jsonb_array_elements(p_tags) AS e;
    UPDATE sessions SET derived_seq = GREATEST(derived_seq, p_derived)
    WHERE id = p_session RETURNING generation INTO after;
END $$
"""


@MIGRATIONS.migration
def m006_derive_in_one_call(conn: psycopg.Connection[Any]) -> None:
    # Appends take one JSON document (``cf_append_json``; ``cf_append_turns`` stays, for a
    # process of the previous version still running beside this one), and a derive done in
    # line costs two round trips: ``cf_begin_derive`` and ``cf_write_derived``. Every
    # statement in them finds its rows by key, and index scans are forced: a plan cached
    # while the tables were small (no statistics yet on a new database) would otherwise scan
    # them whole once they have grown, and planning at each call (``cf_set_tags``) costs more
    # than the statements.
    conn.execute(_APPEND_JSON)
    conn.execute(_BEGIN_DERIVE)
    conn.execute(_WRITE_DERIVED)


def _tag_deltas(rows: str) -> str:
    """Per (session, tag), the tags proper among the transition table ``rows`` and how many
    of them are below their session's watermark."""
    return (
        "SELECT r.session_id, r.tag, COUNT(*) AS n,"
        " COUNT(*) FILTER (WHERE r.seq < COALESCE(s.compaction_watermark, 0)) AS c"
        f" FROM {rows} r LEFT JOIN sessions s ON s.id = r.session_id WHERE NOT r.related"
        " GROUP BY r.session_id, r.tag"
    )


@MIGRATIONS.migration
def m007_tag_stats(conn: psycopg.Connection[Any]) -> None:
    add = (
        "INSERT INTO tag_stats (session_id, tag, turns, compacted)"
        f" SELECT session_id, tag, n, c FROM ({_tag_deltas('new_rows')}) d"
        " ON CONFLICT (session_id, tag) DO UPDATE SET turns = tag_stats.turns + excluded.turns,"
        " compacted = tag_stats.compacted + excluded.compacted;"
    )
    remove = (
        "UPDATE tag_stats t SET turns = t.turns - d.n, compacted = t.compacted - d.c"
        f" FROM ({_tag_deltas('old_rows')}) d"
        " WHERE t.session_id = d.session_id AND t.tag = d.tag;"
    )
    span = (
        "FROM turn_tags WHERE session_id = NEW.id AND NOT related"
        " AND seq >= LEAST(OLD.compaction_watermark, NEW.compaction_watermark)"
        " AND seq < GREATEST(OLD.compaction_watermark, NEW.compaction_watermark)"
    )
    statements = [
        "CREATE TABLE tag_stats ("
        " session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,"
        " tag TEXT NOT NULL, turns INTEGER NOT NULL DEFAULT 0,"
        " compacted INTEGER NOT NULL DEFAULT 0, segments INTEGER NOT NULL DEFAULT 0,"
        " PRIMARY KEY (session_id, tag))",
        "INSERT INTO tag_stats (session_id, tag, turns, compacted)"
        f" SELECT session_id, tag, n, c FROM ({_tag_deltas('turn_tags')}) d",
        "INSERT INTO tag_stats (session_id, tag, segments)"
        " SELECT g.session_id, j.tag, COUNT(*) FROM segments g,"
        " jsonb_array_elements_text(g.tags::jsonb) AS j(tag) GROUP BY g.session_id, j.tag"
        " ON CONFLICT (session_id, tag) DO UPDATE SET segments = excluded.segments",
        "CREATE FUNCTION cf_tag_stats_segment() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
        " IF TG_OP = 'INSERT' THEN"
        "  INSERT INTO tag_stats (session_id, tag, segments)"
        "  SELECT NEW.session_id, j.tag, 1 FROM jsonb_array_elements_text(NEW.tags::jsonb)"
        "  AS j(tag) ON CONFLICT (session_id, tag) DO UPDATE"
        "  SET segments = tag_stats.segments + 1;"
        " ELSE"
        "  UPDATE tag_stats SET segments = segments - 1 WHERE session_id = OLD.session_id"
        "  AND tag IN (SELECT jsonb_array_elements_text(OLD.tags::jsonb));"
        " END IF; RETURN NULL; END $$",
        "CREATE TRIGGER tag_stats_segment AFTER INSERT OR DELETE ON segments"
        " FOR EACH ROW EXECUTE FUNCTION cf_tag_stats_segment()",
        "CREATE FUNCTION cf_tag_stats_add() RETURNS trigger LANGUAGE plpgsql AS $$"
        f" BEGIN {add} RETURN NULL; END $$",
        "CREATE FUNCTION cf_tag_stats_remove() RETURNS trigger LANGUAGE plpgsql AS $$"
        f" BEGIN {remove} RETURN NULL; END $$",
        "CREATE FUNCTION cf_tag_stats_change() RETURNS trigger LANGUAGE plpgsql AS $$"
        f" BEGIN {remove} {add} RETURN NULL; END $$",
        "CREATE TRIGGER tag_stats_ai AFTER INSERT ON turn_tags REFERENCING NEW TABLE AS"
        " new_rows FOR EACH STATEMENT EXECUTE FUNCTION cf_tag_stats_add()",
        "CREATE TRIGGER tag_stats_ad AFTER DELETE ON turn_tags REFERENCING OLD TABLE AS"
        " old_rows FOR EACH STATEMENT EXECUTE FUNCTION cf_tag_stats_remove()",
        "CREATE TRIGGER tag_stats_au AFTER UPDATE ON turn_tags REFERENCING OLD TABLE AS"
        " old_rows NEW TABLE AS new_rows FOR EACH STATEMENT"
        " EXECUTE FUNCTION cf_tag_stats_change()",
        # A watermark moved: the tags of the turns it passed over change sides.
        "CREATE FUNCTION cf_tag_stats_watermark() RETURNS trigger LANGUAGE plpgsql AS $$"
        " BEGIN UPDATE tag_stats t SET compacted = t.compacted"
        " + SIGN(NEW.compaction_watermark - OLD.compaction_watermark)::INTEGER * d.n"
        f" FROM (SELECT tag, COUNT(*)::INTEGER AS n {span} GROUP BY tag) d"
        " WHERE t.session_id = NEW.id AND t.tag = d.tag; RETURN NULL; END $$",
        "CREATE TRIGGER tag_stats_watermark AFTER UPDATE OF compaction_watermark ON sessions"
        " FOR EACH ROW WHEN (NEW.compaction_watermark IS DISTINCT FROM OLD.compaction_watermark)"
        " EXECUTE FUNCTION cf_tag_stats_watermark()",
    ]
    for statement in statements:
        conn.execute(statement)


@MIGRATIONS.migration
def m008_scoped_aliases_and_splits(conn: psycopg.Connection[Any]) -> None:
    conn.execute(
        "CREATE TABLE session_aliases ("
        " session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,"
        " alias TEXT NOT NULL, canonical TEXT NOT NULL, PRIMARY KEY (session_id, alias))"
    )
    conn.execute(
        "CREATE TABLE tag_splits ("
        " session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,"
        " tag TEXT NOT NULL, sub_tags TEXT NOT NULL DEFAULT '[]',"
        " created_at TIMESTAMPTZ NOT NULL, PRIMARY KEY (session_id, tag))"
    )
    # A change to either draws a new generation for its session (``sessions_new_generation``,
    # m003): every process's cache of them, keyed by the generation, sees it.
    for table in ("session_aliases", "tag_splits"):
        for event, rows in (("INSERT", "NEW"), ("UPDATE", "NEW"), ("DELETE", "OLD")):
            conn.execute(
                f"CREATE TRIGGER {table}_generation_{event.lower()} AFTER {event} ON {table}"
                f" REFERENCING {rows} TABLE AS changed FOR EACH STATEMENT"
                " EXECUTE FUNCTION sessions_new_generation()"
            )


def _related_deltas(rows: str) -> str:
    """Per (session, tag), the related tags among the transition table ``rows``."""
    return (
        f"SELECT session_id, tag, COUNT(*)::INTEGER AS n FROM {rows} WHERE related"
        " GROUP BY session_id, tag"
    )


@MIGRATIONS.migration
def m009_related_tag_stats(conn: psycopg.Connection[Any]) -> None:
    add = (
        "INSERT INTO related_tag_stats (session_id, tag, turns)"
        f" SELECT session_id, tag, n FROM ({_related_deltas('new_rows')}) d"
        " ON CONFLICT (session_id, tag) DO UPDATE"
        " SET turns = related_tag_stats.turns + excluded.turns;"
    )
    remove = (
        "UPDATE related_tag_stats t SET turns = t.turns - d.n"
        f" FROM ({_related_deltas('old_rows')}) d"
        " WHERE t.session_id = d.session_id AND t.tag = d.tag;"
    )
    statements = [
        "CREATE TABLE related_tag_stats ("
        " session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,"
        " tag TEXT NOT NULL, turns INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (session_id, tag))",
        "INSERT INTO related_tag_stats (session_id, tag, turns)"
        f" SELECT session_id, tag, n FROM ({_related_deltas('turn_tags')}) d",
        "CREATE FUNCTION cf_related_stats_add() RETURNS trigger LANGUAGE plpgsql AS $$"
        f" BEGIN {add} RETURN NULL; END $$",
        "CREATE FUNCTION cf_related_stats_remove() RETURNS trigger LANGUAGE plpgsql AS $$"
        f" BEGIN {remove} RETURN NULL; END $$",
        "CREATE FUNCTION cf_related_stats_change() RETURNS trigger LANGUAGE plpgsql AS $$"
        f" BEGIN {remove} {add} RETURN NULL; END $$",
        "CREATE TRIGGER related_tag_stats_ai AFTER INSERT ON turn_tags REFERENCING NEW TABLE"
        " AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION cf_related_stats_add()",
        "CREATE TRIGGER related_tag_stats_ad AFTER DELETE ON turn_tags REFERENCING OLD TABLE"
        " AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION cf_related_stats_remove()",
        "CREATE TRIGGER related_tag_stats_au AFTER UPDATE ON turn_tags REFERENCING OLD TABLE"
        " AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT"
        " EXECUTE FUNCTION cf_related_stats_change()",
    ]
    for statement in statements:
        conn.execute(statement)


@MIGRATIONS.migration
def m010_tag_stats_segment_last_seq(conn: psycopg.Connection[Any]) -> None:
    # A deleted segment leaves the value as it was (segments go only with their session): an
    # upper bound, so a check against it may read segments for nothing, never miss one.
    statements = [
        "ALTER TABLE tag_stats ADD COLUMN segment_last_seq INTEGER",
        "UPDATE tag_stats t SET segment_last_seq = d.last_seq FROM (SELECT g.session_id,"
        " j.tag, MAX(g.last_seq) AS last_seq FROM segments g,"
        " jsonb_array_elements_text(g.tags::jsonb) AS j(tag) GROUP BY g.session_id, j.tag) d"
        " WHERE t.session_id = d.session_id AND t.tag = d.tag",
        "CREATE OR REPLACE FUNCTION cf_tag_stats_segment() RETURNS trigger LANGUAGE plpgsql"
        " AS $$ BEGIN"
        " IF TG_OP = 'INSERT' THEN"
        "  INSERT INTO tag_stats (session_id, tag, segments, segment_last_seq)"
        "  SELECT NEW.session_id, j.tag, 1, NEW.last_seq"
        "  FROM jsonb_array_elements_text(NEW.tags::jsonb) AS j(tag)"
        "  ON CONFLICT (session_id, tag) DO UPDATE SET segments = tag_stats.segments + 1,"
        "  segment_last_seq = GREATEST(tag_stats.segment_last_seq, excluded.segment_last_seq);"
        " ELSE"
        "  UPDATE tag_stats SET segments = segments - 1 WHERE session_id = OLD.session_id"
        "  AND tag IN (SELECT jsonb_array_elements_text(OLD.tags::jsonb));"
        " END IF; RETURN NULL; END $$",
        "CREATE INDEX segments_by_last_seq ON segments (session_id, last_seq)",
    ]
    for statement in statements:
        conn.execute(statement)


@MIGRATIONS.migration
def m011_tool_call_keys(conn: psycopg.Connection[Any]) -> None:
    # A tool call's match key no longer reads the arguments set to false or null
    # (``message_key``: a client resends a call with the tool's unset options filled in, and
    # each such call forked its conversation); the stored calls' keys are made again that
    # way, with the append-only trigger off for this transaction's updates.
    from contextfold.items import Message
    from contextfold.store.models import message_key

    rows = conn.execute(
        "SELECT id, message_json FROM turns"
        " WHERE role = 'assistant' AND message_json LIKE '%\"tool_use\"%'"
    ).fetchall()
    keys = [(message_key(Message.model_validate_json(r[1])), r[0]) for r in rows]
    if keys:
        conn.execute("ALTER TABLE turns DISABLE TRIGGER turns_append_only")
        with conn.cursor() as cursor:
            cursor.executemany("UPDATE turns SET match_key = %s WHERE id = %s", keys)
        conn.execute("ALTER TABLE turns ENABLE TRIGGER turns_append_only")
