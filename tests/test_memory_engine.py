"""MemoryEngine end to end: storing, tagging, compaction, recall, paging, tools, history."""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contextfold import ContextPipeline
from contextfold.errors import ConfigError
from contextfold.items import Message, ToolResultBlock, ToolUseBlock
from contextfold.memory.config import MemoryConfig
from contextfold.memory.engine import MemoryEngine
from contextfold.memory.summarize import ExtractiveSummarizer
from contextfold.store.sqlite.memory import MemoryStore
from contextfold.testing import HashEmbedder
from contextfold.tokens import TiktokenCounter

COUNTER = TiktokenCounter("cl100k_base")

TOPICS = {
    "legal": "The Henninger filing deadline is March {n}; the court clerk wants motion copy {n}.",
    "fitness": "My deadlift plan for week {n}: five sets at {n}0 kilograms, then rowing.",
    "garden": "Planted {n} tomato seedlings and basil along the greenhouse wall today.",
}


def conversation(rounds: int) -> list[dict[str, str]]:
    messages = []
    for n in range(1, rounds + 1):
        for topic, text in TOPICS.items():
            messages.append({"role": "user", "content": text.format(n=n)})
            messages.append({"role": "assistant", "content": f"Noted about {topic}, item {n}."})
    return messages


def engine(window: int = 100_000, **overrides: object) -> MemoryEngine:
    cfg = MemoryConfig.model_validate({"context_window": window, **overrides})
    return MemoryEngine(cfg, store=MemoryStore(counter=COUNTER), embedder=None, counter=COUNTER)


def test_only_new_turns_are_stored_and_system_messages_are_not_turns() -> None:
    eng = engine()
    history = [{"role": "system", "content": "Be brief."}, *conversation(1)]
    eng.on_turn_complete(history)
    eng.on_turn_complete([*history, {"role": "user", "content": "And the greenhouse roof?"}])
    texts = [t.message.text() for t in eng.store.turns("default")]
    assert len(texts) == 7
    assert texts[-1] == "And the greenhouse roof?"
    assert "Be brief." not in texts


def test_a_history_longer_than_a_write_chunk_is_stored_whole_and_derived() -> None:
    """Its first turns are committed a chunk per transaction, the last chunk with the start
    of the derive: every turn stored once, in order, tagged, and no job left behind."""
    eng = engine()
    history = conversation(50)  # 300 messages: more than one WRITE_CHUNK
    times = [datetime(2026, 1, 1, tzinfo=UTC) + timedelta(minutes=i) for i in range(300)]
    eng.on_turn_complete(history, timestamps=times)
    turns = eng.store.turns("default")
    assert [t.message.text() for t in turns] == [m["content"] for m in history]
    assert [t.created_at for t in turns] == times
    assert eng.store.session("default").derived_seq == 300 and eng.store.jobs.pending_jobs() == 0
    assert all(t.tags for t in turns if t.message.role == "user")


def test_tags_emerge_without_a_vocabulary() -> None:
    eng = engine()
    eng.on_turn_complete(conversation(2))
    vocab = eng.vocabulary()
    assert any("henninger" in tag for tag in vocab)
    assert any("deadlift" in tag for tag in vocab)


def test_compaction_fires_at_the_soft_threshold_and_keeps_recent_turns() -> None:
    eng = engine(window=600)
    report = None
    for message in conversation(6):
        report = eng.on_turn_complete([message]) or report
    assert report is not None and report.segments_compacted > 0
    assert report.tokens_freed > 0
    session = eng.store.session("default")
    assert eng.store.last_seq("default") - session.compaction_watermark + 1 >= 6
    assert len(eng.store.turns("default")) == 36  # raw turns are never removed


def test_a_segment_keeps_every_tag_of_its_turns() -> None:
    eng = engine(window=600)
    eng.on_turn_complete(conversation(6))
    eng.compact()
    turns = {t.seq: t for t in eng.store.turns("default")}
    segments = eng.store.segments("default")
    assert segments
    for seg in segments:
        source_tags = {tag for seq in seg.seqs for tag in turns[seq].tags}
        assert source_tags <= set(seg.tags)


