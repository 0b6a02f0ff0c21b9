"""The conversation-memory store: schema, append-only turns, FTS sync, atomic compaction."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import textwrap
from datetime import UTC, datetime
from pathlib import Path

import pytest

from contextfold.errors import ConfigError
from contextfold.items import Message, TextBlock, ToolResultBlock, ToolUseBlock
from contextfold.store.sqlite import connect
from contextfold.store.sqlite.memory import MIGRATIONS, MemoryStore, NewSegment
from contextfold.tokens import CharCounter, TiktokenCounter

TOPICS = [
    "We should deploy the billing service to Kubernetes on Friday.",
    "The database migration for invoices needs a rollback plan.",
    "Kubernetes pods keep restarting; check the billing service memory limit.",
    "Lunch options near the office include ramen and tacos.",
    "Invoices are generated nightly by the billing cron job.",
    "Remember to rotate the API keys before the Kubernetes upgrade.",
]


def _messages(texts: list[str]) -> list[Message]:
    roles = ("user", "assistant")
    return [Message(role=roles[i % 2], content=t) for i, t in enumerate(texts)]


def _store(path: str | Path = ":memory:") -> MemoryStore:
    return MemoryStore(path, counter=CharCounter())


def _filled(path: str | Path = ":memory:", session: str = "s1") -> MemoryStore:
    store = _store(path)
    store.create_session(session, {"user": "ada"})
    store.append_turns(session, _messages(TOPICS))
    return store


def _tool_exchange() -> list[Message]:
    return [
        Message(role="user", content="What's the weather in Paris?"),
        Message(
            role="assistant",
            content=(
                TextBlock(text="Let me check."),
                ToolUseBlock(id="call_1", name="get_weather", input={"city": "Paris", "n": [1, 2]}),
            ),
        ),
        Message(
            role="tool",
            content=(
                ToolResultBlock(tool_use_id="call_1", name="get_weather", content='{"c": 18}'),
            ),
        ),
        Message(role="assistant", content="It is 18 °C in Paris.", name="bot"),
    ]


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
            "m006_generations_and_records",
            "m007_response_links",
        ]
    )
    assert MIGRATIONS.apply(store._conn) == []


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


def test_reopening_the_file_keeps_everything(tmp_path: Path) -> None:
    path = tmp_path / "memory.db"
    store = _filled(path)
    store.tag_turn("s1", 1, "deploy", 0.9)
    store.compact("s1", [NewSegment(first_seq=1, last_seq=2, summary="deploy", full_text="x")], 3)
    store.upsert_tag_summary("s1", "deploy", "Deploy on Friday.", 1)
    store.set_alias("k8s", "kubernetes")
    store.set_working_set("s1", "deploy", "summary", 12)
    store.log_cost("s1", "summary", "gpt-4o-mini", 100, 20, 0.002)
    before = (store.turns("s1"), store.segments("s1"), store.tag_summaries("s1"))
    store.close()
    again = _store(path)
    assert (again.turns("s1"), again.segments("s1"), again.tag_summaries("s1")) == before
    assert again.session("s1").metadata == {"user": "ada"}
    assert again.session("s1").compaction_watermark == 3
    assert again.aliases() == {"k8s": "kubernetes"}
    assert again.working_set("s1")["deploy"].depth == "summary"
    assert again.cost_report("s1").calls == 1


def test_tool_call_messages_round_trip_exactly(tmp_path: Path) -> None:
    store = _store(tmp_path / "m.db")
    store.create_session("s1")
    exchange = _tool_exchange()
    stamps = [datetime(2026, 1, 1, 12, i, tzinfo=UTC) for i in range(4)]
    assert store.append_turns("s1", exchange, timestamps=stamps) == [1, 2, 3, 4]
    store.close()
    turns = _store(tmp_path / "m.db").turns("s1")
    assert [t.message for t in turns] == exchange
    assert [t.created_at for t in turns] == stamps
    assert turns[1].message.tool_use_ids == ("call_1",)
    assert turns[2].message.tool_result_ids == ("call_1",)
    assert len({t.content_hash for t in turns}) == 4 and all(
        len(t.content_hash) == 64 for t in turns
    )


def test_token_counts_come_from_the_counter_once_per_turn() -> None:
    counter = TiktokenCounter("cl100k_base")
    store = MemoryStore(counter=counter)
    store.create_session("s1")
    store.append_turns("s1", _tool_exchange())
    turns = store.turns("s1")
    assert [t.token_count for t in turns] == [counter.count(t.message.text()) for t in turns]
    assert all(t.token_count > 0 for t in turns)


def test_seqs_continue_per_session_and_turns_slice() -> None:
    store = _filled()
    store.create_session("s2")
    assert store.append_turns("s2", _messages(["a b", "c d"])) == [1, 2]
    assert store.append_turns("s1", _messages(["more"])) == [7]
    assert [t.seq for t in store.turns("s1", start=2, end=4)] == [2, 3, 4]
    assert [t.seq for t in store.turns("s1", start=6)] == [6, 7]
    with pytest.raises(ConfigError, match="unknown session"):
        store.append_turns("nope", _messages(["x"]))
    with pytest.raises(ConfigError, match="timestamps"):
        store.append_turns("s1", _messages(["x"]), timestamps=[])


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


def test_delete_session_removes_the_session_and_nothing_else() -> None:
    store = _filled()
    store.create_session("s2")
    store.append_turns("s2", _messages(["kubernetes elsewhere"]))
    store.tag_turn("s1", 1, "deploy")
    store.compact(
        "s1", [NewSegment(first_seq=1, last_seq=3, summary="kubernetes", full_text="")], 4
    )
    store.log_cost("s1", "tagging", "m", 1, 1, 0.5)
    assert store.delete_session("s1") is True
    assert store.sessions() == ["s2"] and store.turns("s1") == [] and store.segments("s1") == []
    assert [t.seq for t, _ in store.search_turns("s2", "kubernetes")] == [1]
    assert store._conn.execute("SELECT COUNT(*) FROM turn_tags").fetchone()[0] == 0
    assert store.cost_report().cost_usd == 0.5  # the cost log outlives its session
    assert store.delete_session("s1") is False
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


def test_inserted_turns_are_searchable_in_bm25_order() -> None:
    store = _filled()
    hits = store.search_turns("s1", "rollback plan for the invoices")
    assert [turn.seq for turn, _ in hits] == [2, 5]  # all three words beat one shared word
    assert hits[0][1] > hits[1][1] > 0
    rare_first = store.search_turns("s1", "kubernetes ramen")
    assert rare_first[0][0].seq == 4  # a rare word outweighs a common one
    assert {turn.seq for turn, _ in rare_first} == {1, 3, 4, 6}
    assert [t.seq for t, _ in store.search_turns("s1", "restart")] == [3]  # porter stemming
    assert len(store.search_turns("s1", "kubernetes billing", limit=2)) == 2
    assert store.search_turns("s1", "the and of") == []  # stop words only
    store.append_turns("s1", _messages(["a brand new ramen place opened"]))
    assert [t.seq for t, _ in store.search_turns("s1", "ramen")] in ([4, 7], [7, 4])


@pytest.mark.parametrize(
    "query",
    [
        '"unbalanced quote',
        "billing-service",
        "bill*",
        "kubernetes AND",
        "NOT OR NEAR(",
        "a'b\"c:d^",
    ],
)
def test_special_characters_in_queries_do_not_raise(query: str) -> None:
    store = _filled()
    store.compact("s1", [NewSegment(first_seq=1, last_seq=2, summary="billing", full_text="")], 3)
    hits = store.search_turns("s1", query)
    assert all(turn.session_id == "s1" for turn, _ in hits)
    store.search_segments("s1", query)


def test_search_segments_ranks_summaries() -> None:
    store = _filled()
    segments = [
        NewSegment(first_seq=1, last_seq=2, summary="Deploy billing to Kubernetes.", full_text=""),
        NewSegment(first_seq=3, last_seq=4, summary="Lunch: ramen or tacos.", full_text=""),
    ]
    ids = store.compact("s1", segments, 5)
    hits = store.search_segments("s1", "kubernetes deployment")
    assert [seg.id for seg, _ in hits] == [ids[0]]
    assert hits[0][0].seqs == (1, 2) and hits[0][0].summary_tokens == CharCounter().count(
        segments[0].summary
    )
    assert store.search_segments("other", "kubernetes") == []


_CHILD = """
import sys, time
from contextfold.store.sqlite.memory import MemoryStore, NewSegment
from contextfold.tokens import CharCounter

