"""MCP server latency over stdio: ``contextfold mcp`` as a subprocess, called by the MCP SDK's
own client, against the same engine call made directly in-process.

Memory is the demo conversation (``examples/conversation.json``, 30 turns, compacted in a
512-token window, no embedder); the corpus is 500 short synthetic documents, BM25 only
(``--no-embed``), so no model loads and the numbers are the protocol and engine cost alone.
For each tool (and a resource read and a prompt) the script times ``calls`` calls after a
warm-up; "direct" is the same library call in this process, so ``mcp − direct`` is what the
JSON-RPC round trip over stdio adds. Startup is spawn-to-initialised, and the first
``tools/list``.

Run: ``python benchmarks/bench_mcp.py`` (``--quick`` for the smoke test).
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from anyio.from_thread import BlockingPortal, start_blocking_portal
from mcp import Client, StdioServerParameters

import _common as common
from contextfold.memory.config import load_config
from contextfold.memory.engine import MemoryEngine
from contextfold.retrieval.engine import ContextComposer, ContextEngine
from contextfold.retrieval.index import DocumentIndex

CONTEXTFOLD = Path(sys.executable).with_name("contextfold")
WORDS = [
    *("refund", "shipping", "invoice", "warranty", "battery", "screen", "account", "password"),
    *("delivery", "order", "return", "exchange", "payment", "card", "subscription", "plan"),
    *("upgrade", "support", "ticket", "email", "phone", "address", "customs", "tracking"),
    *("parcel", "courier", "discount", "coupon", "voucher", "receipt", "tax"),
]


def seed(folder: Path, n_docs: int) -> tuple[Path, Path]:
    config = folder / "contextfold.yaml"
    config.write_text(
        f"context_window: 512\nrecall: {{embedder: none}}\nstorage_path: {folder / 'memory.db'}\n",
        encoding="utf-8",
    )
    conversation = json.loads((common.ROOT / "examples/conversation.json").read_text("utf-8"))
    with MemoryEngine(load_config(config), session_id="bench") as engine:
        engine.on_turn_complete(conversation)
        engine.compact()
    rng = random.Random(7)
    index = DocumentIndex(folder / "documents.db", embedder=False)
    index.add_documents(
        [(" ".join(rng.choices(WORDS, k=40)) + ".", None) for _ in range(n_docs)],
        source="synthetic",
    )
    index.save()
    index.store.close()
    return config, folder / "documents.db"


CALLS: list[tuple[str, str, dict[str, Any]]] = [
    ("domain_status", "tool", {}),
    ("recall_context", "tool", {"message": "What did Marek quote for the kitchen?"}),
    ("find_quote", "tool", {"query": "40% deposit"}),
    ("expand_topic", "tool", {"tag": "kitchen", "depth": "segments"}),
    ("search_documents", "tool", {"query": "refund for a broken screen", "mode": "bm25"}),
    ("get_context", "tool", {"query": "refund for a broken screen", "k": 5}),
    ("contextfold://topics", "resource", {}),
    ("recall", "prompt", {"topic": "kitchen"}),
]


def direct_calls(config: Path, db: Path) -> dict[str, Callable[[], Any]]:
    """The same work in-process, for the overhead comparison (resources and prompts have no
    single library call and are left out)."""
    engine = MemoryEngine(load_config(config), session_id="bench")
    index = DocumentIndex(db, embedder=False)
    composed = ContextEngine(memory=index, composer=ContextComposer(4096, engine.counter))
    return {
        "domain_status": engine.status,
        "recall_context": lambda: engine.on_message_inbound(CALLS[1][2]["message"]),
        "find_quote": lambda: engine.find_quote("40% deposit"),
        "expand_topic": lambda: engine.expand_topic("kitchen", "segments"),
        "search_documents": lambda: index.search(CALLS[4][2]["query"], 5, mode="bm25"),
        # The server's ContextEngine caches by query, as this one does after the first call.
        "get_context": lambda: composed.get_context(CALLS[5][2]["query"], 5),
    }


def timed(fn: Callable[[], Any]) -> common.Timed:
    """Time one call. Unlike ``common.time_call`` no full collection runs before it: with the
    SDK and the engines loaded one takes ~170 ms here, and the heap is frozen instead."""
    cpu = time.process_time()
    start = time.perf_counter()
    value = fn()
    return common.Timed(time.perf_counter() - start, time.process_time() - cpu, value)


def mcp_call(portal: BlockingPortal, client: Client, name: str, kind: str, args: Any) -> bool:
    """One call; ``True`` when it succeeded."""
    if kind == "tool":
        return not portal.call(client.call_tool, name, args).is_error
    if kind == "resource":
        return bool(portal.call(client.read_resource, name).contents)
    return bool(portal.call(client.get_prompt, name, args).messages)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common.common_arguments(parser)
    parser.add_argument("--calls", type=int, default=300, help="timed calls per tool")
    parser.add_argument("--starts", type=int, default=5, help="server starts to time")
    opts = parser.parse_args()
    calls, starts, warmup = (20, 1, 3) if opts.quick else (opts.calls, opts.starts, 20)
    n_docs = 100 if opts.quick else 500
    result = common.base_result("mcp", __doc__.split("\n\n")[0], opts.quick)
    folder = Path(tempfile.mkdtemp(prefix="cf-bench-mcp-"))
    try:
        config, db = seed(folder, n_docs)
        params = StdioServerParameters(
            command=str(CONTEXTFOLD),
            args=[
                *("mcp", "--config", str(config), "--session", "bench"),
                *("--db", str(db), "--no-embed"),
            ],
            env={"CONTEXTFOLD_HOME": str(folder / "home")},
            cwd=str(folder),
        )
        startup, first_list, correct = common.Samples(), common.Samples(), {}
        configs: dict[str, Any] = {}
        gc.collect()
        gc.freeze()  # a collection during a timed call would time this process's heap
        with start_blocking_portal() as portal:
            for _ in range(starts):
                client = Client(params, mode="legacy")
                with portal.wrap_async_context_manager(_Timed(client, startup)):
                    first_list.add(timed(lambda c=client: portal.call(c.list_tools)))
            with portal.wrap_async_context_manager(Client(params, mode="legacy")) as client:
                for name, kind, args in CALLS:
                    for _ in range(warmup):
                        mcp_call(portal, client, name, kind, args)
                    samples = common.Samples()
                    call = functools.partial(mcp_call, portal, client, name, kind, args)
                    oks = [samples.add(timed(call)) for _ in range(calls)]
                    correct[f"{name}_all_succeeded"] = all(oks)
                    configs[name] = {"kind": kind, "arguments": args, "timings": samples.stats()}
        direct_fns = direct_calls(config, db)
        gc.collect()
        gc.freeze()
        for name, fn in direct_fns.items():
            for _ in range(warmup):
                fn()
            samples = common.Samples()
            for _ in range(calls):
                samples.add(timed(fn))
            direct = samples.stats()
            configs[name]["direct_timings"] = direct
            configs[name]["overhead_median_ms"] = round(
                configs[name]["timings"]["median_ms"] - direct["median_ms"], 4
            )
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    result.update(
        {
            "parameters": {
                "calls_per_tool": calls,
                "warmup_calls": warmup,
                "server_starts": starts,
                "memory": "examples/conversation.json (30 turns), compacted, 512-token window",
                "corpus_documents": n_docs,
                "embedder": "none (--no-embed; recall.embedder: none)",
                "transport": "stdio, MCP SDK client, legacy initialize handshake",
            },
            "startup": {"initialize": startup.stats(), "first_tools_list": first_list.stats()},
            "configs": configs,
            "correctness": correct,
            "peak_rss_mb": common.peak_rss_mb(),
        }
    )
    path = common.write_result(result, opts.results_dir, opts.results_md)
    for name, c in configs.items():
        t = c["timings"]
        direct = c.get("direct_timings", {}).get("median_ms")
        print(
            f"{name:22} median {t['median_ms']:7.2f} ms  p95 {t['p95_ms']:7.2f} ms"
            + (f"  direct {direct:7.2f} ms" if direct is not None else "")
        )
    print(f"startup median {result['startup']['initialize']['median_ms']:.0f} ms; wrote {path}")


class _Timed:
    """Enter ``client`` (spawn + initialise) into ``samples``' wall time."""

    def __init__(self, client: Client, samples: common.Samples) -> None:
        self.client, self.samples = client, samples

    async def __aenter__(self) -> Client:
        start = time.perf_counter()
        await self.client.__aenter__()
        self.samples.wall.append(time.perf_counter() - start)
        return self.client

    async def __aexit__(self, *exc: object) -> None:
        await self.client.__aexit__(None, None, None)


if __name__ == "__main__":
    main()