def test_one_tag_summary_per_tag_of_the_compacted_segments() -> None:
    eng = engine(window=600)
    eng.on_turn_complete(conversation(6))
    eng.compact()
    summaries = eng.store.paging.tag_summaries("default")
    segment_tags = {t for s in eng.store.segments("default") for t in s.tags}
    assert set(summaries) == segment_tags
    assert all(s.summary for s in summaries.values())


def test_an_early_detail_is_recalled_verbatim_after_compaction() -> None:
    eng = engine(window=600)
    eng.on_turn_complete(conversation(6))
    eng.compact()
    assembled = eng.on_message_inbound("When is the Henninger filing deadline for motion copy 1?")
    assert TOPICS["legal"].format(n=1) in assembled.prepend_text
    assert assembled.budget.used <= 2048
    assert not assembled.broad and not assembled.temporal


def test_broad_question_loads_tag_summaries_and_temporal_loads_segments_earliest_first() -> None:
    eng = engine(window=600)
    eng.on_turn_complete(conversation(6))
    eng.compact()
    broad = eng.on_message_inbound("Can you summarize everything we discussed?")
    assert broad.broad
    assert any(i.metadata["kind"] == "tag_summary" for i in broad.items)
    temporal = eng.on_message_inbound("What did we talk about at the very beginning?")
    assert temporal.temporal
    firsts = [i.metadata["first_seq"] for i in temporal.items if i.metadata["kind"] == "segment"]
    assert firsts and firsts == sorted(firsts) and firsts[0] == 1


@settings(max_examples=30, deadline=None)
@given(budget=st.integers(min_value=64, max_value=1500))
def test_the_memory_block_never_exceeds_its_budget(budget: int) -> None:
    eng = _COMPACTED
    for question in ("Henninger motion deadline?", "summarize everything", "early on?"):
        assembled = eng.on_message_inbound(question, budget=budget)
        assert COUNTER.count(assembled.prepend_text) <= budget
        assert assembled.budget.used == COUNTER.count(assembled.prepend_text)


_COMPACTED = engine(window=600)
_COMPACTED.on_turn_complete(conversation(6))
_COMPACTED.compact()


def test_context_hint_lists_stored_topics_and_stays_identical_between_compactions() -> None:
    eng = engine(window=600)
    eng.on_turn_complete(conversation(6))
    eng.compact()
    first = eng.on_message_inbound("deadlift plan?").prepend_text
    eng.on_turn_complete([{"role": "user", "content": "Another basil question."}])
    second = eng.on_message_inbound("tomato seedlings?").prepend_text
    hint = first.split("</context-topics>")[0]
    assert hint.startswith("<context-topics>")
    assert second.startswith(hint)  # cache-stable prefix


def test_find_quote_returns_excerpts_with_tags() -> None:
    eng = engine(window=600)
    eng.on_turn_complete(conversation(6))
    eng.compact()
    quotes = eng.find_quote("greenhouse seedlings")
    assert quotes and "greenhouse" in quotes[0].excerpt
    assert quotes[0].tags
    assert quotes[0].compacted


def test_expand_evicts_least_recently_used_topics_to_fit_the_budget() -> None:
    eng = engine(window=600, paging={"budget": 120})
    eng.on_turn_complete(conversation(6))
    eng.compact()
    tags = [t for t in eng.status().tags if eng.pager.topic_tokens("default", t, "full") > 40]
    first, second = tags[0], tags[1]
    eng.expand_topic(first, "full")
    result = eng.expand_topic(second, "full")
    assert result.total_tokens <= 120 or result.depth != "full"
    ws = eng.store.paging.working_set("default")
    assert ws[first].depth != "full"  # the older topic was collapsed
    assert any(c.reason.startswith("evicted") for c in result.changes)


def test_tools_mode_keeps_automatic_paging_as_the_fallback() -> None:
    eng = engine(window=600, paging={"budget": 400, "mode": "tools"})
    eng.on_turn_complete(conversation(6))
    eng.compact()
    tags = [t for t in eng.status().tags if eng.pager.topic_tokens("default", t, "summary") > 0]
    first, second = tags[0], tags[1]
    eng.expand_topic(first, "summary")
    eng.expand_topic(second, "summary")
    assert list(eng.store.paging.working_set("default"))[-2:] == [first, second]
    # A message about the first topic keeps it warm, though the model called no tool: the
    # second is now the one an expansion past the budget collapses first.
    eng.on_message_inbound(f"What about the {first.replace('-', ' ')}?")
    assert list(eng.store.paging.working_set("default"))[-2:] == [second, first]


