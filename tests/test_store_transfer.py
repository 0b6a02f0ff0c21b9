"""Whole sessions moved between stores: ``dump_session`` / ``load_session``, ``contextfold store
migrate`` and the markdown export (``memory export --format markdown`` / ``memory import``).

Every test that writes into a destination store runs once per backend (``dst_location``): an
SQLite file, and a PostgreSQL database of the test's own.
"""

from __future__ import annotations

import hashlib
import shutil
import sqlite3
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner, Result

from contextfold.cli import app
from contextfold.errors import ConfigError
from contextfold.items import Message, TextBlock, ToolResultBlock, ToolUseBlock
from contextfold.store import open_memory_store
from contextfold.store.markdown import _read, _write, export_markdown, import_markdown
from contextfold.store.models import NewSegment, SessionDump
from contextfold.store.protocols import MemoryStorage
from contextfold.store.sqlite.connection import connect
from contextfold.store.sqlite.memory import MemoryStore
from contextfold.store.sqlite.memory_schema import MIGRATIONS as MEMORY_MIGRATIONS
from contextfold.store.transfer import migrate, verify
from contextfold.tokens import CharCounter
from strategies import histories

T0 = datetime(2025, 3, 1, 9, 30, 0, 123456, tzinfo=UTC)


@pytest.fixture(params=["sqlite", "postgres"])
def dst_location(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where a destination store lives: an SQLite file, or a new PostgreSQL database."""
    if request.param == "postgres":
        return str(request.getfixturevalue("postgres_url"))
    return str(tmp_path / "dst.db")


@pytest.fixture
def dst(dst_location: str) -> Iterator[MemoryStorage]:
    store = open_memory_store(dst_location, counter=CharCounter())
    yield store
    store.close()


def _tool_exchange() -> list[Message]:
    return [
        Message(role="user", content="Wetter in Zürich? 🌦"),
        Message(
            role="assistant",
            content=(
                TextBlock(text="Ich schaue nach."),
                ToolUseBlock(id="c1", name="get_weather", input={"city": "Zürich", "n": [1, 2]}),
            ),
        ),
        Message(
            role="tool",
            content=(ToolResultBlock(tool_use_id="c1", name="get_weather", content='{"c": 18}'),),
        ),
        Message(role="assistant", content="18 °C.\n\nTrailing spaces   \n", name="bot"),
    ]


def _filled(path: Path) -> MemoryStore:
    """A store with a compacted, tagged, embedded, partly derived session ``main``, a branch
    of it, a plain session, aliases and a cost log."""
    store = MemoryStore(path, counter=CharCounter())
    store.create_session("main", {"user": "ada", "n": [1, {"x": None}]}, principal="p1")
    messages = [
        Message(role="system", content="Be brief."),
        *_tool_exchange(),
        Message(role="user", content="Deploy the billing service on Friday"),
        Message(role="assistant", content="Noted: Friday.\r\nWith CRLF."),
        Message(role="user", content="数据 and café"),
    ]
    times = [T0 + timedelta(minutes=i) for i in range(len(messages))]
    partial = [False] * (len(messages) - 2) + [True, False]
    store.append_turns("main", messages, timestamps=times, partial=partial)
    store.set_tags_many(
        "main",
        {
            1: ({"style": 1.0}, []),
            2: ({"weather": 1.0, "zurich": 0.75}, ["city", "forecast"]),
            6: ({"billing": 0.9, "deploy": 1.0}, ["release"]),
            7: ({"deploy": 0.5}, []),
        },
    )
    store.compact(
        "main",
        [
            NewSegment(
                first_seq=1,
                last_seq=3,
                summary="Weather asked.",
                full_text="user: Wetter…",
                tags=("weather",),
                related_tags=("city",),
            ),
            NewSegment(first_seq=4, last_seq=5, summary="Answered.", full_text="18 °C"),
        ],
        6,
    )
    store.paging.upsert_tag_summary("main", "weather", "Zürich: 18 °C.", 5)
    store.paging.upsert_tag_summary("main", "deploy", "Friday.", 6, tokens=3)
    store.paging.set_working_set("main", "weather", "summary", 12, last_used=T0)
    store.paging.set_working_set("main", "deploy", "full", 40, last_used=T0 + timedelta(hours=1))
    rng = np.random.default_rng(7)
    store.add_turn_vectors("main", "mini", [1, 2, 3], rng.random((3, 4), dtype=np.float32))
    store.add_turn_vectors("main", "other", [1], rng.random((1, 2), dtype=np.float32))
    store.mark_derived("main", 6)
    store.fork("main", 6, session_id_new="branch")
    store.commit_exchange("branch", [Message(role="user", content="And on Monday?")])
    plain = store.create_session("plain")
    store.append_turns(plain, [Message(role="user", content="hi")], timestamps=[T0])
    store.vocab.set_alias("k8s", "kubernetes")
    store.vocab.set_alias("pg", "postgres", session_id="main")
    store.vocab.record_split("main", "weather", ["weather-zurich", "weather-general"])
    store.vocab.record_split("main", "deploy", [])
    store.costs.log_cost("main", "tagging", "gpt-x", 10, 2, 0.001, at=T0)
    store.costs.log_cost(None, "summary", "gpt-x", 100, 20, 0.01, at=T0 + timedelta(seconds=1))
    store.costs.log_cost("branch", "tagging", "gpt-x", 10, 2, 0.001, at=T0 + timedelta(seconds=2))
    return store


@pytest.fixture
def src(tmp_path: Path) -> Iterator[MemoryStore]:
    store = _filled(tmp_path / "src.db")
    yield store
    store.close()


def assert_same(a: SessionDump, b: SessionDump, *, vectors: bool = True) -> None:
    """Every field equal, segment ids and the session's incarnation and generation aside (a
    store draws its own)."""
    local = {"born": 0, "generation": 0}
    assert a.session.model_copy(update=local) == b.session.model_copy(update=local)
    assert a.turns == b.turns
    assert [s.model_copy(update={"id": 0}) for s in a.segments] == [
        s.model_copy(update={"id": 0}) for s in b.segments
    ]
    assert a.tag_summaries == b.tag_summaries
    assert a.working_set == b.working_set
    assert a.aliases == b.aliases and a.tag_splits == b.tag_splits
    if vectors:
        assert a.vectors.keys() == b.vectors.keys()
        for model, (seqs, matrix) in a.vectors.items():
            assert b.vectors[model][0] == seqs
            assert np.array_equal(b.vectors[model][1], matrix)


def _sessions_of(location: str | Path) -> list[str]:
    store = open_memory_store(location, counter=CharCounter())
    try:
        return store.sessions()
    finally:
        store.close()


def _everything(store: MemoryStorage) -> dict[str, SessionDump]:
    return {sid: store.transfer.dump_session(sid) for sid in store.sessions()}


# -- dump and load -----------------------------------------------------------------------------


def test_dump_holds_everything(src: MemoryStore) -> None:
    dump = src.transfer.dump_session("main")
    assert dump.session.principal == "p1" and dump.session.compaction_watermark == 6
    assert dump.session.derived_seq == 6
    assert [t.seq for t in dump.turns] == list(range(1, 9))
    assert dump.turns[6].partial and dump.turns[1].related_tags == ("city", "forecast")
    assert [s.seqs for s in dump.segments] == [(1, 2, 3), (4, 5)]
    assert {s.tag for s in dump.tag_summaries} == {"deploy", "weather"}
    assert [w.tag for w in dump.working_set] == ["weather", "deploy"]
    assert dump.vectors["mini"][0] == [1, 2, 3] and dump.vectors["mini"][1].shape == (3, 4)
    assert dump.aliases == {"pg": "postgres"}
    assert dump.tag_splits == {"deploy": (), "weather": ("weather-zurich", "weather-general")}
    branch = src.transfer.dump_session("branch")
    assert (branch.session.parent_id, branch.session.fork_seq) == ("main", 6)
    with pytest.raises(KeyError):
        src.transfer.dump_session("nope")


def test_load_round_trips_every_session(src: MemoryStore, dst: MemoryStorage) -> None:
    for sid in src.sessions():
        dst.transfer.load_session(src.transfer.dump_session(sid))
    assert dst.sessions() == src.sessions()
    for sid in src.sessions():
        assert_same(src.transfer.dump_session(sid), dst.transfer.dump_session(sid))
    # What reads the loaded rows gives what it gave on the source.
    assert dst.tag_counts("main") == src.tag_counts("main")
    assert dst.turn_keys("main", 1, 8) == src.turn_keys("main", 1, 8)
    assert [t.seq for t, _ in dst.search_turns("main", "billing")] == [6]
    assert [s.summary for s, _ in dst.search_segments("main", "weather")] == ["Weather asked."]
    assert dst.active_tokens("main") == src.active_tokens("main")
    assert dst.latest_session("p1") is not None


def test_load_queues_derive_only_past_derived_seq(src: MemoryStore, dst: MemoryStorage) -> None:
    dst.transfer.load_session(
        src.transfer.dump_session("plain")
    )  # derived_seq 0, one turn: needs deriving
    dst.transfer.load_session(src.transfer.dump_session("main"))  # derived up to 6 of 8
    derived = src.transfer.dump_session("main")
    derived.session = derived.session.model_copy(update={"id": "done", "derived_seq": 8})
    derived.turns = [t.model_copy(update={"session_id": "done"}) for t in derived.turns]
    dst.transfer.load_session(derived)  # everything derived: no job
    jobs = []
    while (job := dst.jobs.claim_job("w")) is not None:
        jobs.append((job.session_id, job.kind))
        dst.jobs.finish_job(job.id, "w")
    assert sorted(jobs) == [("main", "derive"), ("plain", "derive")]


def test_load_refuses_what_would_break_the_store(src: MemoryStore, dst: MemoryStorage) -> None:
    dump = src.transfer.dump_session("main")
    dst.transfer.load_session(dump)
    with pytest.raises(ConfigError, match="already exists"):
        dst.transfer.load_session(dump)
    tampered = src.transfer.dump_session("plain")
    tampered.turns = [
        tampered.turns[0].model_copy(update={"message": Message(role="user", content="bye")})
    ]
    with pytest.raises(ConfigError, match="content hash"):
        dst.transfer.load_session(tampered)
    gap = src.transfer.dump_session("branch")
    gap.turns = gap.turns[1:]
    with pytest.raises(ConfigError, match="without a gap"):
        dst.transfer.load_session(gap)
    assert "plain" not in dst.sessions() and "branch" not in dst.sessions()


def test_loaded_turns_stay_immutable(src: MemoryStore, tmp_path: Path) -> None:
    dst = MemoryStore(tmp_path / "copy.db", counter=CharCounter())
    dst.transfer.load_session(src.transfer.dump_session("main"))
    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        dst._conn.execute("UPDATE turns SET content_text = 'x' WHERE session_id = 'main'")
    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        dst._conn.execute("DELETE FROM turns WHERE session_id = 'main'")
    assert dst.delete_session("main")
    dst.close()


def test_cost_entries_oldest_first(src: MemoryStore) -> None:
    entries = src.costs.cost_entries()
    assert [(e.session_id, e.kind) for e in entries] == [
        ("main", "tagging"),
        (None, "summary"),
        ("branch", "tagging"),
    ]
    assert entries[0].at == T0 and entries[1].prompt_tokens == 100


# -- store migrate -----------------------------------------------------------------------------


def invoke(*args: str | Path) -> Result:
    result = CliRunner().invoke(app, [str(a) for a in args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception  # a bug (or a backend not written yet), not an exit code
    return result


def test_migrate_function_reports_and_verifies(src: MemoryStore, dst: MemoryStorage) -> None:
    seen: list[tuple[str, int]] = []
    report = migrate(src, dst, progress=lambda sid, turns: seen.append((sid, turns)))
    assert sorted(report.copied) == ["branch", "main", "plain"]
    assert report.turns == 8 + 7 + 1 and report.problems == [] and report.aliases == 1
    assert report.costs == 3 and sorted(seen) == [("branch", 7), ("main", 8), ("plain", 1)]
    assert dst.vocab.aliases() == {"k8s": "kubernetes"}
    assert dst.costs.cost_entries() == src.costs.cost_entries()


def test_verify_names_what_differs() -> None:
    a, b = MemoryStore(counter=CharCounter()), MemoryStore(counter=CharCounter())
    for store, last in ((a, "bye"), (b, "ciao")):
        store.create_session("same")
        store.append_turns("same", [Message(role="user", content="hi")])
        store.create_session("other")
        store.append_turns("other", [Message(role="user", content=last)])
    a.create_session("longer")
    a.append_turns("longer", [Message(role="user", content="x")] * 2)
    b.create_session("longer")
    b.append_turns("longer", [Message(role="user", content="x")])
    a.create_session("gone")
    assert sorted(verify(a, b)) == [
        "1 of 4 session(s) missing from the destination: 'gone'",
        "session 'longer': last turn 1 in the destination, 2 in the source",
        "session 'other': turn 1 differs (content hash)",
    ]
    assert verify(a, b, ["same"]) == []


@pytest.mark.integration
def test_store_migrate_file_to_store(tmp_path: Path, dst_location: str) -> None:
    source = tmp_path / "src.db"
    _filled(source).close()
    first = open_memory_store(source, counter=CharCounter())
    before = _everything(first)
    first.close()
    result = invoke("store", "migrate", source, dst_location, "--no-progress")
    assert result.exit_code == 0, result.output
    assert "3 copied, 0 skipped" in result.stdout and "16" in result.stdout
    assert "all 3 sessions in DST" in result.stdout
    check = open_memory_store(source, counter=CharCounter())
    after = _everything(check)
    copied = open_memory_store(dst_location, counter=CharCounter())
    for sid, dump in before.items():
        assert_same(dump, after[sid])  # the source is untouched
        assert_same(dump, copied.transfer.dump_session(sid))
    assert copied.costs.cost_entries() == check.costs.cost_entries()
    assert copied.vocab.aliases() == {"k8s": "kubernetes"}

    # Again: every session is there already.
    again = invoke("store", "migrate", source, dst_location)
    assert again.exit_code == 2
    assert again.stderr.startswith("error: ") and "already holds 3 of the 3" in again.stderr

    # --skip-existing copies only what is missing, and no cost entry twice.
    check.create_session("late")
    check.append_turns("late", [Message(role="user", content="later")])
    check.costs.log_cost("late", "tagging", "gpt-x", 1, 1, 0.0, at=T0 + timedelta(days=1))
    check.close()
    resumed = invoke("store", "migrate", source, dst_location, "--skip-existing")
    assert resumed.exit_code == 0, resumed.output
    assert "1 copied, 3 skipped" in resumed.stdout
    assert copied.sessions()[-1] == "late" and len(copied.costs.cost_entries()) == 4
    copied.close()


@pytest.mark.integration
def test_store_migrate_errors(tmp_path: Path) -> None:
    source = tmp_path / "src.db"
    _filled(source).close()
    cases = [
        (("store", "migrate", tmp_path / "missing.db", tmp_path / "x.db"), "no such file"),
        (("store", "migrate", source, "mysql://u:secret@h/db"), "unsupported URL scheme"),
        (("store", "migrate", source, source), "the same store"),
        (("store", "migrate", tmp_path, tmp_path / "x.db"), "is a directory"),
    ]
    for args, fragment in cases:
        result = invoke(*args)
        assert result.exit_code == 2, result.output
        assert fragment in result.stderr.splitlines()[0], result.stderr
        assert "secret" not in result.stderr and "Traceback" not in result.output
    assert not (tmp_path / "x.db").exists()


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _older_store(path: Path) -> None:
    """An SQLite memory store as an older contextfold left it: its last migrations not run."""
    conn = connect(path)
    MEMORY_MIGRATIONS.apply(conn, upto=MEMORY_MIGRATIONS.names[-2])
    conn.close()


@pytest.mark.integration
@pytest.mark.parametrize(
    ("make", "fragment"),
    [
        (
            lambda p: (
                sqlite3.connect(p).execute("create table invoices(id int)").connection.close()
            ),
            "not a contextfold memory store",
        ),
        (lambda p: p.write_bytes(b""), "not a contextfold memory store"),
        (lambda p: p.write_text("id,total\n1,9.50\n"), "not an SQLite database"),
        (_older_store, "written by an older contextfold"),
    ],
    ids=["foreign-sqlite", "empty-file", "csv", "older-store"],
)
def test_store_migrate_only_reads_a_source_that_is_a_memory_store(
    tmp_path: Path, make: Callable[[Path], object], fragment: str
) -> None:
    """SRC is only read: a file that is not a memory store of this version is refused, left
    byte for byte as it was (no tables added, no migration run), and DST is not made."""
    source = tmp_path / "src.db"
    make(source)
    before = _digest(source)
    result = invoke("store", "migrate", source, tmp_path / "dst.db", "--no-progress")
    assert result.exit_code == 2, result.output
    first = result.stderr.splitlines()[0]
    assert first.startswith("error: ") and f"source {source}" in first and fragment in first
    assert _digest(source) == before
    assert not (tmp_path / "dst.db").exists()


@pytest.mark.integration
def test_store_migrate_leaves_a_memory_store_source_as_it_was(tmp_path: Path) -> None:
    source = tmp_path / "src.db"
    _filled(source).close()
    before = _digest(source)
    result = invoke("store", "migrate", source, tmp_path / "dst.db", "--no-progress")
    assert result.exit_code == 0, result.output
    assert _digest(source) == before


@pytest.mark.integration
def test_store_migrate_from_postgres(tmp_path: Path, postgres_url: str) -> None:
    """A PostgreSQL source is read the same way: an empty database is no memory store (and
    gets no tables), a memory store copies to a file."""
    import psycopg

    def tables() -> list[str]:
        with psycopg.connect(postgres_url) as conn:
            rows = conn.execute(
                "SELECT table_name FROM information_schema.tables"
                " WHERE table_schema = 'public' ORDER BY table_name"
            ).fetchall()
        return [r[0] for r in rows]

    empty = invoke("store", "migrate", postgres_url, tmp_path / "x.db", "--no-progress")
    assert empty.exit_code == 2, empty.output
    assert "not a contextfold memory store" in empty.stderr.splitlines()[0]
    assert tables() == [] and not (tmp_path / "x.db").exists()

    filled = _filled(tmp_path / "filled.db")
    pg = open_memory_store(postgres_url, counter=CharCounter())
    for sid in filled.sessions():
        pg.transfer.load_session(filled.transfer.dump_session(sid))
    pg.close()
    there = tables()
    result = invoke("store", "migrate", postgres_url, tmp_path / "copy.db", "--no-progress")
    assert result.exit_code == 0, result.output
    assert "3 copied, 0 skipped" in result.stdout
    assert _sessions_of(tmp_path / "copy.db") == filled.sessions()
    assert tables() == there
    filled.close()


# -- markdown ----------------------------------------------------------------------------------


@pytest.mark.integration
def test_markdown_round_trip_through_the_cli(tmp_path: Path, dst_location: str) -> None:
    source = tmp_path / "src.db"
    _filled(source).close()
    out = tmp_path / "export"
    result = invoke("memory", "export", "--format", "markdown", out, "--store", source)
    assert result.exit_code == 0, result.output
    turn = (out / "main" / "turns" / "000003.md").read_text(encoding="utf-8")
    assert turn.startswith("---\nseq: 3\nrole: assistant\n") and "tool_use" in turn
    assert (out / "main" / "tags" / "weather" / "summary.md").is_file()
    assert "turns/000002.md" in (out / "main" / "tags" / "weather" / "index.md").read_text()
    assert (out / "main" / "segments" / "0002.md").is_file()
    result = invoke("memory", "import", out, "--store", dst_location)
    assert result.exit_code == 0, result.output
    original = open_memory_store(source, counter=CharCounter())
    loaded = open_memory_store(dst_location, counter=CharCounter())
    assert loaded.sessions() == original.sessions()
    for sid in original.sessions():
        assert_same(
            original.transfer.dump_session(sid), loaded.transfer.dump_session(sid), vectors=False
        )
        assert loaded.transfer.dump_session(sid).vectors == {}  # derived: not exported
    assert loaded.costs.cost_entries() == original.costs.cost_entries()
    assert loaded.vocab.aliases() == original.vocab.aliases()
    # Exporting one session writes that one, with its own cost entries.
    one = tmp_path / "one"
    result = invoke("memory", "export", one, "-s", "branch", "--store", source)
    assert result.exit_code == 0, result.output
    assert [p.name for p in one.iterdir() if p.is_dir()] == ["branch"]
    again = invoke("memory", "export", one, "-s", "branch", "--store", source)
    assert again.exit_code == 2 and "--overwrite" in again.stderr
    assert invoke("memory", "export", one, "-s", "main", "--store", source).exit_code == 2
    over = invoke("memory", "export", one, "-s", "branch", "--store", source, "--overwrite")
    assert over.exit_code == 0, over.output
    original.close()
    loaded.close()


@pytest.mark.integration
def test_markdown_import_refuses_a_tampered_turn(tmp_path: Path) -> None:
    source = tmp_path / "src.db"
    _filled(source).close()
    out = tmp_path / "export"
    assert invoke("memory", "export", out, "--store", source).exit_code == 0
    plain = out / "main" / "turns" / "000006.md"
    plain.write_text(plain.read_text(encoding="utf-8").replace("Friday", "Monday"), "utf-8")
    target = tmp_path / "copy.db"
    result = invoke("memory", "import", out, "--store", target)
    assert result.exit_code == 2
    first = result.stderr.splitlines()[0]
    assert str(plain) in first and "content hash" in first
    assert _sessions_of(target) == []

    # A tool-call turn: its text is rendered from the message in the front-matter.
    plain.write_text(plain.read_text(encoding="utf-8").replace("Monday", "Friday"), "utf-8")
    tool = out / "main" / "turns" / "000003.md"
    head, mark, body = tool.read_text(encoding="utf-8").rpartition("---\n")
    tool.write_text(head + mark + body.replace("Ich schaue", "Du schaust"), "utf-8")
    result = invoke("memory", "import", out, "--store", target)
    assert result.exit_code == 2 and str(tool) in result.stderr and "edited" in result.stderr
    assert _sessions_of(target) == []


def _front_matter(path: Path, drop: str | None = None, body: str | None = None) -> None:
    """Rewrite ``path`` without the front-matter key ``drop`` and/or with a new ``body``."""
    data, text = _read(path)
    data.pop(drop, None)
    _write(path, data, text if body is None else body)


@pytest.mark.integration
def test_markdown_import_refuses_a_session_missing_its_last_turns(tmp_path: Path) -> None:
    """The turns found must be those session.md records: a session that lost its last turn
    file would load short, and its next turn would take a seq the store counts as derived."""
    source = tmp_path / "src.db"
    _filled(source).close()
    out = tmp_path / "export"
    assert invoke("memory", "export", out, "--store", source).exit_code == 0
    record, _ = _read(out / "main" / "session.md")
    assert record["last_seq"] == 8 and record["derived_seq"] == 6
    (out / "main" / "turns" / "000008.md").unlink()  # not derived yet: only the count knows
    target = tmp_path / "copy.db"
    result = invoke("memory", "import", out, "--store", target)
    assert result.exit_code == 2, result.output
    first = result.stderr.splitlines()[0]
    assert first.startswith("error: ") and "'main'" in first and "turn 8 is missing" in first
    assert _sessions_of(target) == []

    # An export written before session.md recorded ``last_seq``: its body lists the turns.
    _front_matter(out / "main" / "session.md", drop="last_seq")
    result = invoke("memory", "import", out, "--store", target)
    assert result.exit_code == 2 and "turn 8 is missing" in result.stderr.splitlines()[0]
    assert _sessions_of(target) == []

    # Nothing lists them either: what the record says was derived and compacted still counts.
    _front_matter(out / "main" / "session.md", body="# Session main")
    for seq in (5, 6, 7):
        (out / "main" / "turns" / f"00000{seq}.md").unlink()
    result = invoke("memory", "import", out, "--store", target)
    assert result.exit_code == 2, result.output
    first = result.stderr.splitlines()[0]
    assert "'main'" in first and "turns 5–6 are missing" in first, first
    assert _sessions_of(target) == []


@pytest.mark.integration
def test_markdown_import_refuses_turns_session_md_does_not_record(tmp_path: Path) -> None:
    source = tmp_path / "src.db"
    _filled(source).close()
    out = tmp_path / "export"
    assert invoke("memory", "export", out, "--store", source).exit_code == 0
    # A turn file added by hand (its content hash intact) is not part of the session.
    data, body = _read(out / "plain" / "turns" / "000001.md")
    _write(out / "plain" / "turns" / "000002.md", {**data, "seq": 2}, body)
    target = tmp_path / "copy.db"
    result = invoke("memory", "import", out, "--store", target)
    assert result.exit_code == 2, result.output
    first = result.stderr.splitlines()[0]
    assert "'plain'" in first and "records 1 turn" in first, first
    assert _sessions_of(target) == []


@pytest.mark.integration
def test_markdown_import_errors(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    result = invoke("memory", "import", empty, "--store", tmp_path / "m.db")
    assert result.exit_code == 2 and "not an export" in result.stderr
    result = invoke("memory", "import", tmp_path / "none", "--store", tmp_path / "m.db")
    assert result.exit_code == 2 and "no such folder" in result.stderr
    result = invoke("memory", "export", tmp_path / "o", "--format", "json", "--store", "x.db")
    assert result.exit_code == 2 and "--format must be one of markdown" in result.stderr


def _pg_tables(url: str) -> list[str]:
    """The tables of the PostgreSQL database at ``url`` (none: no store was made there)."""
    import psycopg

    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT table_name FROM information_schema.tables"
            " WHERE table_schema = 'public' ORDER BY table_name"
        ).fetchall()
    return [r[0] for r in rows]


def _break_turn(out: Path) -> None:
    (out / "main" / "turns" / "000008.md").unlink()


def _edit_turn(out: Path) -> None:
    plain = out / "main" / "turns" / "000006.md"
    plain.write_text(plain.read_text(encoding="utf-8").replace("Friday", "Monday"), "utf-8")


def _not_an_export(out: Path) -> None:
    shutil.rmtree(out)
    out.mkdir()


def _other_format(out: Path) -> None:
    data, body = _read(out / "store.md")
    _write(out / "store.md", {**data, "format": "contextfold-markdown/9"}, body)


@pytest.mark.integration
@pytest.mark.parametrize(
    ("spoil", "fragment"),
    [
        (_not_an_export, "not an export"),
        (_break_turn, "turn 8 is missing"),
        (_edit_turn, "content hash"),
        (_other_format, "expected 'contextfold-markdown/1'"),
    ],
    ids=["not-an-export", "missing-turn", "edited-turn", "other-format"],
)
def test_a_refused_markdown_import_leaves_no_store_behind(
    tmp_path: Path, dst_location: str, spoil: Callable[[Path], None], fragment: str
) -> None:
    """An export refused on reading it creates nothing: no SQLite file (nor the folder it
    would go in), no tables in a PostgreSQL database."""
    source = tmp_path / "src.db"
    _filled(source).close()
    out = tmp_path / "export"
    assert invoke("memory", "export", out, "--store", source, "--no-progress").exit_code == 0
    spoil(out)
    postgres = dst_location.startswith("postgresql://")
    target = dst_location if postgres else str(tmp_path / "new" / "other.db")
    result = invoke("memory", "import", out, "--store", target, "--no-progress")
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: ") and fragment in result.stderr.splitlines()[0]
    if postgres:
        assert _pg_tables(dst_location) == []
    else:
        assert not (tmp_path / "new").exists()


@pytest.mark.integration
def test_a_markdown_import_that_fails_part_way_removes_the_store_it_made(tmp_path: Path) -> None:
    """An import that fails while writing removes the SQLite file it made (the sessions it
    loaded with it); a store that was there before is left where it was."""
    source = tmp_path / "src.db"
    _filled(source).close()
    out = tmp_path / "export"
    assert invoke("memory", "export", out, "--store", source, "--no-progress").exit_code == 0
    # Two folders holding one session: each reads well, the second cannot be loaded.
    shutil.copytree(out / "plain", out / "plain-again")
    target = tmp_path / "new" / "other.db"
    result = invoke("memory", "import", out, "--store", target, "--no-progress")
    assert result.exit_code == 2, result.output
    assert "'plain' already exists" in result.stderr.splitlines()[0], result.stderr
    assert not (tmp_path / "new").exists()

    there = tmp_path / "there.db"
    open_memory_store(there, counter=CharCounter()).close()
    result = invoke("memory", "import", out, "--store", there, "--no-progress")
    assert result.exit_code == 2, result.output
    assert there.is_file()


@pytest.mark.integration
def test_a_segment_without_seqs_imports(tmp_path: Path) -> None:
    """A segment whose front-matter lists no source turns (``seqs: []``, which the reader
    takes) is checked by its last turn alone: no TypeError traceback."""
    source = tmp_path / "src.db"
    _filled(source).close()
    out = tmp_path / "export"
    assert invoke("memory", "export", out, "--store", source, "--no-progress").exit_code == 0
    segments = sorted(out.glob("*/segments/*.md"))
    assert segments, "the filled store has a compacted session"
    data, body = _read(segments[0])
    _write(segments[0], {**data, "seqs": []}, body)
    result = invoke("memory", "import", out, "--store", tmp_path / "copy.db", "--no-progress")
    assert result.exit_code == 0, result.output


def test_a_failed_import_leaves_a_link_at_the_store_path_alone(tmp_path: Path) -> None:
    """A dangling symlink at ``--store`` is the user's: an import that fails part-way removes
    only what it made itself, never the link."""
    from contextfold.cli.memory_files import _removed_on_failure

    link = tmp_path / "link.db"
    link.symlink_to(tmp_path / "target" / "real.db")
    with pytest.raises(RuntimeError), _removed_on_failure(str(link)):
        raise RuntimeError("failed part-way")
    assert link.is_symlink()


def _foreign(path: Path) -> None:
    sqlite3.connect(path).execute("create table invoices(id int)").connection.close()


@pytest.mark.integration
@pytest.mark.parametrize(
    ("make", "fragment"),
    [
        (_foreign, "not a contextfold memory store"),
        (lambda p: p.write_bytes(b""), "not a contextfold memory store"),
        (_older_store, "written by an older contextfold"),
    ],
    ids=["foreign-sqlite", "empty-file", "older-store"],
)
def test_markdown_export_only_reads_its_store(
    tmp_path: Path, make: Callable[[Path], object], fragment: str
) -> None:
    """``memory export`` never creates or upgrades the schema of the store it reads: a file
    that is not a memory store of this version is refused and left byte for byte as it was."""
    store = tmp_path / "store.db"
    make(store)
    before = _digest(store)
    out = tmp_path / "export"
    result = invoke("memory", "export", out, "--store", store, "--no-progress")
    assert result.exit_code == 2, result.output
    first = result.stderr.splitlines()[0]
    assert first.startswith("error: ") and f"store {store}" in first and fragment in first
    assert _digest(store) == before
    assert not out.exists()


@pytest.mark.integration
def test_an_older_store_exports_after_the_upgrade_its_error_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The refusal of an older store says how to upgrade it; after that, it exports."""
    store = tmp_path / "old.db"
    _older_store(store)
    out = tmp_path / "export"
    refused = invoke("memory", "export", out, "--store", store, "--no-progress")
    assert refused.exit_code == 2, refused.output
    first = refused.stderr.splitlines()[0]
    command = first[first.index("`") + 1 : first.rindex("`")]
    assert command == f"CONTEXTFOLD_STORE_URL={store} contextfold memory aliases list", first
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CONTEXTFOLD_STORE_URL", str(store))
    assert invoke(*command.split()[2:]).exit_code == 0  # after `contextfold`
    monkeypatch.delenv("CONTEXTFOLD_STORE_URL")
    result = invoke("memory", "export", out, "--store", store, "--no-progress")
    assert result.exit_code == 0, result.output


