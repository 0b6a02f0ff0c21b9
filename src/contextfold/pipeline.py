"""``ContextPipeline``: gather candidates (instructions, memory, step outputs, the query), pack
them into the budget, format them, and explain the result.

>>> pipeline = ContextPipeline(max_tokens=1000).add_system_prompt("Be brief.")
>>> result = pipeline.build("What is context engineering?")
>>> result.formatted_output
'## Instructions\\nBe brief.\\n\\n## Question\\nWhat is context engineering?'
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from contextfold import telemetry
from contextfold.budget import TokenBudget
from contextfold.errors import ConfigError, PipelineError, StepError
from contextfold.formats import BaseFormatter, Formatter, GenericTextFormatter
from contextfold.items import ContextItem, QueryBundle, SourceType
from contextfold.protocols import MemoryProvider, PostProcessor, Reranker, Retriever
from contextfold.result import ContextResult, Diagnostics, StepRecord
from contextfold.tokens import TiktokenCounter, TokenCounter, counter_for_model
from contextfold.window import Action, pack

__all__ = [
    "ContextPipeline",
    "OnError",
    "PipelineStep",
    "filter_step",
    "postprocessor_step",
    "reranker_step",
    "retriever_step",
]

OnError = Literal["raise", "skip"]
StepFn = Callable[[list[ContextItem], QueryBundle], Any]
_TEXT = GenericTextFormatter()


@dataclass(frozen=True, slots=True)
class PipelineStep:
    """A named transformation of the candidate list: ``fn(items, query) -> items`` (sync or
    async). With ``on_error="skip"`` a failing step is rolled back and recorded."""

    name: str
    fn: StepFn
    on_error: OnError = "raise"

    def __post_init__(self) -> None:
        if self.on_error not in ("raise", "skip"):
            raise ConfigError(f"on_error must be 'raise' or 'skip', got {self.on_error!r}")

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.fn)


def retriever_step(
    name: str, retriever: Retriever, top_k: int = 10, *, on_error: OnError = "raise"
) -> PipelineStep:
    """Appends the retriever's top ``top_k`` items for the query. A seed-002 retriever
    (``retrieve(query: str, k)`` returning ``{"text", "metadata", "score"}`` dicts) is adapted
    (``contextfold.retrieval.adapters.as_retriever``)."""
    from contextfold.retrieval.adapters import as_retriever

    adapted = as_retriever(retriever)

    def run(items: list[ContextItem], query: QueryBundle) -> list[ContextItem]:
        return [*items, *adapted.retrieve(query, top_k)]

    return PipelineStep(name, run, on_error)


def postprocessor_step(
    name: str, processor: PostProcessor, *, on_error: OnError = "raise"
) -> PipelineStep:
    """Replaces the candidates with ``processor.process(items, query)``."""
    return PipelineStep(name, processor.process, on_error)


def filter_step(
    name: str, predicate: Callable[[ContextItem], bool], *, on_error: OnError = "raise"
) -> PipelineStep:
    """Keeps the candidates for which ``predicate`` is true; pinned items are always kept."""

    def run(items: list[ContextItem], query: QueryBundle) -> list[ContextItem]:
        return [item for item in items if item.pinned or predicate(item)]

    return PipelineStep(name, run, on_error)


def reranker_step(
    name: str, reranker: Reranker, top_k: int = 10, *, on_error: OnError = "raise"
) -> PipelineStep:
    """Re-ranks the retrieved candidates (others are left as they are) and keeps ``top_k``."""

    def run(items: list[ContextItem], query: QueryBundle) -> list[ContextItem]:
        retrieved = [i for i in items if i.source is SourceType.RETRIEVAL]
        others = [i for i in items if i.source is not SourceType.RETRIEVAL]
        return [*others, *reranker.rerank(query, retrieved, top_k)]

    return PipelineStep(name, run, on_error)


class ContextPipeline:
    """A fluent builder for context windows.

    Without a budget every candidate competes in one pool of ``max_tokens`` by priority, then
    score. The default format is plain text; the default counter is exact ``o200k_base``
    (or the one for ``model``).
    """

    def __init__(
        self,
        max_tokens: int | None = None,
        *,
        budget: TokenBudget | None = None,
        formatter: Formatter | None = None,
        counter: TokenCounter | None = None,
        model: str | None = None,
    ) -> None:
        if counter is not None and model is not None:
            raise ConfigError("give either counter or model, not both")
        if max_tokens is not None:
            # Refused now, with the budget's own error: 0 is not "no limit" (None is).
            TokenBudget(max_tokens=max_tokens)
        self._max_tokens = max_tokens
        self._budget: TokenBudget | None = None
        self.formatter: Formatter = GenericTextFormatter()
        if formatter is not None:
            self.with_formatter(formatter)  # refused now, not at build time
        self.counter: TokenCounter = (
            counter
            if counter is not None
            else (counter_for_model(model) if model else TiktokenCounter())
        )
        self._system: list[ContextItem] = []
        self._items: list[ContextItem] = []
        self._memory: MemoryProvider | None = None
        self._steps: list[PipelineStep] = []
        if budget is not None:
            self.with_budget(budget)

    def __repr__(self) -> str:
        return (
            f"ContextPipeline(budget={self.budget.max_tokens}, formatter={self.formatter!r}, "
            f"counter={self.counter!r}, steps={[s.name for s in self._steps]})"
        )

    # ------------------------------------------------------------------ configuration

    @property
    def budget(self) -> TokenBudget:
        if self._budget is not None:
            return self._budget
        return TokenBudget(max_tokens=8192 if self._max_tokens is None else self._max_tokens)

    @property
    def steps(self) -> tuple[PipelineStep, ...]:
        return tuple(self._steps)

    def with_budget(self, budget: TokenBudget) -> ContextPipeline:
        if self._max_tokens is not None and budget.max_tokens != self._max_tokens:
            raise ConfigError(
                f"the budget's max_tokens ({budget.max_tokens:,}) differs from the pipeline's "
                f"({self._max_tokens:,}); build the budget for {self._max_tokens:,} tokens or "
                "leave max_tokens out"
            )
        self._budget = budget
        return self

    def with_formatter(self, formatter: Formatter) -> ContextPipeline:
        if not isinstance(formatter, BaseFormatter | Formatter):
            raise ConfigError(
                f"formatter must implement the Formatter protocol (e.g. OpenAIFormatter()), "
                f"got {type(formatter).__name__} {formatter!r}"
            )
        self.formatter = formatter
        return self

    def with_counter(self, counter: TokenCounter) -> ContextPipeline:
        self.counter = counter
        return self

    def with_memory(self, memory: MemoryProvider) -> ContextPipeline:
        if not isinstance(memory, MemoryProvider):
            raise ConfigError(
                f"{type(memory).__name__} has no context_items(query) method; pass a "
                "MemoryManager or another MemoryProvider"
            )
        self._memory = memory
        return self

    def add_system_prompt(self, text: str, priority: int = 10) -> ContextPipeline:
        """Adds pinned instructions (never dropped; several are kept in the order added)."""
        self._system.append(
            ContextItem(
                content=text,
                source=SourceType.SYSTEM,
                priority=priority,
                pinned=True,
            )
        )
        return self

    def add_items(self, items: Sequence[ContextItem]) -> ContextPipeline:
        """Adds fixed candidates (facts, tool outputs, documents) to every build. Anything
        else than a list of ``ContextItem`` raises ``ConfigError`` and adds nothing."""
        if isinstance(items, ContextItem | str | bytes | Mapping) or not isinstance(
            items, Iterable
        ):
            raise ConfigError(
                f"items must be a list of ContextItem (wrap one item in a list), got "
                f"{type(items).__name__} {str(items)[:80]!r}"
            )
        added = list(items)
        for n, item in enumerate(added):
            if not isinstance(item, ContextItem):
                raise ConfigError(
                    f"items must be ContextItem objects, got {type(item).__name__} "
                    f"{str(item)[:80]!r} at items[{n}]"
                )
        self._items.extend(added)
        return self

    def add_step(self, step: PipelineStep) -> ContextPipeline:
        if any(s.name == step.name for s in self._steps):
            raise ConfigError(f"a step named {step.name!r} already exists; step names are unique")
        self._steps.append(step)
        return self

    def step(self, fn: Callable[[list[ContextItem], QueryBundle], list[ContextItem]]) -> Any:
        """Decorator: register ``fn(items, query) -> items`` as a step named after it."""
        self.add_step(PipelineStep(fn.__name__, fn))
        return fn

    def async_step(
        self, fn: Callable[[list[ContextItem], QueryBundle], Awaitable[list[ContextItem]]]
    ) -> Any:
        """Decorator: register an async step (run by ``abuild()``)."""
        if not inspect.iscoroutinefunction(fn):
            raise ConfigError(f"{fn.__name__} is not an async function; use @pipeline.step")
        self.add_step(PipelineStep(fn.__name__, fn))
        return fn

    # ------------------------------------------------------------------ building

    def build(self, query: str | QueryBundle) -> ContextResult:
        """Pack the context for ``query`` and format it. Async steps need ``abuild()``.
        With OpenTelemetry installed, each build is a ``contextfold.pipeline.build`` span
        (``contextfold.telemetry``)."""
        with telemetry.pipeline_span() as span:
            result = self._build(query)
            telemetry.set_build(span, result)
            return result

    def _build(self, query: str | QueryBundle) -> ContextResult:
        started = time.perf_counter()
        bundle, items = self._start(query)
        records: list[StepRecord] = []
        for step in self._steps:
            if step.is_async:
                raise PipelineError(
                    f"step {step.name!r} is async; call abuild() instead of build()"
                )
            t0 = time.perf_counter()
            try:
                out = step.fn(list(items), bundle)
            except Exception as exc:
                items = self._failed(step, items, exc, t0, records)
                continue
            items = self._accept(step, items, out, t0, records)
        return self._finish(bundle, items, records, started)

    async def abuild(self, query: str | QueryBundle) -> ContextResult:
        """``build()`` for async code: awaits async steps, runs sync ones inline."""
        with telemetry.pipeline_span() as span:
            result = await self._abuild(query)
            telemetry.set_build(span, result)
            return result

    async def _abuild(self, query: str | QueryBundle) -> ContextResult:
        started = time.perf_counter()
        bundle, items = self._start(query)
        records: list[StepRecord] = []
        for step in self._steps:
            t0 = time.perf_counter()
            try:
                out = step.fn(list(items), bundle)
                if inspect.isawaitable(out):
                    out = await out
            except Exception as exc:
                items = self._failed(step, items, exc, t0, records)
                continue
            items = self._accept(step, items, out, t0, records)
        return self._finish(bundle, items, records, started)

    def _start(self, query: str | QueryBundle) -> tuple[QueryBundle, list[ContextItem]]:
        if isinstance(query, str):
            bundle = QueryBundle(query_str=query)
        elif isinstance(query, QueryBundle):
            bundle = query
        else:
            raise ConfigError(f"build() takes a str or a QueryBundle, got {type(query).__name__}")
        items = list(self._items)
        if self._memory is not None:
            items.extend(self._memory.context_items(bundle))
        return bundle, items

    def _failed(
        self,
        step: PipelineStep,
        items: list[ContextItem],
        exc: Exception,
        t0: float,
        records: list[StepRecord],
    ) -> list[ContextItem]:
        if step.on_error == "raise":
            raise StepError(step.name, f"{type(exc).__name__}: {exc}") from exc
        records.append(
            StepRecord(
                name=step.name,
                status="skipped",
                items_before=len(items),
                items_after=len(items),
                ms=(time.perf_counter() - t0) * 1000,
                error=f"{type(exc).__name__}: {exc}",
            )
        )
        return items  # rolled back: the step worked on a copy

    def _accept(
        self,
        step: PipelineStep,
        items: list[ContextItem],
        out: Any,
        t0: float,
        records: list[StepRecord],
    ) -> list[ContextItem]:
        if not isinstance(out, list | tuple) or not all(isinstance(i, ContextItem) for i in out):
            exc = TypeError(f"returned {type(out).__name__}, expected a list of ContextItem")
            return self._failed(step, items, exc, t0, records)
        records.append(
            StepRecord(
                name=step.name,
                status="ok",
                items_before=len(items),
                items_after=len(out),
                ms=(time.perf_counter() - t0) * 1000,
            )
        )
        return list(out)

    def _finish(
        self,
        bundle: QueryBundle,
        items: list[ContextItem],
        records: list[StepRecord],
        started: float,
    ) -> ContextResult:
        candidates = [*self._system, *items]
        if bundle.query_str:
            candidates.append(
                ContextItem(
                    content=bundle.query_str,
                    source=SourceType.USER,
                    priority=10,
                    pinned=True,
                )
            )
        window = pack(candidates, self.budget, self.counter, self.formatter)
        text = window.payload if isinstance(window.payload, str) else _TEXT.format(window.items)
        actions = [d.action for d in window.decisions]
        diagnostics = Diagnostics(
            sections=window.sections,
            used_tokens=window.used_tokens,
            available=window.available,
            max_tokens=window.max_tokens,
            reserve_output=window.reserve_output,
            counter=window.counter,
            estimated=window.estimated,
            format=window.format,
            encoding=window.encoding,
            encoding_fallback=window.encoding_fallback,
            build_time_ms=(time.perf_counter() - started) * 1000,
            candidates=len(candidates),
            kept=actions.count(Action.KEPT),
            truncated=actions.count(Action.TRUNCATED),
            dropped=len(actions) - actions.count(Action.KEPT) - actions.count(Action.TRUNCATED),
            steps=tuple(records),
        )
        return ContextResult(
            formatted_output=window.payload,
            text=text,
            query=bundle,
            window=window,
            diagnostics=diagnostics,
        )
