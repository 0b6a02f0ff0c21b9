"""The LlamaIndex adapters against the real llama-index-core: a ``RetrieverQueryEngine``
retrieving through a ``DocumentIndex``, and a ``SimpleChatEngine`` whose memory is a
``MemoryEngine`` session (turns stored, an early fact recalled, tool pairs intact). The LLM is
LlamaIndex's own ``MockLLM``, which answers with the prompt it was given."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from llama_index.core import Settings
from llama_index.core.base.llms.types import ChatMessage, MessageRole, ToolCallBlock
from llama_index.core.chat_engine import SimpleChatEngine
from llama_index.core.llms import MockLLM
from llama_index.core.memory import ChatMemoryBuffer
from llama_index.core.query_engine import RetrieverQueryEngine

from contextfold.errors import ConfigError
from contextfold.integrations.llamaindex import (
    ContextfoldMemory,
    ContextfoldRetriever,
    offline_tokenizer,
)
from contextfold.memory.engine import MemoryEngine
from contextfold.retrieval.index import DocumentIndex
from contextfold.store.sqlite.memory import MemoryStore
from contextfold.testing import HashEmbedder

DOCS = [
    "Refunds are processed within 14 days of the request by the billing team.",
    "The office kitchen is cleaned every Friday afternoon.",
    "Passwords must be rotated every 90 days and never shared.",
]


@pytest.fixture(autouse=True)
def offline_settings() -> Iterator[None]:
    """LlamaIndex's default tokenizer downloads cl100k_base; the offline one reads the file
    contextfold ships."""
    before = Settings._tokenizer
    Settings.tokenizer = offline_tokenizer()
    yield
    Settings._tokenizer = before


def test_offline_tokenizer_is_cl100k() -> None:
    from contextfold.tokens import TiktokenCounter

    text = "Refunds are processed within 14 days."
    assert len(offline_tokenizer()(text)) == TiktokenCounter("cl100k_base").count(text)


def test_query_engine_retrieves_through_a_document_index() -> None:
    index = DocumentIndex(embedder=HashEmbedder())
    ids = [index.add_document(text).doc_id for text in DOCS]
    retriever = ContextfoldRetriever(index, k=1)

    nodes = retriever.retrieve("how long do refunds take")
    hit = index.search("how long do refunds take", 1)[0]
    assert [(n.node.node_id, n.score) for n in nodes] == [(hit.id, pytest.approx(hit.score))]
    assert nodes[0].node.metadata["doc_id"] == ids[0]

    engine = RetrieverQueryEngine.from_args(retriever, llm=MockLLM())
    response = engine.query("how long do refunds take")
    assert [n.node.node_id for n in response.source_nodes] == [hit.id]
    assert DOCS[0] in str(response)  # MockLLM echoes its prompt: the context reached it
    assert DOCS[2] not in str(response)


def test_retriever_refuses_what_cannot_retrieve() -> None:
    with pytest.raises(ConfigError, match="no retrieve"):
        ContextfoldRetriever(object())


def test_chat_engine_memory_recalls_an_early_fact() -> None:
    engine = MemoryEngine(store=MemoryStore(), embedder=None)
    memory = ContextfoldMemory(engine=engine, session_id="chat", max_tokens=150)
    chat = SimpleChatEngine.from_defaults(llm=MockLLM(max_tokens=5), memory=memory)
    turns = [
        "Remember this: the Henninger filing deadline is March 3 at the county court.",
        "Let us talk about the kitchen renovation and the new oak cabinets we ordered.",
        "The tiles for the backsplash should be white subway tiles with grey grout lines.",
        "My dog Biscuit has a chicken allergy so we switched her food to a salmon recipe.",
        "The database at work keeps timing out on the nightly reporting job again.",
    ]
    for text in turns:
        chat.chat(text)
    stored = engine.store.turns("chat")
    assert [t.message.text() for t in stored if t.message.role == "user"] == turns
    assert len(stored) == 2 * len(turns)

    chat.chat("When is the Henninger filing deadline?")
    prompt = memory.get()
    assert prompt[0].role is MessageRole.SYSTEM
    assert "March 3" in str(prompt[0].content)  # recalled …
    assert not any("Henninger filing deadline is" in str(m.content) for m in prompt[1:])
    assert len(memory.get_all()) == 2 * (len(turns) + 1)  # … though it left the history

    memory.reset()
    assert memory.get_all() == []


def test_memory_stores_a_tool_call_with_its_result() -> None:
    engine = MemoryEngine(store=MemoryStore(), embedder=None)
    memory = ContextfoldMemory.from_defaults(engine=engine, session_id="tools")
    memory.put(ChatMessage(role=MessageRole.USER, content="Weather in Oslo?"))
    memory.put(
        ChatMessage(
            role=MessageRole.ASSISTANT,
            blocks=[ToolCallBlock(tool_call_id="c1", tool_name="weather", tool_kwargs={"c": 1})],
        )
    )
    assert len(engine.store.turns("tools")) == 1  # the call waits for its result
    memory.put(
        ChatMessage(role=MessageRole.TOOL, content="4°C", additional_kwargs={"tool_call_id": "c1"})
    )
    turns = engine.store.turns("tools")
    assert [t.message.role for t in turns] == ["user", "assistant", "tool"]
    assert turns[1].message.tool_use_ids == ("c1",)
    assert turns[2].message.tool_result_ids == ("c1",)
    back = memory.get_all()
    calls = [b for b in back[1].blocks if isinstance(b, ToolCallBlock)]
    assert [(c.tool_call_id, c.tool_name, c.tool_kwargs) for c in calls] == [
        ("c1", "weather", {"c": 1})
    ]
    assert back[2].additional_kwargs["tool_call_id"] == "c1"
    with pytest.raises(ConfigError, match="tool_call_id"):
        memory.put(ChatMessage(role=MessageRole.TOOL, content="orphan"))


QUESTION = (
    "I am preparing the court bundle and need to plan the week around it, so tell me: "
    "when is the Henninger filing deadline, and at which court do we file it?"
)


def test_a_question_longer_than_max_tokens_is_kept_and_recalls_memory() -> None:
    """The newest user message alone is over ``max_tokens``: it is still sent (as LlamaIndex's
    own ``ChatMemoryBuffer`` sends it) and it is the recall query."""
    engine = MemoryEngine(store=MemoryStore(), embedder=None)
    memory = ContextfoldMemory(engine=engine, session_id="long", max_tokens=30)
    assert len(offline_tokenizer()(QUESTION)) > 30
    chat = SimpleChatEngine.from_defaults(llm=MockLLM(), memory=memory)  # echoes its prompt
    chat.chat("The Henninger filing deadline is March 3 at the county court.")

    prompt = str(chat.chat(QUESTION))
    assert f"user: {QUESTION}" in prompt  # the question reached the model …
    assert "March 3" in prompt  # … with the memory recalled for it

    got = memory.get()  # the exchange just stored (question and answer) is over max_tokens
    assert [m.role for m in got] == [MessageRole.SYSTEM, MessageRole.USER, MessageRole.ASSISTANT]
    assert "March 3" in str(got[0].content)
    assert got[1].content == QUESTION

    buffer = ChatMemoryBuffer.from_defaults(token_limit=30)
    buffer_chat = SimpleChatEngine.from_defaults(llm=MockLLM(), memory=buffer)
    buffer_chat.chat("The Henninger filing deadline is March 3 at the county court.")
    assert f"user: {QUESTION}" in str(buffer_chat.chat(QUESTION))  # what LlamaIndex does


def test_the_newest_exchange_over_max_tokens_keeps_its_tool_traffic() -> None:
    engine = MemoryEngine(store=MemoryStore(), embedder=None)
    memory = ContextfoldMemory(engine=engine, session_id="loop", max_tokens=20)
    memory.put(ChatMessage(role=MessageRole.USER, content="Hi there."))
    memory.put(ChatMessage(role=MessageRole.ASSISTANT, content="Hello."))
    memory.put(ChatMessage(role=MessageRole.USER, content=QUESTION))
    memory.put(
        ChatMessage(
            role=MessageRole.ASSISTANT,
            blocks=[ToolCallBlock(tool_call_id="c1", tool_name="docket", tool_kwargs={})],
        )
    )
    memory.put(
        ChatMessage(
            role=MessageRole.TOOL, content="March 3", additional_kwargs={"tool_call_id": "c1"}
        )
    )
    got = [m for m in memory.get() if m.role is not MessageRole.SYSTEM]
    assert [m.role for m in got] == [MessageRole.USER, MessageRole.ASSISTANT, MessageRole.TOOL]
    assert got[0].content == QUESTION
    assert got[2].additional_kwargs["tool_call_id"] == "c1"