@pytest.mark.integration
def test_markdown_export_only_reads_a_postgres_store(tmp_path: Path, postgres_url: str) -> None:
    result = invoke("memory", "export", tmp_path / "out", "--store", postgres_url)
    assert result.exit_code == 2, result.output
    assert "not a contextfold memory store" in result.stderr.splitlines()[0]
    assert _pg_tables(postgres_url) == []


def test_a_postgres_store_in_its_own_schema_is_found_by_the_read_only_check(
    tmp_path: Path, postgres_url: str
) -> None:
    """The store URL's own ``options`` (a ``search_path``) are kept by the read-only check,
    which adds its own beside them: the store in that schema is found."""
    import psycopg

    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA mine")
    sep = "&" if "?" in postgres_url else "?"
    url = f"{postgres_url}{sep}options=-csearch_path%3Dmine"
    open_memory_store(url, counter=CharCounter()).close()  # the store's tables, in "mine"
    assert _pg_tables(postgres_url) == []  # (none in public)
    result = invoke("memory", "export", tmp_path / "out", "--store", url)
    assert result.exit_code == 0, result.output


_ids = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=1, max_size=8
)
_tags = st.dictionaries(st.sampled_from(["deploy", "Zürich", "a/b", "..", "数据"]), st.floats(0, 1))
_conversations = st.lists(
    st.tuples(_ids, histories(max_turns=6), _tags, st.booleans()), min_size=1, max_size=3
)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(conversations=_conversations)
def test_markdown_round_trip_property(
    tmp_path_factory: pytest.TempPathFactory,
    conversations: list[tuple[str, list[Message], dict[str, float], bool]],
) -> None:
    """Any conversation (tool calls, unicode, odd whitespace and session ids, tags that are
    not file names) exported to markdown and imported into a fresh store is the same."""
    folder = tmp_path_factory.mktemp("md")
    src = MemoryStore(counter=CharCounter())
    for number, (sid, messages, tags, partial) in enumerate(conversations):
        if sid in src.sessions():
            continue
        src.create_session(sid, {"n": number, "name": sid}, principal=sid[:2])
        if messages:
            flags = [partial and i == len(messages) - 1 for i in range(len(messages))]
            src.append_turns(sid, messages, partial=flags)
            src.set_tags_many(sid, {1: (tags, sorted(tags)[:1])})
            src.paging.upsert_tag_summary(sid, next(iter(tags), "t"), f"about {sid}\n", 1)
            src.compact(sid, [NewSegment(first_seq=1, last_seq=1, summary=sid, full_text="")], 2)
    export_markdown(src, folder)
    dst = MemoryStore(counter=CharCounter())
    import_markdown(dst, folder)
    assert dst.sessions() == src.sessions()
    for sid in src.sessions():
        assert_same(src.transfer.dump_session(sid), dst.transfer.dump_session(sid), vectors=False)
    src.close()
    dst.close()


