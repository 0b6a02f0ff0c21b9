"""The Ask page's engine: a question over the ingested corpus, answered by the same code path
as ``contextfold ask`` (:func:`contextfold.cli.ask.answer_question`), returned as JSON.

The corpus is ``DashboardSettings.corpus`` or ``$CONTEXTFOLD_HOME/documents.db``; the LLM is
the one the server's memory engine was configured with (the ``llm:`` section of
``contextfold.yaml``). Without one, the response says so and carries the context only.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, Literal

from fastapi import HTTPException
from pydantic import BaseModel, ConfigDict, Field

from contextfold.cli.ask import answer_question, source_rows
from contextfold.cli.build import BUDGETS
from contextfold.cli.common import InputError
from contextfold.cli.corpus import open_index
from contextfold.errors import ConfigError, ContextfoldError, LLMError
from contextfold.result import ContextResult
from contextfold.retrieval.index import DocumentIndex
from contextfold.server.dashboard_chat import ChatTurn
from contextfold.server.state import ServerState
from contextfold.store.sqlite import home_dir
from contextfold.window import SectionUsage

__all__ = ["AskRequest", "AskService", "budget_rows"]

NO_LLM = (
    "No LLM is configured, so there is no answer: the context below is what would be sent. "
    "Add an `llm:` section (provider, model) to the server's contextfold.yaml to get answers."
)


class AskRequest(BaseModel):
    """``POST /dashboard/api/ask``: a question and how to pack its context."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    question: str = Field(min_length=1, max_length=4000)
    budget: Literal["fixed5", "chat", "rag", "agent"] = "fixed5"
    max_tokens: int | None = Field(None, ge=512, le=2_000_000)
    k: int = Field(8, ge=1, le=50)
    mode: Literal["hybrid", "bm25", "dense"] = "hybrid"
    #: A chat's id: the question is one turn of that conversation (``dashboard_chat``).
    chat_id: str | None = Field(None, pattern=r"^[A-Za-z0-9_-]{1,64}$")


def budget_rows(result: ContextResult) -> list[dict[str, Any]]:
    """The per-section budget table as JSON rows; ``status_text`` is ``37%``, ``⚠ TRUNCATED``
    or ``⚠ OVER CAP`` exactly as the CLI's table prints it."""
    return [_row(s) for s in result.diagnostics.sections]


def _row(section: SectionUsage) -> dict[str, Any]:
    status = section.status
    text = {"ok": f"{section.percent:.0f}%", "OVER": "⚠ OVER CAP"}.get(status, "⚠ TRUNCATED")
    return {
        "section": section.name,
        "description": section.description,
        "budget": section.limit if section.limit is not None else section.allowance,
        "capped": section.limit is not None,
        "used": section.used,
        "percent": round(section.percent, 1),
        "status": status,
        "status_text": text,
        "candidates": section.candidates,
        "kept": section.kept,
        "truncated": section.truncated,
        "dropped": section.dropped,
    }


class AskService:
    """Answers Ask requests for one server. The corpus index is opened once per mode
    family (with or without an embedder) and follows later ingests by itself; asks run one at
    a time (the index's SQLite connection is shared)."""

    def __init__(self, state: ServerState) -> None:
        self.state = state
        self._indexes: dict[tuple[Path, bool], DocumentIndex] = {}
        self._lock = threading.Lock()

    @property
    def corpus_path(self) -> Path:
        configured = self.state.config.dashboard.corpus
        return Path(configured) if configured else home_dir() / "documents.db"

    def llm_info(self) -> dict[str, Any]:
        """Which LLM answers (``configured: false`` with the reason when none)."""
        settings = self.state.memory.config.llm
        if settings is None or self.state.memory.llm_client is None:
            return {"configured": False, "message": NO_LLM}
        return {"configured": True, "provider": settings.provider, "model": settings.model}

    def info(self) -> dict[str, Any]:
        """What the page needs before the first question: corpus, presets, examples, LLM."""
        path = self.corpus_path
        return {
            "corpus": str(path),
            "corpus_exists": path.exists(),
            "budgets": list(BUDGETS),
            "modes": ["hybrid", "bm25", "dense"],
            "examples": list(self.state.config.dashboard.examples),
            "llm": self.llm_info(),
        }

    def ask(self, request: AskRequest) -> dict[str, Any]:
        """Search, pack and (with an LLM) answer; errors become 4xx/502 with a message."""
        started = time.perf_counter()
        llm = self.llm_info()
        try:
            if request.budget == "fixed5" and request.max_tokens is not None:
                raise InputError(
                    "max_tokens does not apply to the fixed5 budget (five fixed sections); "
                    "leave it out, or pick chat, rag or agent to size the window"
                )
            with self._lock:
                index = self._index(embed=request.mode != "bm25")
                turn = (
                    ChatTurn(
                        self.state.memory,
                        request.chat_id,
                        request.question,
                        self.state.config.dashboard.chat_tool,
                    )
                    if request.chat_id
                    else None
                )
                outcome = answer_question(
                    index,
                    request.question,
                    k=request.k,
                    mode=request.mode,
                    budget=request.budget,
                    max_tokens=request.max_tokens,
                    llm=self.state.memory.llm_client if llm["configured"] else None,
                    model=llm.get("model"),
                    tool_outputs=turn.tool_outputs if turn is not None else None,
                    extra=turn.items() if turn is not None else (),
                )
                if turn is not None:
                    turn.store(outcome.answer)
        except InputError as exc:
            raise HTTPException(422, str(exc)) from None
        except LLMError as exc:
            raise HTTPException(502, f"the LLM failed: {exc}") from None
        except ConfigError as exc:  # BudgetError included: the budget cannot hold the request
            raise HTTPException(422, f"{type(exc).__name__}: {exc}") from None
        except ContextfoldError as exc:
            raise HTTPException(500, f"{type(exc).__name__}: {exc}") from None
        result, diagnostics = outcome.result, outcome.result.diagnostics
        return {
            "question": request.question,
            "budget": request.budget,
            "mode": request.mode,
            "k": request.k,
            "answer": outcome.answer,
            "llm": llm,
            "context": result.text,
            "budget_table": budget_rows(result),
            "truncated_sections": diagnostics.truncated_sections,
            "totals": {
                "used": diagnostics.used_tokens,
                "available": diagnostics.available,
                "max_tokens": diagnostics.max_tokens,
                "reserve_output": diagnostics.reserve_output,
                "counter": diagnostics.counter,
                "estimated": diagnostics.estimated,
                "format": diagnostics.format,
                "kept": diagnostics.kept,
                "truncated": diagnostics.truncated,
                "dropped": diagnostics.dropped,
                "candidates": diagnostics.candidates,
                "build_ms": round(diagnostics.build_time_ms, 2),
            },
            "sources": [
                {**row.as_dict(), "text": hit.text}
                for row, hit in zip(source_rows(result, outcome.hits), outcome.hits, strict=True)
            ],
            "decisions": [
                d.model_dump(mode="json") for d in result.decisions if d.action.value != "kept"
            ],
            "chat": turn.summary(outcome.answer) if turn is not None else None,
            "elapsed_ms": round((time.perf_counter() - started) * 1000, 1),
        }

    def _index(self, *, embed: bool) -> DocumentIndex:
        path = self.corpus_path
        if not path.exists():
            raise HTTPException(
                404,
                f"no corpus at {path}; run `contextfold ingest PATH...` first (or set "
                "dashboard.corpus in the server config)",
            )
        key = (path, embed)
        if key not in self._indexes:
            self._indexes[key] = open_index(str(path), embed=embed, must_exist=True)
        return self._indexes[key]
