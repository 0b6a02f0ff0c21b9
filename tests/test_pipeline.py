"""ContextPipeline: the fluent builder, steps (sync, async, decorators, factories over real
protocol implementations), error handling with rollback, and the diagnostics of a build."""

from __future__ import annotations

import re
from collections.abc import Sequence

import pytest

from contextfold import (
    AnthropicFormatter,
    BudgetError,
    CharCounter,
    ConfigError,
    ContextItem,
    ContextPipeline,
    ContextResult,
    MemoryManager,
    PipelineError,
    PipelineStep,
    QueryBundle,
    SourceType,
    StepError,
    TokenBudget,
    default_chat_budget,
    filter_step,
    fixed5_budget,
    postprocessor_step,
    reranker_step,
    retriever_step,
)
from contextfold.protocols import PostProcessor, Reranker, Retriever

DOCS = [
    "Python is great for data science.",
    "RAG combines retrieval with generation.",
    "Context engineering decides what the model sees.",
    "Bananas are rich in potassium.",
    "Retrieval quality bounds generation quality in RAG.",
]


def _words(text: str) -> set[str]:
    return set(re.findall(r"\w+", text.lower()))


class KeywordRetriever:
    """Scores documents by word overlap with the query; best first, at most top_k."""

    def __init__(self, docs: Sequence[str]) -> None:
        self.docs = [ContextItem(content=d, source=SourceType.RETRIEVAL) for d in docs]

    def retrieve(self, query: QueryBundle, top_k: int) -> list[ContextItem]:
        q = _words(query.query_str)
        scored = [(len(q & _words(d.content)), d) for d in self.docs]
        hits = sorted((s for s in scored if s[0]), key=lambda s: -s[0])[:top_k]
        return [d.model_copy(update={"score": float(s)}) for s, d in hits]


class Dedupe:
    """Drops items whose content was already seen (a PostProcessor)."""

    def process(self, items: list[ContextItem], query: QueryBundle) -> list[ContextItem]:
        seen: set[str] = set()
        return [i for i in items if not (i.content in seen or seen.add(i.content))]


class LengthReranker:
    """Shorter documents first, scored 1/len (a Reranker)."""

    def rerank(
        self, query: QueryBundle, items: Sequence[ContextItem], top_k: int
    ) -> list[ContextItem]:
        ranked = sorted(items, key=lambda i: len(i.content))[:top_k]
        return [i.model_copy(update={"score": 1 / len(i.content)}) for i in ranked]


def _contents(result: ContextResult, source: SourceType) -> list[str]:
    return [i.content for i in result.items if i.source is source]


def test_fixtures_implement_the_protocols() -> None:
    assert isinstance(KeywordRetriever(DOCS), Retriever)
    assert isinstance(Dedupe(), PostProcessor)
    assert isinstance(LengthReranker(), Reranker)


def test_fluent_builder_returns_the_pipeline() -> None:
    pipeline = ContextPipeline(max_tokens=2000)
    memory = MemoryManager(conversation_tokens=100)
    formatter = AnthropicFormatter()
    assert pipeline.with_memory(memory) is pipeline
    assert pipeline.with_formatter(formatter) is pipeline
    assert pipeline.with_counter(CharCounter()) is pipeline
    assert pipeline.add_system_prompt("Be brief.") is pipeline
    assert pipeline.add_items([ContextItem(content="fact")]) is pipeline
    assert pipeline.add_step(filter_step("all", lambda i: True)) is pipeline
    assert pipeline.formatter is formatter
    assert pipeline.budget == TokenBudget(max_tokens=2000)
    assert [s.name for s in pipeline.steps] == ["all"]
    assert "steps=['all']" in repr(pipeline)


@pytest.mark.parametrize(
    "query", ["What is RAG?", QueryBundle(query_str="What is RAG?", metadata={"user": "u1"})]
)
def test_build_accepts_str_and_query_bundle(query: str | QueryBundle) -> None:
    result = ContextPipeline(max_tokens=500).build(query)
    assert result.query.query_str == "What is RAG?"
    if isinstance(query, QueryBundle):
        assert result.query is query
    (item,) = result.items
    assert (item.content, item.source, item.pinned) == ("What is RAG?", SourceType.USER, True)
    with pytest.raises(ConfigError, match="takes a str or a QueryBundle, got int"):
        ContextPipeline().build(42)  # type: ignore[arg-type]