def hook():
    print("READY", flush=True)
    time.sleep(60)

store = MemoryStore(sys.argv[1], counter=CharCounter())
segment = NewSegment(first_seq=1, last_seq=4, summary="billing and kubernetes", full_text="...")
store.compact("s1", [segment], 5, _before_commit=hook)
print("COMMITTED", flush=True)
"""


def test_compaction_killed_mid_transaction_leaves_the_old_state(tmp_path: Path) -> None:
    path = tmp_path / "memory.db"
    store = _filled(path)
    before = store.turns("s1")
    store.close()
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(_CHILD), str(path)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    with child.stdout:
        ready = child.stdout.readline().strip()  # segments inserted, watermark not moved
        child.send_signal(signal.SIGKILL)
        assert child.wait(timeout=30) == -signal.SIGKILL
    assert ready == "READY"
    after = _store(path)
    assert after.turns("s1") == before
    assert after.segments("s1") == [] and after.session("s1").compaction_watermark == 0
    assert after.search_segments("s1", "kubernetes") == []
    after.compact("s1", [NewSegment(first_seq=1, last_seq=4, summary="s", full_text="")], 5)
    assert after.session("s1").compaction_watermark == 5


def test_an_exception_inside_compaction_rolls_everything_back() -> None:
    store = _filled()

    def boom() -> None:
        raise RuntimeError("summarizer crashed")

    segment = NewSegment(first_seq=1, last_seq=2, summary="deploy", full_text="")
    with pytest.raises(RuntimeError, match="summarizer crashed"):
        store.compact("s1", [segment], 3, _before_commit=boom)
    assert store.segments("s1") == [] and store.session("s1").compaction_watermark == 0
    assert store._conn.execute("SELECT COUNT(*) FROM segment_turns").fetchone()[0] == 0
    assert store.search_segments("s1", "deploy") == []
    assert len(store.turns("s1")) == len(TOPICS)


def test_compaction_moves_the_watermark_with_its_segments() -> None:
    store = _filled()
    first = NewSegment(first_seq=1, last_seq=3, summary="a", full_text="t", tags=("deploy",))
    [segment_id] = store.compact("s1", [first], 4)
    assert store.session("s1").compaction_watermark == 4
    [stored] = store.segments("s1")
    assert (stored.id, stored.seqs, stored.tags) == (segment_id, (1, 2, 3), ("deploy",))
    store.compact("s1", [NewSegment(first_seq=4, last_seq=6, summary="b", full_text="")], 7)
    assert [s.first_seq for s in store.segments("s1")] == [1, 4]
    assert len(store.turns("s1")) == len(TOPICS)  # raw turns are never removed


@pytest.mark.parametrize(
    ("segments", "watermark", "message"),
    [
        ([], 8, "beyond the last turn"),
        ([], 2, "only moves forward"),
        ([NewSegment(first_seq=2, last_seq=5, summary="", full_text="")], 5, "not within"),
        ([NewSegment(first_seq=3, last_seq=4, summary="", full_text="")], 6, "not within"),
    ],
)
def test_compaction_refuses_an_invalid_watermark_or_segment(
    segments: list[NewSegment], watermark: int, message: str
) -> None:
    store = _filled()
    store.compact("s1", [NewSegment(first_seq=1, last_seq=3, summary="", full_text="")], 4)
    with pytest.raises(ConfigError, match=message):
        store.compact("s1", segments, watermark)
    assert len(store.segments("s1")) == 1 and store.session("s1").compaction_watermark == 4


def test_tag_summary_becomes_stale_when_its_tag_gets_a_newer_turn() -> None:
    store = _filled()
    for seq in (1, 3):
        store.tag_turn("s1", seq, "kubernetes")
    store.upsert_tag_summary("s1", "kubernetes", "Deploy Friday; pods restart.", 3)
    assert store.tag_summaries("s1")["kubernetes"].stale is False
    store.tag_turn("s1", 4, "lunch")  # another tag's turn does not matter
    assert store.tag_summaries("s1")["kubernetes"].stale is False
    store.tag_turn("s1", 5, "kubernetes")
    assert store.tag_summaries("s1")["kubernetes"].stale is True
    store.upsert_tag_summary("s1", "kubernetes", "Updated.", 5, tokens=3)
    summary = store.tag_summaries("s1")["kubernetes"]
    assert (summary.stale, summary.tokens, summary.summary) == (False, 3, "Updated.")


def test_turn_tags_are_set_replaced_and_read_back() -> None:
    store = _filled()
    store.tag_turn("s1", 2, "database", 0.5)
    store.tag_turn("s1", 2, "database", 0.8)
    store.tag_turn("s1", 2, "invoices")
    assert store.turns("s1", 2, 2)[0].tags == {"database": 0.8, "invoices": 1.0}
    store.set_turn_tags("s1", 2, {"migration": 0.7})
    assert store.turns("s1", 2, 2)[0].tags == {"migration": 0.7}
    assert store.tag_counts("s1") == {"migration": 1}
    with pytest.raises(ConfigError, match="no turn 99"):
        store.tag_turn("s1", 99, "ghost")


def test_working_set_aliases_and_costs() -> None:
    store = _filled()
    store.set_working_set("s1", "billing", "full", 300, last_used=datetime(2026, 1, 2, tzinfo=UTC))
    store.set_working_set("s1", "lunch", "summary", 20, last_used=datetime(2026, 1, 1, tzinfo=UTC))
    assert list(store.working_set("s1")) == ["lunch", "billing"]  # least recently used first
    with pytest.raises(ConfigError, match="depth"):
        store.set_working_set("s1", "x", "huge", 1)  # type: ignore[arg-type]
    store.set_alias("k8s", "kubernetes")
    store.set_alias("k8s", "kube")
    assert store.aliases() == {"k8s": "kube"}
    store.log_cost("s1", "summary", "m", 100, 10, 0.25)
    store.log_cost("s1", "tagging", "m", 50, 5, 0.5)
    store.log_cost(None, "tagging", "m", 1, 1, 1.0)
    report = store.cost_report("s1")
    assert (report.calls, report.prompt_tokens, report.completion_tokens) == (2, 150, 15)
    assert report.by_kind == {"summary": 0.25, "tagging": 0.5}
    assert store.cost_report().cost_usd == pytest.approx(1.75)


def test_question_words_do_not_match_turns_that_only_share_grammar() -> None:
    store = MemoryStore(counter=CharCounter())
    sid = store.create_session()
    store.append_turns(
        sid,
        [
            Message(role="user", content="What did you do about it? How would we know?"),
            Message(role="user", content="The kiln firing reached 1200 degrees."),
        ],
    )
    hits = store.search_turn_seqs(sid, "What did we do about the kiln?")
    assert [seq for seq, _ in hits] == [2]
    # A question made only of such words still searches with them.
    assert [seq for seq, _ in store.search_turn_seqs(sid, "what did we do")] == [1]


def test_search_stays_in_its_session_and_an_m003_file_is_reindexed(tmp_path: Path) -> None:
    conn = connect(tmp_path / "m003.db")
    MIGRATIONS.apply(conn, upto="m003_related_tags_and_vectors")
    conn.close()
    store = _store(tmp_path / "m003.db")  # upgrades to the session-scoped index
    sessions = ("conv-1", "conv-10", "a-b", "---")
    for n, sid in enumerate(sessions):
        store.create_session(sid)
        store.append_turns(sid, [Message(role="user", content=f"kiln firing number {n}")])
    for n, sid in enumerate(sessions):
        assert len(store.search_turn_seqs(sid, "kiln")) == 1
        ((turn, _),) = store.search_turns(sid, "kiln")
        assert turn.session_id == sid and turn.message.text().endswith(str(n))
    # Session words are not content: "conv" matches no turn text.
    assert store.search_turn_seqs("conv-1", "conv") == []
    store.compact("a-b", [NewSegment(first_seq=1, last_seq=1, summary="kiln", full_text="")], 2)
    assert [seg.session_id for seg, _ in store.search_segments("a-b", "kiln")] == ["a-b"]
    assert store.search_segments("conv-1", "kiln") == []


def test_tag_overlap_scores_sum_each_match_at_its_tag_or_related_weight() -> None:
    store = _filled()
    store.set_tags_many(
        "s1",
        {
            1: ({"billing": 1.0, "invoices": 0.9}, ["payments"]),
            2: ({"payments": 1.0}, []),
            3: ({"deploy": 1.0}, ["billing"]),
        },
    )
    store.create_session("other")
    store.append_turns("other", _messages(TOPICS))
    store.set_tags_many("other", {1: ({"billing": 1.0}, [])})
    weights = {"billing": (2.0, 0.5), "payments": (1.5, 0.25), "invoices": (1.0, 0.1)}
    assert store.tag_overlap_scores("s1", weights) == pytest.approx(
        {1: 2.0 + 1.0 + 0.25, 2: 1.5, 3: 0.5}  # turn 1: billing, invoices, related payments
    )
    many = {f"t{i}": (1.0, 0.5) for i in range(700)} | weights  # spans several SQL chunks
    assert store.tag_overlap_scores("s1", many) == pytest.approx({1: 3.25, 2: 1.5, 3: 0.5})
    assert store.tag_overlap_scores("s1", {}) == {}
