"""What only the SQLite memory store has: its migrations, its triggers that refuse an
``UPDATE`` or ``DELETE`` of a raw turn, its FTS5 indexes kept in step by triggers, and the
rows behind the Protocol's answers. The backend-neutral behaviour is in the conformance
tests beside this file (``test_conformance_*.py``)."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from contextfold.items import Message
from contextfold.store.conformance.memory_search import search_stays_in_its_session
from contextfold.store.conformance.memory_support import TOPICS, filled, messages
from contextfold.store.sqlite import connect
from contextfold.store.sqlite.memory import MIGRATIONS, MemoryStore, NewSegment
from contextfold.tokens import CharCounter


def _store(path: str | Path = ":memory:") -> MemoryStore:
    return MemoryStore(path, counter=CharCounter())


def _filled(path: str | Path = ":memory:") -> MemoryStore:
    store = _store(path)
    filled(store)
    return store


def test_migrations_are_recorded_once() -> None:
    store = _store()
    rows = store._conn.execute(
        "SELECT name FROM schema_migrations WHERE schema = 'memory' ORDER BY name"
    ).fetchall()
    assert (
        [r[0] for r in rows]
        == MIGRATIONS.names
        == [
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
    )
    assert MIGRATIONS.apply(store._conn) == []


def test_m009_gives_an_older_store_session_aliases_and_splits(tmp_path: Path) -> None:
    conn = connect(tmp_path / "old.db")
    MIGRATIONS.apply(conn, upto="m008_response_links")
    conn.execute("INSERT INTO sessions (id, created_at) VALUES ('s1', '2026-01-01T00:00:00+00:00')")
    conn.commit()
    conn.close()
    store = _store(tmp_path / "old.db")
    before = store.session_version("s1")
    store.vocab.set_alias("pg", "postgres", session_id="s1")
    store.vocab.record_split("s1", "deploy", ["deploy-rollback", "deploy-general"])
    assert store.vocab.aliases("s1") == {"pg": "postgres"}
    assert store.vocab.tag_splits("s1") == {"deploy": ("deploy-rollback", "deploy-general")}
    after = store.session_version("s1")
    assert before is not None and after is not None and after[1] > before[1]  # caches see it
    store.close()


def test_fts_migration_indexes_turns_stored_by_the_oldest_schema(tmp_path: Path) -> None:
    conn = connect(tmp_path / "old.db")
    MIGRATIONS.apply(conn, upto="m001_create_memory")
    conn.execute("INSERT INTO sessions (id, created_at) VALUES ('s1', '2026-01-01T00:00:00+00:00')")
    message = Message(role="user", content="the kubernetes cluster is down")
    conn.execute(
        "INSERT INTO turns (session_id, seq, role, content_text, message_json, content_hash,"
        " created_at, token_count) VALUES ('s1', 1, 'user', ?, ?, 'h', '2026-01-01', 5)",
        (message.text(), message.model_dump_json()),
    )
    conn.close()
    store = _store(tmp_path / "old.db")
    hits = store.search_turns("s1", "kubernetes")
    assert [turn.seq for turn, _ in hits] == [1]
    assert hits[0][0].message == message


@pytest.mark.parametrize(
    "sql",
    [
        "UPDATE turns SET content_text = 'forged' WHERE seq = 1",
        "UPDATE turns SET seq = 99 WHERE seq = 2",
        "DELETE FROM turns WHERE seq = 3",
        "DELETE FROM turns",
    ],
)
def test_raw_turns_cannot_be_updated_or_deleted(sql: str) -> None:
    store = _filled()
    before = store.turns("s1")
    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        store._conn.execute(sql)
    assert store.turns("s1") == before


def test_delete_session_lifts_the_guard_for_its_own_session_only() -> None:
    store = _filled()
    store.create_session("s2")
    store.append_turns("s2", messages(["kubernetes elsewhere"]))
    store.tag_turn("s1", 1, "deploy")
    assert store.delete_session("s1") is True
    assert store._conn.execute("SELECT COUNT(*) FROM turn_tags").fetchone()[0] == 0
    assert store._conn.execute("SELECT COUNT(*) FROM turn_deletions").fetchone()[0] == 0
    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        store._conn.execute("DELETE FROM turns WHERE session_id = 's2'")


def test_fts_indexes_stay_in_sync_with_their_tables() -> None:
    store = _filled()
    store.compact("s1", [NewSegment(first_seq=1, last_seq=2, summary="deploy", full_text="")], 3)
    store.delete_session("s1")
    for fts in ("turns_fts", "segments_fts"):
        store._conn.execute(f"INSERT INTO {fts} ({fts}) VALUES ('integrity-check')")
    assert store._conn.execute("SELECT COUNT(*) FROM turns_fts").fetchone()[0] == 0
    assert store.search_turns("s1", "deploy") == []


def test_an_exception_inside_compaction_leaves_no_segment_rows() -> None:
    store = _filled()

    def boom() -> None:
        raise RuntimeError("summarizer crashed")

    segment = NewSegment(first_seq=1, last_seq=2, summary="deploy", full_text="")
    with pytest.raises(RuntimeError, match="summarizer crashed"):
        store.compact("s1", [segment], 3, _before_commit=boom)
    assert store._conn.execute("SELECT COUNT(*) FROM segment_turns").fetchone()[0] == 0
    assert store._conn.execute("SELECT COUNT(*) FROM segments").fetchone()[0] == 0
    assert len(store.turns("s1")) == len(TOPICS)


def test_an_m003_file_is_reindexed_and_search_stays_in_its_session(tmp_path: Path) -> None:
    conn = connect(tmp_path / "m003.db")
    MIGRATIONS.apply(conn, upto="m003_related_tags_and_vectors")
    conn.close()
    store = _store(tmp_path / "m003.db")  # upgrades to the session-scoped index
    search_stays_in_its_session(store)


def _m005_file(path: Path) -> None:
    """A file at m005 holding sessions ``a`` and ``b`` (2 turns each, one segment each, ids 1
    and 2) and ``c`` (no turns), written the way the m005 code wrote them."""
    conn = connect(path)
    MIGRATIONS.apply(conn, upto="m005_branches_and_jobs")
    for sid in ("a", "b", "c"):
        conn.execute(
            "INSERT INTO sessions (id, created_at) VALUES (?, '2026-01-01T00:00:00+00:00')", (sid,)
        )
    for n, sid in enumerate(("a", "b")):
        for seq, text in enumerate((f"kiln firing {sid}", "glaze"), start=1):
            message = Message(role="user", content=text)
            conn.execute(
                "INSERT INTO turns (session_id, seq, role, content_text, message_json,"
                " content_hash, created_at, token_count, match_key)"
                " VALUES (?, ?, 'user', ?, ?, ?, '2026-01-01T00:00:00+00:00', 5, ?)",
                (sid, seq, text, message.model_dump_json(), f"h{sid}{seq}", text),
            )
        conn.execute(
            "INSERT INTO segments (id, session_id, first_seq, last_seq, summary, full_text,"
            " tags, summary_tokens, full_tokens, created_at, related_tags)"
            " VALUES (?, ?, 1, 2, ?, 'full', '[\"kiln\"]', 3, 4,"
            " '2026-01-01T00:00:00+00:00', '[\"oven\"]')",
            (n + 1, sid, f"kiln summary {sid}"),
        )
        conn.executemany(
            "INSERT INTO segment_turns (segment_id, seq) VALUES (?, ?)", [(n + 1, 1), (n + 1, 2)]
        )
        conn.execute("UPDATE sessions SET compaction_watermark = 3 WHERE id = ?", (sid,))
    conn.close()


def test_m006_keeps_an_m005_files_segments_and_never_reuses_their_ids(tmp_path: Path) -> None:
    _m005_file(tmp_path / "m005.db")
    store = _store(tmp_path / "m005.db")  # upgrades: segments rebuilt with AUTOINCREMENT
    sql = store._conn.execute("SELECT sql FROM sqlite_master WHERE name = 'segments'").fetchone()
    assert "AUTOINCREMENT" in sql[0]
    for sid, seg_id in (("a", 1), ("b", 2)):
        [seg] = store.segments(sid)
        assert (seg.id, seg.seqs, seg.summary, seg.full_text) == (
            seg_id,
            (1, 2),
            f"kiln summary {sid}",
            "full",
        )
        assert (seg.tags, seg.related_tags, seg.summary_tokens, seg.full_tokens) == (
            ("kiln",),
            ("oven",),
            3,
            4,
        )
        assert [s.id for s, _ in store.search_segments(sid, "kiln")] == [seg_id]
    store._conn.execute("INSERT INTO segments_fts (segments_fts) VALUES ('integrity-check')")
    assert store._conn.execute("PRAGMA foreign_key_check").fetchall() == []
    # Deleting the newest segment's session does not give its id out again.
    assert store.delete_session("b")
    assert store._conn.execute("SELECT COUNT(*) FROM segment_turns").fetchone()[0] == 2
    store.fork("a", 2, session_id_new="d")  # copies segment 1 under a new id
    store.append_turns("c", messages(["one", "two"]))
    [fresh] = store.compact(
        "c", [NewSegment(first_seq=1, last_seq=1, summary="teapot", full_text="")], 2
    )
    assert [s.id for s in store.segments("d")] == [3] and fresh == 4
    assert [s.id for s, _ in store.search_segments("c", "teapot")] == [fresh]
    assert [s.seqs for s in store.segments("d")] == [(1, 2)]


def test_m007_gives_an_m005_files_sessions_distinct_incarnations(tmp_path: Path) -> None:
    _m005_file(tmp_path / "m005.db")
    store = _store(tmp_path / "m005.db")

    def incarnation(sid: str) -> int:
        row = store._conn.execute("SELECT born FROM sessions WHERE id = ?", (sid,))
        return int(row.fetchone()[0])

    old = [incarnation(sid) for sid in ("a", "b", "c")]
    assert len(set(old)) == 3 and min(old) > 0
    store.delete_session("c")
    store.create_session("c")
    assert incarnation("c") > max(old)


def test_m010_counts_the_tags_and_segments_a_file_already_holds(tmp_path: Path) -> None:
    _m005_file(tmp_path / "m005.db")
    conn = connect(tmp_path / "m005.db")
    conn.executemany(
        "INSERT INTO turn_tags (session_id, seq, tag, weight, related) VALUES (?, ?, ?, 1.0, ?)",
        [("a", 1, "kiln", 0), ("a", 2, "kiln", 0), ("a", 2, "oven", 1), ("b", 2, "glaze", 0)],
    )
    conn.close()
    store = _store(tmp_path / "m005.db")
    assert store.tag_counts("a") == {"kiln": 2} and store.tag_counts("b") == {"glaze": 1}
    assert store.topic_counts("a") == (3, {"kiln": 2})
    assert store.topic_counts("b") == (3, {})  # glaze is on no segment
    store.close()


def test_m011_counts_the_related_tags_a_file_already_holds(tmp_path: Path) -> None:
    _m005_file(tmp_path / "m005.db")
    conn = connect(tmp_path / "m005.db")
    conn.executemany(
        "INSERT INTO turn_tags (session_id, seq, tag, weight, related) VALUES (?, ?, ?, 1.0, ?)",
        [("a", 1, "oven", 1), ("a", 2, "kiln", 0), ("a", 2, "oven", 1), ("b", 2, "oven", 0)],
    )
    conn.close()
    store = _store(tmp_path / "m005.db")
    assert store.vocab.related_tag_counts("a") == {"oven": 2}
    assert store.vocab.related_tag_counts("b") == {}  # oven is b's tag, not a related one
    store.set_turn_tags("a", 1, {"oven": 1.0})  # related no more
    assert store.vocab.related_tag_counts("a") == {"oven": 1}
    store.close()


def test_m013_keeps_each_tags_newest_segment_for_a_file_holding_segments(tmp_path: Path) -> None:
    """A file at m011 holding segments: after m013, a summary behind a tag's newest segment is
    found to have something to take in, one current with it is not, and new segments keep
    the value."""
    _m005_file(tmp_path / "old.db")
    conn = connect(tmp_path / "old.db")
    MIGRATIONS.apply(conn, upto="m011_related_tag_stats")
    conn.execute(
        "INSERT INTO segments (session_id, first_seq, last_seq, summary, full_text, tags,"
        " summary_tokens, full_tokens, created_at) VALUES ('a', 3, 5, 'later', '',"
        " '[\"kiln\", \"glaze\"]', 1, 1, '2026-01-01T00:00:00+00:00')"
    )
    conn.close()
    store = _store(tmp_path / "old.db")
    rows = store._conn.execute(
        "SELECT session_id, tag, segment_last_seq FROM tag_stats WHERE segments > 0"
        " ORDER BY session_id, tag"
    ).fetchall()
    assert [tuple(r) for r in rows] == [("a", "glaze", 5), ("a", "kiln", 5), ("b", "kiln", 2)]
    store.paging.upsert_tag_summary("a", "kiln", "k", 2)
    store.paging.upsert_tag_summary("a", "glaze", "g", 5)
    store.paging.upsert_tag_summary("b", "kiln", "k", 2)
    read = store.paging.segments_since_summary("a")
    assert list(read) == ["kiln"] and read["kiln"].segments == ("later",)
    assert store.paging.segments_since_summary("b") == {}
    store.append_turns("b", messages(["t"] * 6))
    store.compact(
        "b", [NewSegment(first_seq=3, last_seq=6, summary="new", full_text="", tags=("kiln",))], 7
    )
    assert store.paging.segments_since_summary("b")["kiln"].last_seq == 6
    store.close()


def _plans(store: MemoryStore, read: Callable[[], object]) -> list[str]:
    """The query plan lines of every SELECT ``read`` runs on the store's connection."""
    seen: list[str] = []
    store._conn.set_trace_callback(seen.append)
    try:
        read()
    finally:
        store._conn.set_trace_callback(None)
    return [
        str(row[3])
        for sql in seen
        if sql.lstrip().upper().startswith(("SELECT", "WITH"))
        for row in store._conn.execute("EXPLAIN QUERY PLAN " + sql)
    ]


