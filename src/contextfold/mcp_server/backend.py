"""What the MCP tools, resources and prompts run on: one ``MemoryEngine`` (its session is the
one served) and the document corpus, opened on first use, behind one lock."""

from __future__ import annotations

import difflib
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from mcp.server.mcpserver.exceptions import ToolError

from contextfold.errors import ConfigError, ContextfoldError
from contextfold.memory.engine import MemoryEngine
from contextfold.retrieval.engine import ContextComposer, ContextEngine
from contextfold.retrieval.index import DocumentIndex
from contextfold.store import is_database_url
from contextfold.store.sqlite import home_dir

__all__ = ["Backend", "gist", "tool_errors"]

T = TypeVar("T")


def gist(text: str, width: int = 200, *, min_chars: int = 40) -> str:
    """The first sentences of ``text`` on one line: at least ``min_chars`` characters when the
    text has them, at most ``width`` (cut with an ellipsis).

    >>> gist("Switching topics. We land in Tokyo on April 9. Then Kyoto.")
    'Switching topics. We land in Tokyo on April 9.'
    """
    flat = " ".join(text.split())
    end = 0
    while end < min_chars:
        stops = [i for i in (flat.find(s, end) for s in (". ", "? ", "! ")) if i >= 0]
        if not stops:
            end = len(flat)
            break
        end = min(stops) + 1
    cut = flat[:end]
    return cut if len(cut) <= width else cut[: width - 1] + "…"


@contextmanager
def tool_errors() -> Iterator[None]:
    """contextfold's own errors become tool errors the model reads (and can act on); anything
    else is a bug the SDK reports as a failed call, with the traceback in the server log."""
    try:
        yield
    except ContextfoldError as exc:
        raise ToolError(str(exc)) from None


class Backend:
    """The engines the server serves; ``run(fn)`` calls ``fn`` under the lock with contextfold
    errors turned into tool errors."""

    def __init__(self, memory: MemoryEngine, corpus: str | Path | None, embed: bool) -> None:
        self.memory = memory
        self.corpus = str(corpus) if corpus is not None else None
        self.embed = embed
        self.lock = threading.RLock()
        self._index: DocumentIndex | None = None
        self._composed: dict[int, ContextEngine] = {}

    @property
    def session(self) -> str:
        return self.memory.session_id

    def run(self, fn: Callable[[], T]) -> T:
        with self.lock, tool_errors():
            return fn()

    # -- the corpus -----------------------------------------------------------------------------

    def index(self) -> DocumentIndex:
        """The corpus (``DocumentIndex``), opened on first use; it follows later ingests."""
        if self._index is None and self.corpus is not None and is_database_url(self.corpus):
            self._index = DocumentIndex(self.corpus, embedder=None if self.embed else False)
        if self._index is None:
            path = Path(self.corpus) if self.corpus is not None else home_dir()
            if path.is_dir() or not path.suffix:
                path = path / "documents.db"
            if not path.is_file():
                raise ConfigError(
                    f"no document corpus at {path}; ingest documents first with "
                    "`contextfold ingest PATH...` (or start the server with --db FILE)"
                )
            self._index = DocumentIndex(path, embedder=None if self.embed else False)
        return self._index

    def context_engine(self, max_tokens: int) -> ContextEngine:
        """The seed-002 ``ContextEngine`` over the corpus, composing at most ``max_tokens``
        (one per limit, so each keeps its cache)."""
        engine = self._composed.get(max_tokens)
        if engine is None:
            composer = ContextComposer(max_tokens, self.memory.counter)
            engine = ContextEngine(memory=self.index(), composer=composer)
            self._composed[max_tokens] = engine
        return engine

    # -- topics ---------------------------------------------------------------------------------

    def resolve_tag(self, tag: str) -> str:
        """The stored spelling of ``tag`` (aliases and plurals followed); a ``ConfigError``
        naming the closest stored tags when there is none."""
        vocabulary = self.memory.vocabulary()
        canon = self.memory.canonicalizer
        for candidate in (canon.canonical(tag), canon.fold(tag), tag):
            if candidate in vocabulary:
                return candidate
        wanted = canon.canonical(tag) or tag
        close = difflib.get_close_matches(wanted, list(vocabulary), n=5, cutoff=0.6)
        popular = sorted(vocabulary, key=lambda t: -vocabulary[t])[:10]
        hint = f"close: {', '.join(close)}" if close else f"topics: {', '.join(popular) or 'none'}"
        raise ConfigError(f"no topic {tag!r} in session {self.session!r}; {hint}")

    def topics(self) -> dict[str, Any]:
        """Every topic of the session, most turns first, with a gist of its summary."""
        sid, store = self.session, self.memory.store
        summaries = store.paging.tag_summaries(sid)
        working = store.paging.working_set(sid)
        segments = store.segments(sid, full_text=False)
        topics = []
        for tag, turns in self.memory.status().tags.items():
            tagged = [s for s in segments if tag in s.tags]
            summary = summaries.get(tag)
            source = summary.summary if summary else (tagged[0].summary if tagged else "")
            topics.append(
                {
                    "tag": tag,
                    "turns": turns,
                    "segments": len(tagged),
                    "gist": gist(source) if source else None,
                    "summary_tokens": summary.tokens if summary else 0,
                    "stale": bool(summary and summary.stale),
                    "depth": working[tag].depth if tag in working else "none",
                }
            )
        return {"session_id": sid, "turns": store.last_seq(sid), "topics": topics}

    def topic(self, tag: str) -> dict[str, Any]:
        """One topic: its tag summary and every segment carrying it (full text left out)."""
        sid, store = self.session, self.memory.store
        name = self.resolve_tag(tag)
        summary = store.paging.tag_summaries(sid).get(name)
        segments = store.segments(sid, tag=name, full_text=False)
        return {
            "session_id": sid,
            "tag": name,
            "turns": self.memory.vocabulary().get(name, 0),
            "summary": summary.model_dump(mode="json", exclude={"session_id"}) if summary else None,
            "segments": [
                s.model_dump(mode="json", exclude={"full_text", "session_id"}) for s in segments
            ],
        }
