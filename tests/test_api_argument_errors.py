"""Bad arguments at the public entry points: a ``ConfigError`` naming the argument, what it
takes and what it got (never a raw TypeError / AttributeError / pydantic / sqlite3 error from
deep inside), and nothing stored; a closed ``DocumentIndex`` answers ``StoreError``."""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from contextfold import ContextItem, ContextPipeline, DocumentIndex, SourceType, counter_for_model
from contextfold.errors import ConfigError, StoreError
from contextfold.items import QueryBundle
from contextfold.memory.engine import MemoryEngine

USER = {"role": "user", "content": "The boiler is serviced in May."}


@dataclass
class Env:
    engine: MemoryEngine
    index: DocumentIndex
    pipeline: ContextPipeline

    def state(self) -> tuple[Any, ...]:
        """Everything a call could have stored: turns per session, documents, pipeline items."""
        store = self.engine.store
        return (
            tuple((s, store.last_seq(s)) for s in sorted(store.sessions())),
            len(self.index),
            self.index.version,
            self.pipeline.build("q").diagnostics.candidates,
        )


@pytest.fixture
def env() -> Iterator[Env]:
    engine = MemoryEngine(store=":memory:", embedder=None)
    index = DocumentIndex(embedder=False)
    engine.on_turn_complete([USER], session_id="s")
    index.add_document("Refunds take fourteen days.", {"lang": "en"})
    pipeline = ContextPipeline(max_tokens=1000)
    pipeline.add_items([ContextItem(content="a fact", source=SourceType.MEMORY)])
    try:
        yield Env(engine, index, pipeline)
    finally:
        engine.close()
        index.close()


ITEM = ContextItem(content="x", source=SourceType.MEMORY)
TODAY = datetime.date.today()

# (id, call, words the message must hold: the argument's name, and what it got)
CASES: list[tuple[str, Callable[[Env], Any], tuple[str, ...]]] = [
    ("turns-none", lambda e: e.engine.on_turn_complete(None), ("messages", "NoneType")),
    (
        "turns-one-dict",
        lambda e: e.engine.on_turn_complete(USER, session_id="s2"),
        ("messages", "dict"),
    ),
    (
        "timestamps-str",
        lambda e: e.engine.on_turn_complete([USER], session_id="s2", timestamps=["2024-01-01"]),
        ("timestamps", "str"),
    ),
    (
        "timestamps-date",
        lambda e: e.engine.on_turn_complete([USER], session_id="s2", timestamps=[TODAY]),
        ("timestamps", "date"),
    ),
    (
        "timestamps-not-a-list",
        lambda e: e.engine.on_turn_complete([USER], session_id="s2", timestamps=5),
        ("timestamps", "int"),
    ),
    (
        "history-none",
        lambda e: e.engine.on_message_inbound("q", None),
        ("conversation_history", "NoneType"),
    ),
    (
        "history-str",
        lambda e: e.engine.on_message_inbound("q", "earlier text"),
        ("conversation_history", "str"),
    ),
    (
        "budget-str",
        lambda e: e.engine.on_message_inbound("boiler?", session_id="s", budget="500"),
        ("budget", "'500'"),
    ),
    (
        "budget-bool",
        lambda e: e.engine.on_message_inbound("boiler?", session_id="s", budget=True),
        ("budget", "True"),
    ),
    (
        "protected-str",
        lambda e: e.engine.on_message_inbound("boiler?", session_id="s", protected="2"),
        ("protected", "'2'"),
    ),
    (
        "model-int",
        lambda e: e.engine.on_message_inbound("boiler?", session_id="s", model=4),
        ("model", "int"),
    ),
    (
        "metadata-list",
        lambda e: e.index.add_document("t", ["not", "a", "dict"]),  # type: ignore[arg-type]
        ("metadata", "list"),
    ),
    (
        "metadata-not-json",
        lambda e: e.index.add_document("t", {"lang": "en", "when": TODAY}),
        ("metadata", "'when'", "date"),
    ),
    (
        "tenant-none",
        lambda e: e.index.add_document("t", tenant=None),  # type: ignore[arg-type]
        ("tenant", "None"),
    ),
    (
        "documents-str",
        lambda e: e.index.add_documents("abc"),  # type: ignore[arg-type]
        ("documents", "str"),
    ),
    (
        "documents-not-pairs",
        lambda e: e.index.add_documents(["new text"]),  # type: ignore[list-item]
        ("documents[0]", "(text, metadata)", "str"),
    ),
    (
        "doc-ids-str",
        lambda e: e.index.add_documents([("new text", None)], doc_ids="abc"),
        ("doc_ids", "str"),
    ),
    (
        "batch-size-bool",
        lambda e: e.index.add_documents([("new text", None)], batch_size=True),
        ("batch_size", "True"),
    ),
    ("query-none", lambda e: e.index.search(None), ("query", "NoneType")),  # type: ignore[arg-type]
    ("k-str", lambda e: e.index.search("refunds", k="3"), ("k", "'3'")),  # type: ignore[arg-type]
    ("k-bool", lambda e: e.index.search("refunds", k=True), ("k", "True")),
    (
        "filters-object",
        lambda e: e.index.search("refunds", mode="bm25", filters={"x": object()}),
        ("filters", "'x'", "object"),
    ),
    (
        "filters-list-of-object",
        lambda e: e.index.search("refunds", mode="bm25", filters={"x": ["a", object()]}),
        ("filters", "'x'", "object"),
    ),
    (
        "filters-not-a-mapping",
        lambda e: e.index.search("refunds", mode="bm25", filters=["x"]),  # type: ignore[arg-type]
        ("filters", "list"),
    ),
    (
        "bundle-filters-object",
        lambda e: e.index.search(QueryBundle(query_str="refunds", filters={"x": object()})),
        ("filters", "'x'", "object"),
    ),
    (
        "tenants-int",
        lambda e: e.index.search("refunds", tenants=5),  # type: ignore[arg-type]
        ("tenants", "int"),
    ),
    (
        "search-documents-query-none",
        lambda e: e.index.search_documents(None),  # type: ignore[arg-type]
        ("query", "NoneType"),
    ),
    (
        "search-documents-k-str",
        lambda e: e.index.search_documents("refunds", k="3"),  # type: ignore[arg-type]
        ("k", "'3'"),
    ),
    (
        "pipeline-formatter-str",
        lambda e: ContextPipeline(formatter="openai").build("q"),  # type: ignore[arg-type]
        ("formatter", "'openai'"),
    ),
    (
        "pipeline-add-one-item",
        lambda e: e.pipeline.add_items(ITEM),  # type: ignore[arg-type]
        ("items", "ContextItem"),
    ),
    (
        "pipeline-add-items-with-a-str",
        lambda e: e.pipeline.add_items([ITEM, "a str"]),  # type: ignore[list-item]
        ("items[1]", "str"),
    ),
    ("counter-for-model-none", lambda e: counter_for_model(None), ("model", "None")),  # type: ignore[arg-type]
    (
        "pipeline-model-int",
        lambda e: ContextPipeline(model=4),  # type: ignore[arg-type]
        ("model", "int"),
    ),
]