def test_collapse_cannot_go_deeper_and_unknown_topics_are_errors() -> None:
    eng = engine(window=600)
    eng.on_turn_complete(conversation(6))
    eng.compact()
    tag = next(iter(eng.store.paging.tag_summaries("default")))
    eng.expand_topic(tag, "segments")
    assert eng.collapse_topic(tag, "summary").depth == "summary"
    with pytest.raises(ConfigError, match="shallower"):
        eng.collapse_topic(tag, "full")
    with pytest.raises(ConfigError, match="no stored topic"):
        eng.expand_topic("no-such-topic")


def test_collapsing_an_unknown_topic_is_an_error_and_writes_nothing() -> None:
    eng = engine(window=600)
    with pytest.raises(ConfigError, match=r"no stored topic 'kitchn'; stored topics: none yet"):
        eng.collapse_topic("kitchn", "none")
    eng.on_turn_complete(conversation(6))
    eng.compact()
    for depth in ("summary", "none"):
        with pytest.raises(ConfigError, match="no stored topic 'kitchn'; stored topics: "):
            eng.collapse_topic("kitchn", depth)  # type: ignore[arg-type]
    assert "kitchn" not in eng.store.paging.working_set("default")


def test_a_loaded_topic_no_longer_stored_can_still_be_collapsed() -> None:
    """A working-set entry whose segments are gone (here written directly, as a store holding
    a topic under a name no stored segment carries any more) still costs budget: collapsing
    it must work, and frees that budget."""
    eng = engine(window=600)
    eng.on_turn_complete(conversation(6))
    eng.compact()
    eng.store.paging.set_working_set("default", "gone-topic", "full", 300)
    with pytest.raises(ConfigError, match="no stored topic 'gone-topic'"):
        eng.expand_topic("gone-topic")  # nothing to load
    result = eng.collapse_topic("gone-topic", "summary")
    assert (result.depth, result.tokens) == ("summary", 0)
    assert eng.collapse_topic("gone-topic", "none").depth == "none"
    with pytest.raises(ConfigError, match="no stored topic 'gone-topic'"):
        eng.collapse_topic("gone-topic", "none")  # unloaded now: unknown like any other


def test_tool_calls_run_and_bad_calls_return_errors_for_the_model() -> None:
    eng = engine(window=600)
    eng.on_turn_complete(conversation(6))
    eng.compact()
    found = json.loads(eng.handle_tool_call("find_quote", {"query": "deadlift"}))
    assert found and "deadlift" in found[0]["excerpt"].lower()
    assert "error" in json.loads(eng.handle_tool_call("expand_topic", {}))
    assert "error" in json.loads(eng.handle_tool_call("rm_rf", {}))
    names = [t["name"] for t in eng.tool_definitions("anthropic")]
    assert names == ["expand_topic", "collapse_topic", "find_quote"]


def test_live_history_turns_are_not_recalled_and_compacted_ones_are_filtered() -> None:
    eng = engine(window=600)
    history = conversation(6)
    eng.on_turn_complete(history)
    eng.compact()
    assembled = eng.on_message_inbound("tomato seedlings?", history)
    assert assembled.history is not None
    reasons = {r.reason for r in assembled.history.removed}
    assert reasons == {"compacted"}
    kept = [m.text() for m in assembled.history.messages]
    assert kept[-1] == history[-1]["content"]
    assert not any(text in assembled.prepend_text for text in kept)


def test_tool_chains_are_stored_and_never_split_by_compaction() -> None:
    eng = engine(window=600, compaction={"protected_recent_turns": 2})
    call = Message(
        role="assistant", content=(ToolUseBlock(id="c1", name="weather", input={"q": "Oslo"}),)
    )
    result = Message(role="tool", content=(ToolResultBlock(tool_use_id="c1", content="rain"),))
    messages = [*conversation(3), call, result, {"role": "assistant", "content": "It rains."}]
    eng.on_turn_complete(messages)
    eng.compact()
    assert eng.store.session("default").compaction_watermark == 19  # stops before the call
    for seg in eng.store.segments("default"):
        stored = eng.store.turns("default", seg.first_seq, seg.last_seq)
        calls = {i for t in stored for i in t.message.tool_use_ids}
        results = {i for t in stored for i in t.message.tool_result_ids}
        assert calls == results