def test_system_prompts_are_pinned_in_order() -> None:
    pipeline = (
        ContextPipeline(max_tokens=60)
        .add_system_prompt("First rule.")
        .add_system_prompt("Second rule.", priority=3)
    )
    pipeline.add_items([ContextItem(content="filler " * 80)])  # far over the budget
    result = pipeline.build("q")
    assert _contents(result, SourceType.SYSTEM) == ["First rule.", "Second rule."]
    system = [d for d in result.decisions if d.source is SourceType.SYSTEM]
    assert [d.reason for d in system] == ["pinned", "pinned"]
    assert all(i.pinned for i in result.items if i.source is SourceType.SYSTEM)
    assert result.diagnostics.dropped == 1


def test_with_budget_mismatch_raises_config_error() -> None:
    with pytest.raises(ConfigError, match=r"budget's max_tokens \(2,000\) differs.*\(1,000\)"):
        ContextPipeline(max_tokens=1000).with_budget(default_chat_budget(2000))
    with pytest.raises(ConfigError, match="differs"):
        ContextPipeline(max_tokens=1000, budget=fixed5_budget())
    budget = default_chat_budget(1000)
    assert ContextPipeline(max_tokens=1000).with_budget(budget).budget is budget
    assert ContextPipeline().with_budget(budget).budget is budget


def test_counter_or_model_not_both() -> None:
    with pytest.raises(ConfigError, match="either counter or model"):
        ContextPipeline(counter=CharCounter(), model="gpt-4o")
    assert ContextPipeline(model="gpt-4").counter.name == "cl100k_base"
    assert ContextPipeline(model="claude-sonnet-4").counter.estimated is True
    assert ContextPipeline().counter.name == "o200k_base"


def test_step_decorator_registers_and_returns_the_function() -> None:
    pipeline = ContextPipeline(max_tokens=1000).add_items([ContextItem(content="a", score=0.2)])

    @pipeline.step
    def double_scores(items: list[ContextItem], query: QueryBundle) -> list[ContextItem]:
        return [i.model_copy(update={"score": i.score * 2}) for i in items]

    assert [s.name for s in pipeline.steps] == ["double_scores"]
    assert callable(double_scores)
    result = pipeline.build("q")
    assert [i.score for i in result.items if i.source is SourceType.RETRIEVAL] == [0.4]
    (record,) = result.diagnostics.steps
    assert (record.name, record.status, record.items_before, record.items_after) == (
        "double_scores",
        "ok",
        1,
        1,
    )
    with pytest.raises(ConfigError, match="'double_scores' already exists"):
        pipeline.step(double_scores)


async def test_async_step_runs_in_abuild() -> None:
    pipeline = ContextPipeline(max_tokens=1000)

    @pipeline.async_step
    async def fetch(items: list[ContextItem], query: QueryBundle) -> list[ContextItem]:
        return [*items, ContextItem(content=f"fetched for {query.query_str}")]

    @pipeline.step
    def tag(items: list[ContextItem], query: QueryBundle) -> list[ContextItem]:
        return [i.model_copy(update={"metadata": {"tagged": True}}) for i in items]

    result = await pipeline.abuild("RAG")
    (doc,) = [i for i in result.items if i.source is SourceType.RETRIEVAL]
    assert (doc.content, doc.metadata) == ("fetched for RAG", {"tagged": True})
    assert [(r.name, r.status) for r in result.diagnostics.steps] == [
        ("fetch", "ok"),
        ("tag", "ok"),
    ]


def test_build_with_async_step_raises_pipeline_error() -> None:
    pipeline = ContextPipeline(max_tokens=1000)

    @pipeline.async_step
    async def fetch(items: list[ContextItem], query: QueryBundle) -> list[ContextItem]:
        return items

    with pytest.raises(PipelineError, match=r"step 'fetch' is async; call abuild\(\)"):
        pipeline.build("q")
    with pytest.raises(ConfigError, match="not an async function"):
        pipeline.async_step(lambda items, query: items)