@pytest.mark.parametrize(("call", "words"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_argument_is_a_config_error_naming_it(
    env: Env, call: Callable[[Env], Any], words: tuple[str, ...]
) -> None:
    before = env.state()
    with pytest.raises(ConfigError) as caught:
        call(env)
    message = str(caught.value)
    for word in words:
        assert word in message, f"{word!r} not in {message!r}"
    assert env.state() == before  # nothing stored, nothing kept


def test_the_documented_forms_still_pass(env: Env) -> None:
    # None for the default history, budget and model; a tuple history; one tenant as a str;
    # list, int, bool and None filter values; k=0 answers nothing.
    ctx = env.engine.on_message_inbound(
        "boiler?", (USER,), session_id="s", budget=500, protected=0, model=None
    )
    assert ctx.budget.budget == 500
    index = env.index
    index.add_document("Shipping takes two days.", {"lang": "de", "n": 3, "ok": True})
    assert index.search("shipping", mode="bm25", tenants="default", filters={"lang": ["en", "de"]})
    assert index.search("shipping", mode="bm25", filters={"n": 3, "ok": True, "gone": None}) == []
    assert index.search("shipping", k=0) == []
    timestamps = [datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC)]
    env.engine.on_turn_complete([{"role": "user", "content": "new"}], timestamps=timestamps)


# -- a closed DocumentIndex -------------------------------------------------------------------

CLOSED_CALLS: dict[str, Callable[[DocumentIndex], Any]] = {
    "search": lambda i: i.search("refunds", mode="bm25"),
    "search_documents": lambda i: i.search_documents("refunds", mode="bm25"),
    "retrieve": lambda i: i.retrieve("refunds"),
    "add": lambda i: i.add("new doc after close"),
    "add_document": lambda i: i.add_document("new doc after close"),
    "add_documents": lambda i: i.add_documents([("new doc after close", None)]),
    "remove_document": lambda i: i.remove_document("x"),
    "clear": lambda i: i.clear(),
    "save": lambda i: i.save(),
    "len": len,
    "version": lambda i: i.version,
}


@pytest.mark.parametrize("where", ["memory", "file"])
@pytest.mark.parametrize("name", list(CLOSED_CALLS))
def test_a_closed_index_says_so(tmp_path: Path, where: str, name: str) -> None:
    index = DocumentIndex(None if where == "memory" else tmp_path / "d.db", embedder=False)
    index.add_document("Refunds take fourteen days.")
    index.close()
    with pytest.raises(StoreError, match="the document index is closed"):
        CLOSED_CALLS[name](index)
    index.close()  # closing again is harmless


def test_the_index_is_a_context_manager(tmp_path: Path) -> None:
    path = tmp_path / "d.db"
    with DocumentIndex(path, embedder=False) as index:
        assert isinstance(index, DocumentIndex)
        index.add_document("Refunds take fourteen days.")
        assert index.search("refunds", mode="bm25")
    with pytest.raises(StoreError, match="the document index is closed"):
        index.search("refunds", mode="bm25")
    with pytest.raises(RuntimeError), DocumentIndex(path, embedder=False) as again:
        assert len(again) == 1
        raise RuntimeError("boom")
    with pytest.raises(StoreError, match="the document index is closed"):
        len(again)