def test_pipeline_packs_memory_items() -> None:
    eng = engine()
    eng.on_turn_complete(conversation(2))
    result = ContextPipeline(max_tokens=2000).with_memory(eng).build("Henninger filing deadline?")
    assert "Henninger filing deadline is March 1" in result.text


def test_sessions_are_separate() -> None:
    eng = engine()
    eng.on_turn_complete(conversation(1), session_id="a")
    eng.on_turn_complete([{"role": "user", "content": "Zebra stripes"}], session_id="b")
    assert "Henninger" not in eng.on_message_inbound("Henninger?", session_id="b").prepend_text
    assert eng.status(session_id="a").turns == 6 and eng.status(session_id="b").turns == 1


def test_dense_signal_ranks_turns_when_an_embedder_is_given() -> None:
    cfg = MemoryConfig.model_validate({})
    eng = MemoryEngine(
        cfg, store=MemoryStore(counter=COUNTER), embedder=HashEmbedder(), counter=COUNTER
    )
    eng.on_turn_complete(conversation(2))
    assembled = eng.on_message_inbound("greenhouse basil")
    assert any("dense" in r.ranks for r in assembled.recalled)


def test_engine_from_config_file_and_bad_messages(tmp_path: Path) -> None:
    path = tmp_path / "contextfold.yaml"
    path.write_text(f"storage_path: {tmp_path / 'm.db'}\nrecall:\n  embedder: none\n")
    eng = MemoryEngine(config_path=path)
    eng.on_turn_complete(conversation(1))
    eng.close()
    again = MemoryEngine(config_path=path)
    assert again.status().turns == 6  # persisted
    with pytest.raises(ConfigError, match="not a chat message"):
        again.on_turn_complete([{"role": "wizard", "content": "hi"}])


def test_compacted_turns_dropped_from_the_history_stay_recallable() -> None:
    eng = engine(window=600)
    history = conversation(6)
    eng.on_turn_complete(history)
    eng.compact()
    assembled = eng.on_message_inbound("Henninger filing deadline March 1?", history)
    assert assembled.history is not None
    kept = {m.text() for m in assembled.history.messages}
    early = TOPICS["legal"].format(n=1)
    assert early not in kept  # compacted: the filter dropped it from the history …
    assert early in assembled.prepend_text  # … so memory must still bring it back


def test_a_resent_history_is_stored_once_and_new_only_stores_a_repeat() -> None:
    eng = engine()
    exchange = [{"role": "user", "content": "ok"}, {"role": "assistant", "content": "sure"}]
    eng.on_turn_complete(exchange)
    eng.on_turn_complete(exchange)  # the same messages again: a resend
    assert eng.status().turns == 2
    eng.on_turn_complete(exchange, new_only=True)  # the user really said it twice
    assert [t.message.text() for t in eng.store.turns("default")] == ["ok", "sure"] * 2


def test_only_new_turns_that_end_like_the_stored_tail_are_all_stored() -> None:
    """Given only the new turns, one that says what the last stored turn said (an assistant
    answering "OK" again) is no sign of a resend: the turns before it were dropped (found by
    a reviewer through MCP's compact_context and `memory compact`)."""
    eng = engine()
    said = ["the vault code is 5521", "the door code is 1234", "the gate code is 9"]
    for text in said[:2]:
        eng.on_turn_complete(
            [{"role": "user", "content": text}, {"role": "assistant", "content": "OK"}]
        )
    eng.on_turn_complete(
        [
            {"role": "user", "content": said[2]},
            {"role": "assistant", "content": "OK"},
            {"role": "user", "content": "and the shed?"},
            {"role": "assistant", "content": "OK"},
        ]
    )
    texts = [t.message.text() for t in eng.store.turns("default")]
    assert texts == [said[0], "OK", said[1], "OK", said[2], "OK", "and the shed?", "OK"]
    # a history trimmed at the front still continues where it overlaps the stored tail
    eng.on_turn_complete(
        [{"role": "assistant", "content": "OK"}, {"role": "user", "content": "one more"}]
    )
    assert eng.status().turns == 9
    # and a whole history resent stores only what is new
    roles = ["user", "assistant"] * 4 + ["user"]
    history = [
        {"role": role, "content": t} for role, t in zip(roles, [*texts, "one more"], strict=True)
    ]
    eng.on_turn_complete([*history, {"role": "user", "content": "last"}])
    assert [t.message.text() for t in eng.store.turns("default")][-3:] == ["OK", "one more", "last"]