def test_retriever_step_appends_top_k() -> None:
    pipeline = ContextPipeline(max_tokens=1000).add_items([ContextItem(content="kept fact")])
    pipeline.add_step(retriever_step("search", KeywordRetriever(DOCS), top_k=2))
    result = pipeline.build("How does RAG retrieval work?")
    docs = _contents(result, SourceType.RETRIEVAL)
    assert docs[0] == "kept fact"
    assert sorted(docs[1:]) == sorted([DOCS[1], DOCS[4]])
    assert result.diagnostics.steps[0].items_after == 3


def test_postprocessor_and_filter_steps() -> None:
    items = [ContextItem(content=t) for t in ("a doc", "a doc", "banana doc", "b doc")]
    pipeline = (
        ContextPipeline(max_tokens=1000)
        .add_items(items)
        .add_step(postprocessor_step("dedupe", Dedupe()))
        .add_step(filter_step("no-bananas", lambda i: "banana" not in i.content))
    )
    result = pipeline.build("q")
    assert _contents(result, SourceType.RETRIEVAL) == ["a doc", "b doc"]
    counts = [(r.items_before, r.items_after) for r in result.diagnostics.steps]
    assert counts == [(4, 3), (3, 2)]


def test_reranker_step_reranks_only_retrieved_items() -> None:
    tool = ContextItem(content="tool output that is quite long", source=SourceType.TOOL)
    pipeline = (
        ContextPipeline(max_tokens=1000)
        .add_items([tool])
        .add_step(retriever_step("search", KeywordRetriever(DOCS), top_k=5))
        .add_step(reranker_step("shortest", LengthReranker(), top_k=2))
    )
    result = pipeline.build("RAG retrieval generation data science")
    docs = [i for i in result.items if i.source is SourceType.RETRIEVAL]
    assert [d.content for d in docs] == [DOCS[0], DOCS[1]]  # the two shortest hits
    assert docs[0].score == pytest.approx(1 / len(DOCS[0]))
    assert _contents(result, SourceType.TOOL) == [tool.content]


def test_skip_rolls_back_and_records_the_error() -> None:
    def half_done(items: list[ContextItem], query: QueryBundle) -> list[ContextItem]:
        items.append(ContextItem(content="half-written"))  # mutates its copy, then fails
        raise RuntimeError("index offline")

    pipeline = ContextPipeline(max_tokens=1000).add_items([ContextItem(content="base")])
    pipeline.add_step(PipelineStep("flaky", half_done, on_error="skip"))
    pipeline.add_step(filter_step("all", lambda i: True))
    result = pipeline.build("q")
    assert _contents(result, SourceType.RETRIEVAL) == ["base"]
    skipped, ok = result.diagnostics.steps
    assert (skipped.name, skipped.status, skipped.error) == (
        "flaky",
        "skipped",
        "RuntimeError: index offline",
    )
    assert (skipped.items_before, skipped.items_after) == (1, 1)
    assert ok.status == "ok"
    assert "step 'flaky' skipped (rolled back): RuntimeError: index offline" in str(result)


def test_raise_wraps_in_step_error_with_cause() -> None:
    boom = ValueError("bad vector")

    def failing(items: list[ContextItem], query: QueryBundle) -> list[ContextItem]:
        raise boom

    pipeline = ContextPipeline(max_tokens=1000).add_step(PipelineStep("embed", failing))
    with pytest.raises(StepError) as info:
        pipeline.build("q")
    assert info.value.__cause__ is boom
    assert info.value.step == "embed"
    assert str(info.value) == "step 'embed' failed: ValueError: bad vector"
    assert isinstance(info.value, PipelineError)


async def test_async_step_failure_honours_on_error() -> None:
    async def failing(items: list[ContextItem], query: QueryBundle) -> list[ContextItem]:
        raise TimeoutError("slow backend")

    skip = ContextPipeline(max_tokens=500).add_step(PipelineStep("a", failing, on_error="skip"))
    result = await skip.abuild("q")
    assert result.diagnostics.steps[0].error == "TimeoutError: slow backend"
    strict = ContextPipeline(max_tokens=500).add_step(PipelineStep("a", failing))
    with pytest.raises(StepError) as info:
        await strict.abuild("q")
    assert isinstance(info.value.__cause__, TimeoutError)


