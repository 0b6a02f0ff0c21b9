"""What only the PostgreSQL memory store has to prove: bm25 scores identical to SQLite FTS5's,
migrations that several processes may run at once, the append-only trigger, seqs and job
claims that stay right with writers in several threads and processes, and a masked password.

Every test runs on a real server (``postgres_url``: a new database of the test's own)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

import contextfold
from contextfold.errors import ConfigError, StoreError
from contextfold.items import Message
from contextfold.store.models import BranchMoved, NewSegment
from contextfold.store.postgres import schema
from contextfold.store.postgres.memory import PostgresMemoryStore
from contextfold.store.postgres.pool import PgMigrationRegistry
from contextfold.store.postgres.schema import MIGRATIONS
from contextfold.store.sqlite.memory import MemoryStore
from contextfold.tokens import CharCounter

_WORDS = " ".join(
    [
        "deploy deploying deployed the API on Friday café Café école naïve foo_bar foo bar",
        "kubernetes cluster's rollout what is about where run running runs x y z 42 e-mail",
        "señor ÉCOLE alpha beta",
    ]
).split()
_SESSIONS = ["s1", "sess-2", "foo", "alpha_beta", "---", "Kubernetes cluster"]
_QUERIES = [
    "deploying on friday",
    "foo_bar",
    "café naive ecole",
    "what is about where",  # nothing but question words: they are kept
    "",
    "?!",
    "running runs run",
    "kubernetes cluster's rollout",
    "foo",  # also a session id: counted in rows' lengths, never matched as text
    "Señor e-mail 42",
]


@pytest.fixture
def pg(postgres_url: str) -> Iterator[PostgresMemoryStore]:
    store = PostgresMemoryStore(postgres_url, counter=CharCounter())
    yield store
    store.close()


def _msg(text: str, role: str = "user") -> Message:
    return Message(role=role, content=text)


def _texts(rng: random.Random, n: int) -> list[str]:
    punct = ["", ".", "!", ", ok?", " -- "]
    return [
        " ".join(rng.choice(_WORDS) for _ in range(rng.randint(0, 14))) + rng.choice(punct)
        for _ in range(n)
    ]


def _assert_same(got: list[tuple[int, float]], want: list[tuple[int, float]]) -> None:
    assert [seq for seq, _ in got] == [seq for seq, _ in want]
    for (_, a), (_, b) in zip(got, want, strict=True):
        assert a == pytest.approx(b, rel=1e-9, abs=0.0)


def test_search_ranks_and_scores_like_sqlite_fts5(pg: PostgresMemoryStore) -> None:
    sqlite = MemoryStore(counter=CharCounter())
    rng = random.Random(15)
    for store in (pg, sqlite):
        for sid in _SESSIONS:
            store.create_session(sid)
    for sid in _SESSIONS:
        texts = [*_texts(rng, 30), "Deploy deploy DEPLOY deploying", "foo bar foo_bar"]
        for store in (pg, sqlite):
            store.append_turns(sid, [_msg(t) for t in texts])
            store.compact(
                sid,
                [
                    NewSegment(first_seq=i, last_seq=i, summary=texts[i - 1], full_text="")
                    for i in range(1, 9)
                ],
                9,
            )
    for store in (pg, sqlite):  # the whole table's totals follow deletes and forks
        store.delete_session("sess-2")
        store.fork("s1", 20, session_id_new="s1-branch")
    for sid in [*_SESSIONS, "s1-branch"]:
        for query in _QUERIES:
            for limit in (3, 100):
                _assert_same(
                    pg.search_turn_seqs(sid, query, limit),
                    sqlite.search_turn_seqs(sid, query, limit),
                )
            got = [(s.first_seq, score) for s, score in pg.search_segments(sid, query, 100)]
            want = [(s.first_seq, score) for s, score in sqlite.search_segments(sid, query, 100)]
            _assert_same(got, want)
    turns = pg.search_turns("s1", "deploying friday", 5)
    assert [(t.seq, s) for t, s in turns] == pg.search_turn_seqs("s1", "deploying friday", 5)
    sqlite.close()


def test_migrations_run_once_when_processes_open_the_store_together(postgres_url: str) -> None:
    script = (
        "import sys; from contextfold.store.postgres.memory import PostgresMemoryStore;"
        "from contextfold.tokens import CharCounter;"
        "PostgresMemoryStore(sys.argv[1], counter=CharCounter()).close()"
    )
    _run_together(script, postgres_url, 3)
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        names = [r[0] for r in conn.execute("SELECT name FROM schema_migrations ORDER BY name")]
        assert names == MIGRATIONS.names
        assert MIGRATIONS.apply(conn) == []


def test_live_tokens_are_counted_for_sessions_stored_before_they_were_kept(
    postgres_url: str,
) -> None:
    """``m005_live_tokens`` counts the live tokens of the sessions already there."""
    before = PgMigrationRegistry("memory")
    for name in MIGRATIONS.names[: MIGRATIONS.names.index("m005_live_tokens")]:
        before.migration(getattr(schema, name))
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        before.apply(conn)
        conn.execute("INSERT INTO sessions (id, created_at) VALUES ('s', now()), ('e', now())")
        for seq, tokens in enumerate([5, 7, 11], start=1):
            conn.execute(
                "INSERT INTO turns (session_id, seq, role, content_text, message_json,"
                " content_hash, created_at, token_count) VALUES ('s', %s, 'user', 'x', '{}',"
                " 'h', now(), %s)",
                (seq, tokens),
            )
        conn.execute("UPDATE sessions SET compaction_watermark = 2 WHERE id = 's'")
    store = PostgresMemoryStore(postgres_url, counter=CharCounter())
    try:
        assert store.active_tokens("s") == 7 + 11 and store.active_tokens("e") == 0
        store.append_turns("s", [_msg("four")])
        assert store.active_tokens("s") == 7 + 11 + CharCounter().count("four")
    finally:
        store.close()


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE turns SET content_text = 'forged' WHERE seq = 1",
        "UPDATE turns SET seq = 99 WHERE seq = 2",
        "DELETE FROM turns WHERE seq = 2",
        "DELETE FROM turns",
    ],
)
def test_raw_turns_cannot_be_updated_or_deleted(
    pg: PostgresMemoryStore, postgres_url: str, statement: str
) -> None:
    pg.create_session("s")
    pg.append_turns("s", [_msg("one"), _msg("two")])
    with (
        psycopg.connect(postgres_url, autocommit=True) as conn,
        pytest.raises(psycopg.errors.RestrictViolation, match="append-only"),
    ):
        conn.execute(statement)
    assert [t.message.text() for t in pg.turns("s")] == ["one", "two"]
    assert pg.delete_session("s") and pg.turns("s") == []


def test_threads_committing_to_one_session_get_every_seq_once(pg: PostgresMemoryStore) -> None:
    pg.create_session("s")
    seqs: list[int] = []
    lock = threading.Lock()

    def writer(n: int) -> None:
        for i in range(10):
            got = pg.commit_exchange("s", [_msg(f"q{n}.{i}"), _msg("a", "assistant")])
            with lock:
                seqs.extend(got)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(seqs) == list(range(1, 161))
    assert [t.seq for t in pg.turns("s")] == list(range(1, 161))
    assert pg.jobs.job_counts() == {"pending": 1}


def test_one_of_racing_exchanges_continues_the_branch(pg: PostgresMemoryStore) -> None:
    pg.create_session("s")
    pg.append_turns("s", [_msg("start")])
    outcomes: list[str] = []
    barrier = threading.Barrier(6)

    def writer(n: int) -> None:
        barrier.wait()
        try:
            pg.commit_exchange("s", [_msg(f"from {n}")], expect_last=1)
            outcomes.append("won")
        except BranchMoved as exc:
            assert (exc.expected, exc.last) == (1, 2)
            outcomes.append("moved")

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["moved"] * 5 + ["won"]
    assert pg.last_seq("s") == 2


def test_two_processes_committing_to_one_session_never_collide(
    pg: PostgresMemoryStore, postgres_url: str
) -> None:
    pg.create_session("s")
    # Each process continues the branch it last saw (``expect_last``), as a proxy host does,
    # and reads it again when the other moved it first; it prints how often that happened.
    script = "\n".join(
        [
            "import sys",
            "from contextfold.items import Message",
            "from contextfold.store.models import BranchMoved",
            "from contextfold.store.postgres.memory import PostgresMemoryStore",
            "from contextfold.tokens import CharCounter",
            "s = PostgresMemoryStore(sys.argv[1], counter=CharCounter())",
            "moved = done = 0",
            "while done < 40:",
            "    pair = [Message(role='user', content=f'q{done}'),",
            "            Message(role='assistant', content='a')]",
            "    try:",
            "        s.commit_exchange('s', pair, expect_last=s.last_seq('s'))",
            "        done += 1",
            "    except BranchMoved:",
            "        moved += 1",
            "print(moved); s.close()",
        ]
    )
    outputs = _run_together(script, postgres_url, 2)
    turns = pg.turns("s")
    assert [t.seq for t in turns] == list(range(1, 161))
    assert [t.message.role for t in turns] == ["user", "assistant"] * 80
    assert all(int(out) >= 0 for out in outputs)
    with pytest.raises(BranchMoved) as moved:  # a stale branch, from any process
        pg.commit_exchange("s", [_msg("late")], expect_last=100)
    assert (moved.value.expected, moved.value.last) == (100, 160)
    assert pg.last_seq("s") == 160


def test_workers_in_several_processes_claim_each_job_once(
    pg: PostgresMemoryStore, postgres_url: str
) -> None:
    for n in range(40):
        pg.create_session(f"s{n}")
        pg.jobs.enqueue_job(f"s{n}")
    script = (
        "import json, os, sys; from contextfold.store.postgres.memory import PostgresMemoryStore;"
        "from contextfold.tokens import CharCounter;"
        "s = PostgresMemoryStore(sys.argv[1], counter=CharCounter()); got = [];"
        "job = s.jobs.claim_job(f'w:{os.getpid()}')\n"
        "while job is not None:\n"
        "    got.append(job.id); job = s.jobs.claim_job(f'w:{os.getpid()}')\n"
        "print(json.dumps(got)); s.close()"
    )
    claimed = [job for out in _run_together(script, postgres_url, 3) for job in json.loads(out)]
    assert len(claimed) == 40 and len(set(claimed)) == 40
    assert pg.jobs.job_counts() == {"running": 40}


def test_one_pending_job_per_session_and_kind(pg: PostgresMemoryStore) -> None:
    pg.create_session("s")
    for _ in range(3):
        pg.jobs.enqueue_job("s")
    pg.jobs.enqueue_job("s", "summarize")
    assert pg.jobs.job_counts() == {"pending": 2}


def test_path_masks_the_password(postgres_url: str) -> None:
    with_password = postgres_url.replace("postgres@", "postgres:s3cret@")
    store = PostgresMemoryStore(with_password, counter=CharCounter())
    try:
        assert "s3cret" not in store.path and store.path.startswith("postgresql://postgres:***@")
    finally:
        store.close()


def test_an_unreachable_server_is_a_clear_store_error() -> None:
    with pytest.raises(
        StoreError, match=r"cannot connect .* postgresql://u:\*\*\*@127\.0\.0\.1:1/"
    ):
        PostgresMemoryStore("postgresql://u:pw@127.0.0.1:1/none", counter=CharCounter())


def test_a_missing_driver_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)  # ``import psycopg`` fails
    with pytest.raises(ConfigError, match=r'pip install "contextfold\[postgres\]"'):
        PostgresMemoryStore("postgresql://u@127.0.0.1:1/none", counter=CharCounter())


def test_batch_is_one_transaction(pg: PostgresMemoryStore) -> None:
    pg.create_session("s")
    with pytest.raises(ConfigError), pg.batch():
        pg.append_turns("s", [_msg("kept only with the rest")])
        pg.set_turn_tags("s", 1, {"topic": 1.0})
        pg.create_session("s")  # exists: the whole batch rolls back
    assert pg.turns("s") == [] and pg.search_turn_seqs("s", "kept") == []


def _run_together(script: str, url: str, processes: int) -> list[str]:
    """Run ``script`` (given ``url``) in several Python processes at once; their stdouts."""
    src = str(Path(contextfold.__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, url],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(processes)
    ]
    outputs = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        outputs.append(out)
    return outputs


def test_m007_counts_the_tags_and_segments_a_database_already_holds(postgres_url: str) -> None:
    store = PostgresMemoryStore(postgres_url, counter=CharCounter())
    store.create_session("s1")
    store.append_turns("s1", [_msg(f"turn {n}") for n in range(4)])
    store.set_tags_many("s1", {1: ({"kiln": 1.0}, ["oven"]), 2: ({"kiln": 1.0, "glaze": 1.0}, [])})
    store.compact(
        "s1", [NewSegment(first_seq=1, last_seq=2, summary="s", full_text="", tags=("kiln",))], 3
    )
    store.close()
    with psycopg.connect(postgres_url, autocommit=True) as conn:  # as before m007
        conn.execute("DROP TABLE tag_stats")
        for name in ("add", "remove", "change", "watermark", "segment"):
            conn.execute(f"DROP FUNCTION cf_tag_stats_{name}() CASCADE")
        conn.execute("DELETE FROM schema_migrations WHERE name = 'm007_tag_stats'")
    store = PostgresMemoryStore(postgres_url, counter=CharCounter())
    assert store.tag_counts("s1") == {"glaze": 1, "kiln": 2}
    assert store.topic_counts("s1") == (3, {"kiln": 2})
    store.close()


def test_m009_counts_the_related_tags_a_database_already_holds(postgres_url: str) -> None:
    store = PostgresMemoryStore(postgres_url, counter=CharCounter())
    store.create_session("s1")
    store.append_turns("s1", [_msg(f"turn {n}") for n in range(3)])
    store.set_tags_many("s1", {1: ({"kiln": 1.0}, ["oven"]), 2: ({"glaze": 1.0}, ["oven", "x"])})
    store.close()
    with psycopg.connect(postgres_url, autocommit=True) as conn:  # as before m009
        conn.execute("DROP TABLE related_tag_stats")
        for name in ("add", "remove", "change"):
            conn.execute(f"DROP FUNCTION cf_related_stats_{name}() CASCADE")
        conn.execute("DELETE FROM schema_migrations WHERE name = 'm009_related_tag_stats'")
    store = PostgresMemoryStore(postgres_url, counter=CharCounter())
    assert store.vocab.related_tag_counts("s1") == {"oven": 2, "x": 1}
    store.set_turn_tags("s1", 2, {"glaze": 1.0})
    assert store.vocab.related_tag_counts("s1") == {"oven": 1}
    store.close()


def test_m010_keeps_each_tags_newest_segment_for_a_database_holding_segments(
    postgres_url: str,
) -> None:
    store = PostgresMemoryStore(postgres_url, counter=CharCounter())
    store.create_session("s1")
    store.append_turns("s1", [_msg(f"turn {n}") for n in range(8)])
    store.compact(
        "s1",
        [
            NewSegment(first_seq=1, last_seq=2, summary="a", full_text="", tags=("kiln",)),
            NewSegment(first_seq=3, last_seq=5, summary="b", full_text="", tags=("kiln", "x")),
        ],
        6,
    )
    store.close()
    with psycopg.connect(postgres_url, autocommit=True) as conn:  # as before m010
        conn.execute("DROP INDEX segments_by_last_seq")
        conn.execute("ALTER TABLE tag_stats DROP COLUMN segment_last_seq")
        conn.execute("DELETE FROM schema_migrations WHERE name = 'm010_tag_stats_segment_last_seq'")
    store = PostgresMemoryStore(postgres_url, counter=CharCounter())
    store.paging.upsert_tag_summary("s1", "kiln", "k", 2)
    store.paging.upsert_tag_summary("s1", "x", "x", 5)
    read = store.paging.segments_since_summary("s1")
    assert list(read) == ["kiln"] and (read["kiln"].segments, read["kiln"].last_seq) == (("b",), 5)
    store.compact(
        "s1", [NewSegment(first_seq=6, last_seq=7, summary="c", full_text="", tags=("x",))], 8
    )
    assert store.paging.segments_since_summary("s1")["x"].segments == ("c",)
    store.close()