def _recall_reads(store: MemoryStore) -> dict[str, object]:
    return {
        "fts": store.search_turn_seqs("s1", "billing kubernetes invoices", 5, common_limit=1000),
        "tags": store.tag_overlap_top("s1", {"billing": (1.0, 0.5), "ops": (1.0, 0.5)}, 3),
        "times": store.turn_times("s1", [1, 3, 5]),
        "counts": store.turn_token_counts("s1", [1, 3, 5]),
    }


def _tagged(path: Path) -> MemoryStore:
    store = _filled(path)
    store.create_session("s2")
    store.append_turns("s2", messages(TOPICS))  # another session: the lookups must filter
    store.set_tags_many(
        "s1",
        {1: ({"billing": 1.0}, ["ops"]), 3: ({"billing": 1.0}, []), 5: ({"billing": 1.0}, ["ops"])},
    )
    return store


def test_recall_reads_come_from_narrow_indexes(tmp_path: Path) -> None:
    """The full-text hits' session and seq, the tag rows' ``related`` and the candidates'
    times are read from covering indexes (m014), never by a lookup of each row in ``turns``
    or ``turn_tags``: at 100k turns those rows are rarely in the page cache."""
    store = _tagged(tmp_path / "m.db")
    fts = _plans(
        store, lambda: store.search_turn_seqs("s1", "billing kubernetes", 5, common_limit=1000)
    )
    assert any("COVERING INDEX turns_fts_lookup" in p for p in fts), fts
    assert not any("INTEGER PRIMARY KEY" in p for p in fts), fts
    tags = _plans(store, lambda: store.tag_overlap_top("s1", {"billing": (1.0, 0.5)}, 3))
    assert any("COVERING INDEX turn_tags_by_tag" in p for p in tags), tags
    times = _plans(store, lambda: store.turn_times("s1", [1, 3, 5]))
    assert any("COVERING INDEX turns_token_counts" in p for p in times), times
    store.close()