@pytest.mark.parametrize("bad", ["", "  ", 7])
def test_an_empty_session_id_is_an_error_not_the_default_session(bad: object) -> None:
    eng = engine()
    message = [{"role": "user", "content": "my locker code is 4411"}]
    with pytest.raises(ConfigError, match="session_id must be a non-empty string"):
        eng.on_turn_complete(message, session_id=bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="session_id must be a non-empty string"):
        eng.on_message_inbound("locker code?", session_id=bad)  # type: ignore[arg-type]
    assert eng.store.sessions() == [] or eng.status().turns == 0


def test_score_and_rrf_fusion_both_rank_the_matching_turn_first() -> None:
    for fusion in ("score", "rrf"):
        eng = engine(recall={"fusion": fusion, "embedder": "none"})
        eng.on_turn_complete(conversation(3))
        top = eng.on_message_inbound("seedlings in the greenhouse").recalled[0]
        assert "greenhouse" in eng.store.turn_rows("default", [top.seq])[top.seq].text
    with pytest.raises(ValueError, match="fusion"):
        engine(recall={"fusion": "max"})


def test_length_prior_prefers_the_turn_that_says_more() -> None:
    def top_text(prior: float) -> str:
        eng = engine(recall={"length_prior": prior, "neighbor_weight": 0, "tag_weight": 0})
        filler = " ".join(["the studio schedule moved again"] * 12)
        eng.on_turn_complete(
            [
                {"role": "user", "content": "Kiln!"},
                {"role": "user", "content": "The kiln reached 1200 degrees before the glaze set."},
                {"role": "user", "content": f"{filler} and the kiln too"},
            ],
            new_only=True,
        )
        top = eng.on_message_inbound("kiln").recalled[0].seq
        return eng.store.turn_rows("default", [top])[top].text

    assert top_text(0.0) == "Kiln!"  # BM25 alone favours the short turn
    assert top_text(1.0).startswith("The kiln reached")


@pytest.mark.parametrize("budget", [300, 1000, 8000])
def test_the_hint_takes_a_bounded_share_of_the_budget(budget: int) -> None:
    eng = engine(window=600)
    eng.on_turn_complete(conversation(12))
    eng.compact()
    assembled = eng.on_message_inbound("deadlift plan?", budget=budget)
    limit = min(200, int(budget * 0.05))
    assert assembled.budget.hint <= limit
    assert assembled.budget.hint > 0 or limit < 40