_values = st.recursive(
    st.one_of(st.text(), st.integers(), st.floats(allow_nan=False), st.booleans(), st.none()),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)


@settings(max_examples=200, deadline=None)
@given(data=st.dictionaries(st.text(max_size=5), _values, max_size=4), body=st.text())
def test_front_matter_keeps_any_text(
    tmp_path_factory: pytest.TempPathFactory, data: dict[str, object], body: str
) -> None:
    """Front-matter and body read back exactly: line breaks YAML would fold (NEL, U+2028,
    CR), trailing spaces, control characters, keys that look like numbers or booleans."""
    path = tmp_path_factory.mktemp("fm") / "x.md"
    _write(path, data, body)
    assert _read(path) == (data, body)


def test_markdown_files_are_text_with_front_matter(src: MemoryStore, tmp_path: Path) -> None:
    export_markdown(src, tmp_path / "out")
    for path in (tmp_path / "out").rglob("*.md"):
        text = path.read_text(encoding="utf-8")
        assert text.startswith("---\n") and text.endswith("\n"), path
    digest = hashlib.sha256((tmp_path / "out" / "main" / "turns" / "000006.md").read_bytes())
    export_markdown(src, tmp_path / "out", overwrite=True)
    again = hashlib.sha256((tmp_path / "out" / "main" / "turns" / "000006.md").read_bytes())
    assert digest.hexdigest() == again.hexdigest()  # the same store, the same bytes (git)
