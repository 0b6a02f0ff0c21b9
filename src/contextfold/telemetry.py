"""OpenTelemetry spans (``pip install "contextfold[otel]"``): one per pipeline build, proxied
request, memory recall and compaction, with token counts and decisions as attributes.

contextfold only uses the OpenTelemetry *API*: spans go to the tracer provider the
application configures (``opentelemetry.trace.set_tracer_provider`` with the SDK and an
exporter), or to ``use(provider)``. With no SDK configured the API's spans record nothing,
and without ``opentelemetry-api`` installed every hook here is a no-op: tracing costs nothing
when it is not wanted.

=============================  ==========================================================
span                           attributes (``contextfold.`` prefix)
=============================  ==========================================================
``contextfold.pipeline.build``  ``tokens.used``, ``tokens.max``, ``tokens.available``,
                               ``items.candidates`` / ``kept`` / ``truncated`` /
                               ``dropped``, ``format``, ``counter``, ``estimated``,
                               ``steps``, ``sections.truncated``, and per section
                               ``section.<name>.used`` / ``.allowance``
``contextfold.memory.recall``   ``session_id``, ``tags.matched``, ``broad``, ``temporal``,
                               ``recall.candidates``, ``recall.turns``, ``recall.injected``,
                               ``memory.tokens``, ``memory.budget``, ``memory.summaries``
``contextfold.memory.compaction``  ``session_id``, ``level``, ``turns``, ``segments``,
                               ``tokens.compacted``, ``tokens.summary``, ``tokens.freed``,
                               ``watermark.before`` / ``after``
``contextfold.proxy.request``   ``format``, ``path``, ``model``, ``stream``, ``session_id``,
                               ``session.source``, ``http.status``, ``overhead_ms``,
                               ``upstream_ms``, ``tokens.in``, ``tokens.forwarded``,
                               ``memory.tokens``, ``turns.dropped``, ``tags.matched``,
                               ``error``
=============================  ==========================================================
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from contextfold.memory.compactor import CompactionReport
    from contextfold.memory.engine import AssembledContext
    from contextfold.result import ContextResult
    from contextfold.server.events import RequestRecord

__all__ = [
    "enabled",
    "end_proxy_span",
    "now",
    "pipeline_span",
    "record_compaction",
    "record_recall",
    "start_proxy_span",
    "use",
]

_provider: Any = None
_tracer: Any = None
_api: Any = ...  # the ``opentelemetry.trace`` module once looked up; None: not installed


def _trace() -> Any:
    """``opentelemetry.trace``, imported on first use (``import contextfold`` stays light);
    None when the extra is not installed."""
    global _api
    if _api is ...:
        try:
            from opentelemetry import trace
        except ImportError:  # the extra is not installed: every hook is a no-op
            trace = None  # type: ignore[assignment]
        _api = trace
    return _api


Attributes = Mapping[str, str | bool | int | float | list[str] | None]


def enabled() -> bool:
    """Whether the OpenTelemetry API is installed (spans go wherever it is configured)."""
    return _trace() is not None


def use(provider: Any = None) -> None:
    """Send contextfold's spans to ``provider`` (a ``TracerProvider``) instead of the global
    one; ``None`` goes back to the global provider."""
    global _provider, _tracer
    _provider, _tracer = provider, None


def _get_tracer() -> Any:
    global _tracer
    trace = _trace()
    if trace is None:
        return None
    if _tracer is None:
        _tracer = trace.get_tracer("contextfold", _release(), tracer_provider=_provider)
    return _tracer


@functools.cache
def _release() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("contextfold")
    except PackageNotFoundError:
        return None


def now() -> int:
    """The wall-clock time in nanoseconds, as spans are stamped."""
    return time.time_ns()


def _prefixed(attributes: Attributes) -> dict[str, Any]:
    return {f"contextfold.{key}": value for key, value in attributes.items() if value is not None}


def _record(name: str, start_ns: int, attributes: Attributes, end_ns: int | None = None) -> None:
    tracer = _get_tracer()
    if tracer is None:
        return
    span = tracer.start_span(name, start_time=start_ns)
    if span.is_recording():
        span.set_attributes(_prefixed(attributes))
    span.end(end_time=end_ns)


# -- pipeline builds ------------------------------------------------------------------------


@contextlib.contextmanager
def pipeline_span() -> Iterator[Any]:
    """The span around one ``ContextPipeline.build``; ``set_build`` fills it in. Spans the
    build starts (a memory recall) are its children."""
    tracer = _get_tracer()
    if tracer is None:
        yield None
        return
    with tracer.start_as_current_span("contextfold.pipeline.build") as span:
        yield span


def set_build(span: Any, result: ContextResult) -> None:
    """The build's token counts and decisions on its span."""
    if span is None or not span.is_recording():
        return
    d = result.diagnostics
    attributes: dict[str, Any] = {
        "tokens.used": d.used_tokens,
        "tokens.max": d.max_tokens,
        "tokens.available": d.available,
        "tokens.reserve_output": d.reserve_output,
        "items.candidates": d.candidates,
        "items.kept": d.kept,
        "items.truncated": d.truncated,
        "items.dropped": d.dropped,
        "format": d.format,
        "counter": d.counter,
        "estimated": d.estimated,
        "steps": [s.name for s in d.steps],
        "steps.skipped": [s.name for s in d.steps if s.status != "ok"],
        "sections.truncated": d.truncated_sections,
    }
    for section in d.sections:
        attributes[f"section.{section.name}.used"] = section.used
        attributes[f"section.{section.name}.allowance"] = section.allowance
    span.set_attributes(_prefixed(attributes))