def test_m014_gives_a_file_at_m013_the_same_answers(tmp_path: Path) -> None:
    """A file written before m014 (its indexes as m013 left them) answers recall's reads the
    same once m014 has run."""
    path = tmp_path / "old.db"
    store = _tagged(path)
    before = _recall_reads(store)
    store.close()
    conn = sqlite3.connect(path)
    conn.executescript(
        "DROP INDEX turns_fts_lookup; DROP INDEX turn_tags_by_tag; DROP INDEX turns_token_counts;"
        " CREATE INDEX turn_tags_by_tag ON turn_tags (session_id, tag, seq);"
        " CREATE INDEX turns_token_counts ON turns (session_id, seq, token_count);"
        " DELETE FROM schema_migrations WHERE name = 'm014_covering_indexes';"
    )
    conn.close()
    store = _store(path)
    assert _recall_reads(store) == before
    assert before["fts"] and before["tags"][0] and before["times"]  # type: ignore[index]
    store.close()


def test_many_searches_score_each_query_from_one_snapshot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``search_turn_seqs_many`` scores each word in its own statement; another connection
    appending turns between two words changes the store's statistics bm25 uses, so without
    one read snapshot a query's score adds words scored against two stores (equal to neither
    the OR query before the write nor after it)."""
    from contextfold.store.sqlite import memory_fts

    path = tmp_path / "m.db"
    a = MemoryStore(path, counter=CharCounter())
    a.create_session("s")
    a.create_session("t")
    a.append_turns("s", messages(["kiln glaze", "kiln", "glaze pottery", "pottery class"]))
    a.append_turns("t", messages(["other stuff here"] * 3))
    b = MemoryStore(path, counter=CharCounter())  # another writer
    queries = ["kiln glaze", "glaze pottery"]
    before = [a.search_turn_seqs("s", q, 10, common_limit=1000) for q in queries]
    real = memory_fts._store_rows
    calls: list[str] = []

    def store_rows(conn: sqlite3.Connection, term: str, limit: int) -> int:
        calls.append(term)
        if len(calls) == 2:  # after the first word was scored
            b.append_turns("t", messages(["a long turn about many other things entirely"] * 5))
        return real(conn, term, limit)

    monkeypatch.setattr(memory_fts, "_store_rows", store_rows)
    many = a.search_turn_seqs_many("s", queries, 10, common_limit=1000)
    monkeypatch.setattr(memory_fts, "_store_rows", real)
    after = [a.search_turn_seqs("s", q, 10, common_limit=1000) for q in queries]
    assert before != after  # the write changed the scores
    assert many in (before, after)
    a.close()
    b.close()


@pytest.mark.parametrize("where", [":memory:", "file"])
def test_close_waits_for_a_write_in_flight_on_another_thread(where: str, tmp_path: Path) -> None:
    """Closing the store while another thread is inside a write transaction (a dashboard
    record flush beside a server or a test that closes its store) waits for the write: a
    connection closed under a thread inside SQLite is freed under it (CI saw a segfault)."""
    import threading
    import time

    from contextfold.store.sqlite.memory_db import MemoryDb

    db = MemoryDb(where if where == ":memory:" else str(tmp_path / "m.db"))
    inside, errors = threading.Event(), []

    def write() -> None:
        try:
            with db.tx() as conn:
                conn.execute("CREATE TABLE t (x INTEGER)")
                inside.set()
                time.sleep(0.3)  # the close comes now
                conn.execute("INSERT INTO t VALUES (1)")
        except Exception as exc:
            errors.append(exc)

    writer = threading.Thread(target=write)
    writer.start()
    assert inside.wait(10)
    db.close()
    writer.join(10)
    assert errors == []