def test_close_closes_the_llm_client_it_built_but_not_one_passed_in(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CF_TEST_KEY", "k")
    llm = {"provider": "openai", "model": "m", "base_url": "http://127.0.0.1:9/v1"}
    cfg = MemoryConfig.model_validate({"llm": {**llm, "api_key_env": "CF_TEST_KEY"}})
    built = MemoryEngine(cfg, store=MemoryStore(counter=COUNTER), embedder=None)
    closed: list[bool] = []
    monkeypatch.setattr(built.llm_client, "close", lambda: closed.append(True))
    built.close()
    assert closed == [True] and built.llm_client is None

    class Client:
        closed = False

        def close(self) -> None:
            self.closed = True

    mine = Client()
    MemoryEngine(cfg, store=MemoryStore(counter=COUNTER), embedder=None, llm_client=mine).close()
    assert not mine.closed


class SpySummarizer(ExtractiveSummarizer):
    """The default summarizer, recording each call's input texts."""

    def __init__(self) -> None:
        super().__init__(COUNTER)
        self.calls: list[tuple[tuple[str, ...], list[str]]] = []

    def summarize(self, texts, *, max_tokens, tags=(), instructions=None):  # type: ignore[no-untyped-def]
        self.calls.append((tuple(tags), list(texts)))
        return super().summarize(texts, max_tokens=max_tokens, tags=tags)


def test_tag_summaries_roll_forward_and_keep_each_lines_speaker() -> None:
    spy = SpySummarizer()
    cfg = MemoryConfig.model_validate(
        {"context_window": 100_000, "compaction": {"tag_summary_tokens": 60}}
    )
    eng = MemoryEngine(cfg, store=MemoryStore(counter=COUNTER), embedder=None, summarizer=spy)
    speakers = ["Ann", "Bob"]
    rounds = [
        [
            {
                "role": "user",
                "content": f"{speakers[n % 2]}: Kiln firing {n} on {n} March 2024 "
                f"reached {n}00 degrees for Priya's glaze batch {n}.",
            }
            for n in range(start, start + 12)
        ]
        for start in (1, 13)
    ]
    eng.on_turn_complete(rounds[0])
    eng.compact()
    first = eng.store.paging.tag_summaries("default")
    eng.on_turn_complete(rounds[1])
    spy.calls.clear()
    eng.compact()
    kiln = next(tag for tag in first if "kiln" in tag)
    (inputs,) = [texts for tags, texts in spy.calls if tags == (kiln,)]
    old_lines = first[kiln].summary.splitlines()
    assert inputs[: len(old_lines)] == old_lines  # the previous summary, then only new segments
    done = first[kiln].source_watermark
    new_segments = [s for s in eng.store.segments("default") if s.last_seq > done]
    assert new_segments and all(s.first_seq > done for s in new_segments)
    assert inputs[len(old_lines) :] == [
        line for s in new_segments for line in s.summary.splitlines() if line.strip()
    ]
    for summary in eng.store.paging.tag_summaries("default").values():
        for line in summary.summary.splitlines():
            assert not re.match(r"^\w+: \w+: ", line), line  # never "Ann: Bob: …"


def test_a_failed_tag_write_keeps_the_raw_turns_and_a_retry_tags_them_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    eng = engine()
    history = conversation(1)
    real = eng.store.set_tags_many

    def broken(*args: object, **kwargs: object) -> None:
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(eng.store, "set_tags_many", broken)
    with pytest.raises(sqlite3.OperationalError):
        eng.on_turn_complete(history)
    # The raw turns were committed before the tagging: nothing the caller sent is lost.
    assert eng.store.last_seq("default") == len(history)
    assert all(not t.tags for t in eng.store.turns("default"))
    assert eng.store.session("default").derived_seq == 0
    assert eng.vocabulary() == {}
    monkeypatch.setattr(eng.store, "set_tags_many", real)
    eng.on_turn_complete(history)  # a resend stores nothing twice and derives what is pending
    turns = eng.store.turns("default")
    assert len(turns) == len(history)
    assert all(t.tags for t in turns)
    assert eng.store.session("default").derived_seq == len(history)
    assert sum(eng.vocabulary().values()) == sum(len(t.tags) for t in turns)


def test_the_hint_counts_compacted_turns_per_topic_and_leaves_out_constants() -> None:
    eng = engine(window=600)
    # "Zorblax" is on every turn: a constant of the conversation, not a topic.
    eng.on_turn_complete([{**m, "content": f"Zorblax: {m['content']}"} for m in conversation(6)])
    eng.compact()
    prepend = eng.on_message_inbound("deadlift plan?").prepend_text
    hint = prepend.split("</context-topics>")[0]
    listed = dict(re.findall(r"([\w-]+) \((\d+)\)", hint))
    assert listed and "zorblax" not in listed
    watermark = eng.store.session("default").compaction_watermark
    truth = eng.store.tag_counts("default", before=watermark)
    assert {tag: int(n) for tag, n in listed.items()} == {tag: truth[tag] for tag in listed}
    assert all(truth[tag] * 2 <= watermark - 1 for tag in listed)
    assert truth["zorblax"] * 2 > watermark - 1


class _CountingEmbedder(HashEmbedder):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def embed(self, texts: Sequence[str]) -> Any:
        self.seen += list(texts)
        return super().embed(texts)


# The hash embedder's cosines are not the MiniLM ones the relevance floor is calibrated for.
_NO_FLOOR = MemoryConfig.model_validate(
    {"recall": {"relevance_floor": False, "unknown_name_floor": False}}
)


def test_a_prefetched_query_is_embedded_once_and_ranks_the_recall() -> None:
    embedder = _CountingEmbedder()
    engine = MemoryEngine(_NO_FLOOR, store=MemoryStore(), embedder=embedder)
    engine.on_turn_complete(
        [
            {"role": "user", "content": "The billing service migrates to Postgres in March."},
            {"role": "assistant", "content": "Noted: billing moves to Postgres in March."},
        ]
    )
    query = "When does billing move to the new database?"
    engine.prefetch(query)
    recalled = engine.on_message_inbound(query).recalled
    assert embedder.seen.count(query) == 1
    assert any("dense" in turn.ranks for turn in recalled)


def _exchanges(engine: MemoryEngine, count: int) -> list[dict[str, str]]:
    history: list[dict[str, str]] = []
    for i in range(count):
        pair = [
            {
                "role": "user",
                "content": f"Step {i} of the kitchen renovation costs {i * 100} euros.",
            },
            {"role": "assistant", "content": f"Noted step {i}."},
        ]
        engine.on_turn_complete(pair)
        history += pair
    return history


def test_a_history_that_holds_every_stored_turn_recalls_without_ranking() -> None:
    """Nothing stored lies outside the request: no full-text search, no query embedding."""
    embedder = _CountingEmbedder()
    engine = MemoryEngine(_NO_FLOOR, store=MemoryStore(), embedder=embedder)
    history = _exchanges(engine, 4)
    query = "How much does the kitchen cost?"
    full = engine.on_message_inbound(query, history)
    assert full.prepend_text == "" and full.recalled == () and query not in embedder.seen
    partial = engine.on_message_inbound(query, history[-2:])  # the client dropped old turns
    assert partial.recalled and embedder.seen.count(query) == 1


def test_a_history_that_holds_every_turn_gets_no_hint_or_summary_after_compaction() -> None:
    """Compacted, but the caller still sends (and keeps) every turn: the topic hint and the tag
    summaries would restate what the request holds, so nothing is injected; a caller that
    dropped its old turns gets them back from memory."""
    engine = MemoryEngine(_NO_FLOOR, store=MemoryStore(), embedder=HashEmbedder())
    history = _exchanges(engine, 12)
    assert engine.compact() is not None
    query = "How much does step 3 of the kitchen renovation cost?"
    held = engine.on_message_inbound(query, history, protected=len(history))
    assert held.prepend_text == "" and held.items == () and held.recalled == ()
    trimmed = engine.on_message_inbound(query, history[-4:])
    assert "costs 300 euros" in trimmed.prepend_text


@settings(max_examples=25, deadline=None)
@given(count=st.integers(1, 8), query=st.sampled_from(["kitchen cost?", "step 3", "hello"]))
def test_skipping_the_ranking_changes_no_result(count: int, query: str) -> None:
    engine = MemoryEngine(store=MemoryStore(), embedder=HashEmbedder())
    history = _exchanges(engine, count)
    fast = engine.on_message_inbound(query, history)
    engine._holds_everything = lambda *args: False  # type: ignore[method-assign]
    slow = engine.on_message_inbound(query, history)
    assert (fast.prepend_text, fast.items) == (slow.prepend_text, slow.items)


def test_a_turn_written_is_the_stores_two_calls_and_nothing_else() -> None:
    # Each store call is a round trip on a database server: once the session is known, a turn
    # is stored and derived (tagged, counted, aliases and splits checked) by ``begin_derive``
    # and ``write_derived`` alone — no generation, alias or split read beside them.
    config = MemoryConfig.model_validate(
        {"storage_path": ":memory:", "recall": {"embedder": "none"}}
    )
    engine = MemoryEngine(config)
    store = engine.store
    calls: list[str] = []
    depth = [0]

    def counted(name: str, method: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            if depth[0] == 0:
                calls.append(name)
            depth[0] += 1
            try:
                return method(*args, **kwargs)
            finally:
                depth[0] -= 1

        return call

    for name in dir(type(store)):
        if not name.startswith("_") and callable(getattr(store, name)):
            setattr(store, name, counted(name, getattr(store, name)))
    words = ["kiln glaze firing", "walnut veneer shipment", "dock four schedule"]
    for n in range(12):
        text = f"turn {n}: the {words[n % 3]} for order {n}"
        engine.on_turn_complete([{"role": "user", "content": text}], new_only=True)
    calls.clear()
    engine.on_turn_complete([{"role": "user", "content": "the kiln glaze again"}], new_only=True)
    assert calls == ["begin_derive", "write_derived"]
    assert engine.vocabulary() == store.tag_counts("default")  # the counts carried are right