# -- memory ---------------------------------------------------------------------------------


def record_recall(result: AssembledContext, start_ns: int) -> None:
    """A span for one ``MemoryEngine.on_message_inbound`` from ``start_ns`` to now."""
    if _trace() is None:
        return
    budget = result.budget
    _record(
        "contextfold.memory.recall",
        start_ns,
        {
            "session_id": result.session_id,
            "tags.matched": list(result.matched_tags),
            "tags.related": list(result.related_tags),
            "broad": result.broad,
            "temporal": result.temporal,
            "tagger": result.tagger,
            "recall.candidates": len(result.recalled),
            "recall.turns": budget.turns_recalled,
            "recall.turns_skipped": budget.turns_skipped,
            "recall.injected": bool(result.prepend_text),
            "memory.tokens": budget.used,
            "memory.budget": budget.budget,
            "memory.summaries": budget.summaries,
            "memory.paged": budget.paged,
            "history.dropped": len(result.history.removed) if result.history is not None else 0,
        },
    )


def record_compaction(report: CompactionReport) -> None:
    """A span for one compaction (its ``duration_ms`` back from now)."""
    if _trace() is None:
        return
    end = now()
    _record(
        "contextfold.memory.compaction",
        end - int(report.duration_ms * 1e6),
        {
            "session_id": report.session_id,
            "level": report.level,
            "turns": report.turns_compacted,
            "segments": report.segments_compacted,
            "tokens.compacted": report.tokens_compacted,
            "tokens.summary": report.summary_tokens,
            "tokens.freed": report.tokens_freed,
            "watermark.before": report.watermark_before,
            "watermark.after": report.watermark_after,
            "tag_summaries.rebuilt": len(report.tag_summaries_rebuilt),
        },
        end,
    )


# -- the proxy ------------------------------------------------------------------------------


def start_proxy_span(started_perf: float) -> Any:
    """The span of one proxied request, started at its ``time.perf_counter()`` start (the
    caller's trace context is its parent); ``end_proxy_span`` ends it."""
    tracer = _get_tracer()
    if tracer is None:
        return None
    elapsed_ns = int((time.perf_counter() - started_perf) * 1e9) if started_perf else 0
    span = tracer.start_span("contextfold.proxy.request", start_time=now() - elapsed_ns)
    return span, now()


def end_proxy_span(handle: Any, record: RequestRecord) -> None:
    """End the span of ``start_proxy_span`` with the request's dashboard record."""
    if handle is None:
        return
    span, end_ns = handle
    if span.is_recording():
        span.set_attributes(
            _prefixed(
                {
                    "format": record.format,
                    "path": record.path,
                    "model": record.model,
                    "stream": record.stream,
                    "session_id": record.session_id,
                    "session.source": record.extra.get("session_source"),
                    "http.status": record.status,
                    "overhead_ms": record.overhead_ms,
                    "upstream_ms": record.upstream_ms,
                    "tokens.in": record.tokens_in,
                    "tokens.forwarded": record.tokens_forwarded,
                    "memory.tokens": record.memory_tokens,
                    "turns.dropped": record.dropped_turns,
                    "tags.matched": list(record.inbound_tags),
                    "error": record.error,
                }
            )
        )
        if record.error or (record.status or 0) >= 500:
            from opentelemetry.trace import Status, StatusCode

            span.set_status(Status(StatusCode.ERROR, record.error or f"HTTP {record.status}"))
    span.end(end_time=end_ns)