@pytest.mark.parametrize("returned", [None, "text", {"a": 1}, [1, 2], [ContextItem(), "x"]])
def test_non_list_return_is_a_failure(returned: object) -> None:
    base = [ContextItem(content="base")]
    skip = ContextPipeline(max_tokens=500).add_items(base)
    skip.add_step(PipelineStep("bad", lambda items, query: returned, on_error="skip"))
    result = skip.build("q")
    assert result.diagnostics.steps[0].status == "skipped"
    assert "expected a list of ContextItem" in (result.diagnostics.steps[0].error or "")
    assert _contents(result, SourceType.RETRIEVAL) == ["base"]
    strict = ContextPipeline(max_tokens=500).add_step(PipelineStep("bad", lambda i, q: returned))
    with pytest.raises(StepError, match="expected a list of ContextItem") as info:
        strict.build("q")
    assert isinstance(info.value.__cause__, TypeError)


def test_on_error_is_validated() -> None:
    with pytest.raises(ConfigError, match="on_error must be 'raise' or 'skip', got 'ignore'"):
        PipelineStep("x", lambda items, query: items, on_error="ignore")  # type: ignore[arg-type]


def test_filter_step_cannot_remove_pinned_items() -> None:
    pinned = ContextItem(content="legal notice", source=SourceType.MEMORY, pinned=True)
    loose = ContextItem(content="loose note", source=SourceType.MEMORY)
    pipeline = (
        ContextPipeline(max_tokens=1000)
        .add_system_prompt("Rules.")
        .add_items([pinned, loose])
        .add_step(filter_step("drop-everything", lambda item: False))
    )
    result = pipeline.build("q")
    assert _contents(result, SourceType.MEMORY) == ["legal notice"]
    assert _contents(result, SourceType.SYSTEM) == ["Rules."]
    assert result.diagnostics.steps[0].items_after == 1


def test_memory_items_feed_the_build() -> None:
    memory = MemoryManager(conversation_tokens=1000)
    memory.add_user_message("My name is Ada.")
    memory.add_assistant_message("Hello Ada.")
    result = ContextPipeline(max_tokens=1000).with_memory(memory).build("What is my name?")
    history = [i.message.text() for i in result.items if i.message is not None]
    assert history == ["My name is Ada.", "Hello Ada."]
    with pytest.raises(ConfigError, match="has no context_items"):
        ContextPipeline().with_memory(object())  # type: ignore[arg-type]


def test_diagnostics_fields() -> None:
    docs = [ContextItem(content=f"Doc {i}. " + "word " * 300, score=i / 10) for i in range(4)]
    pipeline = ContextPipeline().with_budget(fixed5_budget()).add_items(docs)
    result = pipeline.add_system_prompt("Answer.").build("Which doc?")
    d = result.diagnostics
    assert [s.name for s in d.sections] == [
        "instructions",
        "goal",
        "memory",
        "retrieval",
        "tool_outputs",
    ]
    assert (d.candidates, d.max_tokens, d.available, d.reserve_output) == (6, 3247, 3247, 0)
    assert d.kept + d.truncated + d.dropped == d.candidates
    assert (d.truncated, d.dropped) == (1, 2)
    assert d.build_time_ms > 0
    assert 0 < d.used_tokens <= d.available
    assert (d.counter, d.estimated, d.format) == ("o200k_base", False, "text")
    assert d.truncated_sections == ["retrieval"]
    assert result.text == result.formatted_output


@pytest.mark.parametrize("max_tokens", [0, -1, -8192])
def test_a_max_tokens_that_is_not_positive_is_refused_like_token_budgets(max_tokens: int) -> None:
    """``max_tokens=0`` is not "no limit" (it used to become an 8,192-token budget): the
    pipeline refuses it with the ``BudgetError`` ``TokenBudget`` gives, when it is made."""
    with pytest.raises(BudgetError, match="max_tokens must be > 0") as expected:
        TokenBudget(max_tokens=max_tokens)
    with pytest.raises(BudgetError) as got:
        ContextPipeline(max_tokens=max_tokens)
    assert str(got.value) == str(expected.value)


def test_max_tokens_none_keeps_the_default_budget_and_a_positive_one_is_kept() -> None:
    assert ContextPipeline().budget.max_tokens == 8192
    assert ContextPipeline(max_tokens=None).budget.max_tokens == 8192
    assert ContextPipeline(max_tokens=1).budget.max_tokens == 1
