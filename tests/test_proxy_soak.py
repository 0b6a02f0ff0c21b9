"""Bounded memory (issue 21): per-session state is an LRU rebuilt from the store, records keep
previews, the memos keep within their bytes, and a soak through the real app (many big
distinct requests, many sessions) leaves the process's resident memory within a bound."""

from __future__ import annotations

import gc
import random
import string
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from contextfold.server.config import ContextApiSettings, ProxySettings, ServerConfig
from contextfold.server.proxy import fit, record, wire
from fake_llm import FakeLLMServer
from proxy_support import Served, make_engine, serve

MB = 1024 * 1024


@pytest.fixture
def proxy(fake_llm: FakeLLMServer, tmp_path: Path) -> Iterator[Served]:
    with make_engine(tmp_path, cached_sessions=50) as memory:
        # The relevance floor off: the made-up words of the /api/context queries below must
        # still reach the big nodes, so that the answers (and their records) are big.
        config = ServerConfig(
            port=0,
            proxy=ProxySettings(upstream=fake_llm.url),
            context_api=ContextApiSettings(relevance_floor=False),
        )
        with serve(config, memory) as served:
            yield served


def _words(rng: random.Random, size: int) -> str:
    """``size`` characters of made-up words, different for every seed."""
    letters = string.ascii_lowercase
    words = ["".join(rng.choices(letters, k=rng.randint(3, 9))) for _ in range(2000)]
    out: list[str] = []
    length = 0
    while length < size:
        word = rng.choice(words)
        out.append(word)
        length += len(word) + 1
    return " ".join(out)[:size]


def _rss() -> int:
    gc.collect()
    with Path("/proc/self/status").open(encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


# --------------------------------------------------------------------------- per-session state


def test_per_session_state_is_bounded_and_an_evicted_session_still_recalls(
    tmp_path: Path,
) -> None:
    with make_engine(tmp_path, cached_sessions=3) as memory:
        memory.on_turn_complete(
            [
                {"role": "user", "content": "My locker combination is 4417, remember it."},
                {"role": "assistant", "content": "Noted: locker combination 4417."},
            ],
            session_id="first",
        )
        for n in range(12):
            sid = f"other-{n}"
            memory.on_turn_complete(
                [
                    {"role": "user", "content": f"Plan the garden bed number {n}."},
                    {"role": "assistant", "content": "Tomatoes by the fence."},
                ],
                session_id=sid,
            )
            memory.on_message_inbound("What about the garden?", session_id=sid)
        cached = {
            "vocabulary": len(memory._vocab),
            "topics": len(memory.assembler._topic_cache),
            "summaries": len(memory.assembler._summary_cache),
            "compacted counts": len(memory.assembler._compacted_cache),
            "turn keys": len(memory._turn_keys._sessions),
        }
        assert max(cached.values()) <= 3, cached
        assert "first" not in memory._vocab  # evicted long ago
        recalled = memory.on_message_inbound("What is my locker combination?", session_id="first")
        assert "4417" in recalled.prepend_text
        assert memory.vocabulary(session_id="first")  # read back from the store


# --------------------------------------------------------------------------- records and memos


def test_records_keep_previews_and_the_memos_stay_within_their_bytes(proxy: Served) -> None:
    rng = random.Random(7)
    with httpx.Client(base_url=proxy.url, timeout=120) as client:
        for n in range(4):
            node = {
                "tenant_id": "t",
                "node_type": "faq",
                "title": f"garden plan {n}",
                "content": {"text": _words(rng, 400_000)},
            }
            assert client.post("/api/nodes", json=node).status_code == 201
        for n in range(12):
            body = {"query": f"garden plan {n} " + _words(rng, 19_000), "tenant_ids": ["t"]}
            answer = client.post("/api/context", json=body)
            assert answer.status_code == 200 and len(answer.content) > 400_000
        for n in range(8):
            text = f"message {n} " + _words(rng, 1_000_000)
            body = {"model": "m", "messages": [{"role": "user", "content": text}]}
            assert client.post("/v1/chat/completions", json=body).status_code == 200
        proxy.drain()
        records = client.get("/dashboard/api/records")
    assert records.status_code == 200 and len(records.json()) >= 20
    assert len(records.content) < 2 * MB, len(records.content)
    for memo in (wire._MESSAGES, wire._STRIPPED, fit._COUNTS, record._SEEN):
        assert memo.bytes <= memo.max_bytes and len(memo) <= memo.entries
    assert proxy.events.bytes <= proxy.events.max_bytes


# --------------------------------------------------------------------------- soak


def test_a_soak_of_big_requests_and_many_sessions_keeps_memory_bounded(proxy: Served) -> None:
    """40 distinct 512 KB requests and 400 short conversations: the process's resident memory
    grows by less than 150 MB (the proxy's memos, records and per-session state are bounded;
    before, each big request's text stayed in several caches)."""
    rng = random.Random(21)
    with httpx.Client(base_url=proxy.url, timeout=120) as client:
        warm = {"model": "m", "messages": [{"role": "user", "content": "warm up"}]}
        assert client.post("/v1/chat/completions", json=warm).status_code == 200
        proxy.drain()
        before = _rss()
        for n in range(40):
            text = f"big request {n} " + _words(rng, MB // 2)
            body = {"model": "m", "messages": [{"role": "user", "content": text}]}
            assert client.post("/v1/chat/completions", json=body).status_code == 200
        for n in range(400):
            body = {
                "model": "m",
                "messages": [{"role": "user", "content": f"conversation {n}: {_words(rng, 200)}"}],
            }
            assert client.post("/v1/chat/completions", json=body).status_code == 200
        proxy.drain()
        grown = _rss() - before
    print(f"soak: resident memory grew by {grown / MB:.0f} MB")
    assert grown < 150 * MB, f"resident memory grew by {grown / MB:.0f} MB"
