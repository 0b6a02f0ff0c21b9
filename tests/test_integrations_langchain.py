"""The LangChain adapters against the real langchain-core: retrievers in an LCEL chain (over a
``DocumentIndex`` and over a real server's ``POST /api/context``), a chat history backed by
``MemoryEngine`` under ``RunnableWithMessageHistory`` (turns stored, an early fact recalled
after it left the history, tool pairs intact), and ``trim_messages``."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.messages import trim_messages as lc_trim_messages
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompt_values import ChatPromptValue
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from langchain_core.runnables import RunnableLambda, RunnablePassthrough

from contextfold.client import APIError
from contextfold.errors import ConfigError
from contextfold.integrations.langchain import (
    ContextApiRetriever,
    ContextfoldChatHistory,
    ContextfoldRetriever,
    from_langchain,
    recall_memory,
    token_counter,
    trim_messages,
)
from contextfold.memory.engine import MemoryEngine
from contextfold.retrieval.index import DocumentIndex
from contextfold.server.app import create_app
from contextfold.server.config import ContextApiSettings, ServerConfig
from contextfold.store.sqlite.memory import MemoryStore
from contextfold.testing import HashEmbedder
from contextfold.tokens import OVERHEADS, TiktokenCounter, count_messages
from live_app import LiveServer

DOCS = [
    "Refunds are processed within 14 days of the request by the billing team.",
    "The office kitchen is cleaned every Friday afternoon.",
    "Passwords must be rotated every 90 days and never shared.",
]


def _echo_model(seen: list[Any]) -> RunnableLambda[Any, AIMessage]:
    """The model end of a chain: records the prompt it got and answers with a fixed line."""

    def answer(prompt: ChatPromptValue) -> AIMessage:
        seen.append(prompt)
        return AIMessage(content=f"answer {len(seen)}")

    return RunnableLambda(answer)


def test_document_index_retriever_in_an_lcel_chain() -> None:
    index = DocumentIndex(embedder=HashEmbedder())
    ids = [index.add_document(text, {"title": f"doc {n}"}).doc_id for n, text in enumerate(DOCS)]
    retriever = ContextfoldRetriever(retriever=index, k=2)

    docs = retriever.invoke("how long do refunds take")
    expected = index.search("how long do refunds take", 2)
    assert [d.id for d in docs] == [h.id for h in expected]
    assert docs[0].page_content == DOCS[0]
    assert docs[0].metadata["doc_id"] == ids[0]
    assert docs[0].metadata["title"] == "doc 0"
    assert docs[0].metadata["score"] == pytest.approx(expected[0].score)

    seen: list[Any] = []
    prompt = ChatPromptTemplate.from_messages(
        [("system", "Answer from:\n{context}"), ("human", "{question}")]
    )
    chain = (
        {
            "context": retriever | (lambda ds: "\n".join(d.page_content for d in ds)),
            "question": RunnablePassthrough(),
        }
        | prompt
        | _echo_model(seen)
        | StrOutputParser()
    )
    assert chain.invoke("how long do refunds take") == "answer 1"
    system = seen[0].to_messages()[0].content
    assert system == "Answer from:\n" + "\n".join(d.page_content for d in docs)
    assert all(text not in system for text in DOCS if text not in {d.page_content for d in docs})


def test_retriever_refuses_what_cannot_retrieve() -> None:
    with pytest.raises(ConfigError, match="no retrieve"):
        ContextfoldRetriever(retriever=object())


def _server(home: Path) -> Any:
    settings = ContextApiSettings(graph_path=str(home / "graph.db"), hybrid=False)
    return create_app(
        ServerConfig(context_api=settings), memory=MemoryEngine(store=":memory:", embedder=None)
    )


def test_context_api_retriever_against_a_real_server(tmp_path: Path) -> None:
    with LiveServer(_server(tmp_path)) as server:
        for n, text in enumerate(DOCS):
            added = httpx.post(
                server.url + "/api/documents",
                json={"tenant_id": "support", "title": f"doc {n}", "text": text},
            )
            assert added.status_code == 201, added.text
        direct = httpx.post(
            server.url + "/api/context",
            json={"query": "refund request", "tenant_ids": ["support"]},
        ).json()
        retriever = ContextApiRetriever(url=server.url, tenant_ids=["support"])
        docs = retriever.invoke("refund request")
        async_docs = asyncio.run(retriever.ainvoke("refund request"))

        expected = [f"graph-node:{n['id']}" for n in direct["entry_points"]]
        assert expected, direct
        assert [d.id for d in docs][: len(expected)] == expected
        assert [d.id for d in async_docs] == [d.id for d in docs]
        assert "Refunds are processed" in docs[0].page_content
        assert docs[0].metadata["section"] == "entry_points"

        bad = ContextApiRetriever(url=server.url, tenant_ids=["not a tenant!"])
        with pytest.raises(APIError, match="422"):
            bad.invoke("refund")


def _engine() -> MemoryEngine:
    return MemoryEngine(store=MemoryStore(), embedder=None)


def test_chat_history_stores_turns_and_recalls_what_left_the_history() -> None:
    engine = _engine()
    seen: list[Any] = []
    prompt = ChatPromptTemplate.from_messages(
        [
            ("system", "You are helpful.\n{memory}"),
            MessagesPlaceholder("history"),
            ("human", "{input}"),
        ]
    )
    history = ContextfoldChatHistory(engine, "s1", max_tokens=120)
    chain = recall_memory(engine, session_id="s1") | prompt | _echo_model(seen)
    turns = [
        "Remember this: the Henninger filing deadline is March 3 at the county court.",
        "Let us talk about the kitchen renovation and the new oak cabinets we ordered.",
        "The tiles for the backsplash should be white subway tiles with grey grout lines.",
        "My dog Biscuit has a chicken allergy so we switched her food to a salmon recipe.",
        "The database at work keeps timing out on the nightly reporting job again.",
        "When is the Henninger filing deadline?",
    ]
    for text in turns:
        reply = chain.invoke({"input": text, "history": history.messages})
        history.add_messages([HumanMessage(text), reply])

    stored = engine.store.turns("s1")
    assert [t.message.text() for t in stored[::2]] == turns  # every human turn, in order
    assert [t.message.role for t in stored] == ["user", "assistant"] * len(turns)

    last = seen[-1].to_messages()
    history_text = " ".join(str(m.content) for m in last[1:-1])
    assert "Henninger" not in history_text  # the first exchange left the 120-token history
    assert "March 3" in str(last[0].content)  # … and memory brought it back
    # Earlier turns' prompts had no reason to recall the filing.
    assert "March 3" not in str(seen[2].to_messages()[0].content)

    history = ContextfoldChatHistory(engine, "s1")  # no budget: every live turn
    assert len(history.messages) == 2 * len(turns)
    history.clear()
    assert history.messages == []


def test_chat_history_keeps_tool_pairs_intact() -> None:
    engine = _engine()
    history = ContextfoldChatHistory(engine, "tools")
    call = {"name": "get_weather", "args": {"city": "Oslo"}, "id": "call_1", "type": "tool_call"}
    sent: list[BaseMessage] = [
        HumanMessage("What is the weather in Oslo?"),
        AIMessage(content="", tool_calls=[call]),
        ToolMessage(content="4°C and snowing", tool_call_id="call_1", name="get_weather"),
        AIMessage(content="It is 4°C and snowing in Oslo."),
    ]
    history.add_messages(sent)
    back = history.messages
    assert [type(m) for m in back] == [type(m) for m in sent]
    assert isinstance(back[1], AIMessage)
    assert back[1].tool_calls == [call]
    assert isinstance(back[2], ToolMessage)
    assert (back[2].tool_call_id, back[2].content, back[2].name) == (
        "call_1",
        "4°C and snowing",
        "get_weather",
    )

    # A budget that cannot hold the whole exchange drops it whole, never half a pair.
    history.add_messages([HumanMessage("thanks"), AIMessage("You are welcome.")])
    for budget in range(10, 200, 5):
        kept = ContextfoldChatHistory(engine, "tools", max_tokens=budget).messages
        calls = {c["id"] for m in kept if isinstance(m, AIMessage) for c in m.tool_calls}
        results = {m.tool_call_id for m in kept if isinstance(m, ToolMessage)}
        assert calls == results, (budget, kept)
        assert not kept or isinstance(kept[0], HumanMessage)


def _tool_conversation() -> list[BaseMessage]:
    out: list[BaseMessage] = [SystemMessage("You answer with tools.")]
    for n in range(6):
        call_id = f"call_{n}"
        out += [
            HumanMessage(f"Question {n}: what is the stock level of item {n}?"),
            AIMessage(
                content="",
                tool_calls=[
                    {"name": "stock", "args": {"item": n}, "id": call_id, "type": "tool_call"}
                ],
            ),
            ToolMessage(content=f"{n * 7} units in the warehouse", tool_call_id=call_id),
            AIMessage(content=f"There are {n * 7} units of item {n}."),
        ]
    return out


def test_token_counter_matches_contextfold_counts() -> None:
    messages = _tool_conversation()
    counter = TiktokenCounter("o200k_base")
    count = token_counter(counter=counter)
    assert count(messages) == count_messages([from_langchain(m) for m in messages], counter)
    # LangChain's own trim_messages takes it as its token_counter.
    kept = lc_trim_messages(messages, max_tokens=100, token_counter=count, strategy="last")
    assert count(kept) <= 100


def test_trim_messages_never_splits_a_tool_pair_and_fits() -> None:
    messages = _tool_conversation()
    counter = TiktokenCounter("o200k_base")
    converted = [from_langchain(m) for m in messages]
    split_by_langchain = 0
    for budget in range(40, 400, 7):
        kept = trim_messages(messages, max_tokens=budget, counter=counter)
        assert all(any(k is m for m in messages) for k in kept)  # the same objects
        request = OVERHEADS["openai"].per_request + count_messages(
            [converted[messages.index(k)] for k in kept], counter
        )
        assert request <= budget
        assert isinstance(kept[0], SystemMessage)
        calls = {c["id"] for m in kept if isinstance(m, AIMessage) for c in m.tool_calls}
        results = {m.tool_call_id for m in kept if isinstance(m, ToolMessage)}
        assert calls == results
        assert len(kept) == 1 or isinstance(kept[1], HumanMessage)
        theirs = lc_trim_messages(
            messages,
            max_tokens=budget,
            token_counter=token_counter(counter=counter),
            include_system=True,
        )
        their_calls = {c["id"] for m in theirs if isinstance(m, AIMessage) for c in m.tool_calls}
        their_results = {m.tool_call_id for m in theirs if isinstance(m, ToolMessage)}
        split_by_langchain += their_calls != their_results
    # The comparison means something: LangChain's default cut splits pairs on some budgets.
    assert split_by_langchain > 0


def test_trim_messages_as_a_runnable_in_a_chain() -> None:
    seen: list[Any] = []
    chain = trim_messages(max_tokens=60) | RunnableLambda(lambda ms: seen.append(ms) or ms)
    out = chain.invoke(_tool_conversation())
    assert out == seen[0]
    assert isinstance(out[0], SystemMessage)
    with pytest.raises(ConfigError, match="list of messages"):
        trim_messages("hello", max_tokens=10)


def test_recall_memory_reads_the_session_from_the_config() -> None:
    engine = _engine()
    engine.on_turn_complete(
        [
            {"role": "user", "content": "The Henninger filing deadline is March 3."},
            {"role": "assistant", "content": "Noted."},
        ],
        session_id="alice",
    )
    recall = recall_memory(engine)
    question = {"input": "When is the Henninger filing deadline?", "history": []}
    mine = recall.invoke(question, {"configurable": {"session_id": "alice"}})
    theirs = recall.invoke(question, {"configurable": {"session_id": "bob"}})
    assert "March 3" in mine["memory"]
    assert theirs["memory"] == ""  # another session's memory is not recalled
    with pytest.raises(ConfigError, match="'input'"):
        recall.invoke({"question": "x"})
