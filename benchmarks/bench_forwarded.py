"""Memory that never pads the bill: tokens the proxy forwards upstream ÷ tokens the client sent,
over a 100-turn conversation through a real ``contextfold proxy`` process.

Three processes on 127.0.0.1: a fake provider (``tests/fake_llm.py``'s server, its own process)
that appends every request body it receives to a JSON-lines file, the proxy
(``contextfold proxy --upstream <fake>``, memory in its own SQLite file, the default MiniLM
embedder and the default relevance floors) and this client. The conversation is real dialogue:
LoCoMo's first conversation, its first speaker as the user and the second as the model (the
client asks the fake for that reply, ``fake_reply``, a field both pass through unchanged).

Each run is a fresh proxy and store, and 100 user turns:

* **full history**: the client sends its whole history every turn, as chat clients do. Memory
  has nothing to add that the request does not hold; the goal is forwarded ÷ client ≤ 1.10;
* **last 6 messages**: the client trims its history to its last 6 messages; older turns can
  only come from memory, so forwarded ÷ client is what recall costs (reported, no goal);
* **full history, 4k window** (``context_window: 4096``): the same client, with a window small
  enough that the proxy compacts during the conversation: compacted history is left out of the
  request and memory stands in for it.

Tokens are counted with cl100k_base as the OpenAI chat format counts messages
(``contextfold.tokens.count_messages``), for the messages the client sent and for the messages
the fake received. Per run: the totals and their ratio, the per-request ratio (median, p95,
max), the requests that got memory, and the memory tokens the proxy's records name.

Between two messages the client waits until the proxy has finished its derived work (tags,
vectors, compaction: its ``jobs`` table, read from the store file read-only, holds nothing
pending or running), as a person's typing time would let it. Without the wait the result
depends on the machine's load: a fake that answers at once lets the client outrun compaction,
and on a loaded machine a 100-turn run could end before the first compaction.

The proxy's memory deadline (``proxy.memory_deadline_ms``, 50 ms by default: past it a request
goes upstream unmodified) is raised to 10 s here, so that on a loaded machine every request
gets the memory decision the engine makes and the ratio measures that decision, not the load.

Run: ``python benchmarks/bench_forwarded.py`` (``--quick``: 12 turns, the smoke test).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

import _common as common
import _servers as servers
from contextfold.items import Message
from contextfold.tokens import TiktokenCounter, count_messages

TURNS = 100
DEADLINE_MS = 10_000
DERIVE_TIMEOUT_S = 60.0
KEEP = 6
GOAL = 1.10
SYSTEM = {"role": "system", "content": "You are a warm companion who remembers the user's life."}

# The fake answers with the reply the client asks for, and logs every body it receives.
FAKE = """
import json, sys, threading, time
sys.path.insert(0, {tests!r})
from fake_llm import FakeLLMServer
log = open({log!r}, "a", encoding="utf-8")
lock = threading.Lock()
def reply(body):
    with lock:
        log.write(json.dumps(body) + "\\n")
        log.flush()
    return body.get("fake_reply") or "ok"
server = FakeLLMServer(reply=reply).start()
print(server.url, flush=True)
while True:
    time.sleep(1)
    with server._lock:
        server.requests.clear()
"""


def dialogue(data_dir: Path, turns: int) -> list[tuple[str, str]]:
    """``turns`` (user, model) pairs of LoCoMo's first conversation, in order: each first-speaker
    turn with the second speaker's turns that follow it (several in a row joined)."""
    pairs: list[tuple[str, str]] = []
    user: list[str] = []
    model: list[str] = []
    for turn in (t for t in common.locomo_turns(data_dir) if t.conversation == 0):
        if turn.first_speaker:
            if user and model:
                pairs.append((" ".join(user), " ".join(model)))
                user, model = [], []
            user.append(turn.text)
        elif user:
            model.append(turn.text)
        if len(pairs) == turns:
            break
    return pairs


def start_fake(log: Path) -> tuple[subprocess.Popen[str], str]:
    process = subprocess.Popen(
        [sys.executable, "-c", FAKE.format(tests=str(servers.TESTS), log=str(log))],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert process.stdout is not None
    url = process.stdout.readline().strip()
    if not url.startswith("http"):
        raise SystemExit("the fake upstream did not start")
    return process, url


def wait_derived(store: Path, timeout: float = DERIVE_TIMEOUT_S) -> float:
    """Seconds until the proxy's store holds no pending or running job (a failed one stays
    for the record and is not waited on)."""
    started = time.monotonic()
    while True:
        conn = servers.open_store(store)
        try:
            (busy,) = conn.execute(
                "SELECT count(*) FROM jobs WHERE state IN ('pending', 'running')"
            ).fetchone()
        finally:
            conn.close()
        waited = time.monotonic() - started
        if not busy:
            return waited
        if waited > timeout:
            raise SystemExit(f"the proxy's derived work did not finish within {timeout:.0f} s")
        time.sleep(0.02)


def _tokens(messages: list[dict[str, Any]], counter: TiktokenCounter) -> int:
    return count_messages([Message.model_validate(m) for m in messages], counter)


def run(
    label: str, pairs: list[tuple[str, str]], folder: Path, *, keep: int, extra: str = ""
) -> dict[str, Any]:
    """One conversation through a fresh proxy: client and forwarded tokens per request."""
    counter = TiktokenCounter("cl100k_base")
    log = folder / f"{label}.jsonl"
    fake, upstream = start_fake(log)
    store = folder / f"{label}.db"
    memory_yaml = servers.write_memory_config(
        folder / f"{label}.yaml", store, embedder=True, extra=extra
    )
    server_yaml = folder / f"{label}-server.yaml"
    server_yaml.write_text(f"proxy:\n  memory_deadline_ms: {DEADLINE_MS}\n", encoding="utf-8")
    proxy = servers.ContextfoldProxy(
        upstream,
        memory_yaml,
        folder / "home",
        folder / f"{label}.log",
        extra=("--config", str(server_yaml)),
    )
    try:
        proxy.wait_ready(180)
        history: list[dict[str, Any]] = [SYSTEM]
        client_tokens: list[int] = []
        waited = 0.0
        started = time.perf_counter()
        with httpx.Client(timeout=120) as client:
            for user, model in pairs:
                history.append({"role": "user", "content": user})
                sent = [SYSTEM, *history[1:][-keep:]] if keep else list(history)
                body = {"model": "fake", "messages": sent, "fake_reply": model}
                response = client.post(f"{proxy.url}/v1/chat/completions", json=body)
                response.raise_for_status()
                reply = response.json()["choices"][0]["message"]["content"]
                history.append({"role": "assistant", "content": reply})
                client_tokens.append(_tokens(sent, counter))
                waited += wait_derived(store)
        seconds = time.perf_counter() - started
        records = proxy.records()
    finally:
        proxy.terminate(60)
        servers.stop(fake)
    bodies = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]
    if len(bodies) != len(pairs):
        raise SystemExit(f"{label}: the fake saw {len(bodies)} requests for {len(pairs)} sent")
    forwarded = [_tokens(b["messages"], counter) for b in bodies]
    ratios = [f / c for f, c in zip(forwarded, client_tokens, strict=True)]
    memory = [int(r.get("memory_tokens") or 0) for r in records]
    return {
        "label": label,
        "turns": len(pairs),
        "messages_kept": keep or None,
        "client_tokens": sum(client_tokens),
        "forwarded_tokens": sum(forwarded),
        "ratio": round(sum(forwarded) / sum(client_tokens), 4),
        "per_request_ratio": {
            "median": round(common.percentile(ratios, 50), 4),
            "p95": round(common.percentile(ratios, 95), 4),
            "max": round(max(ratios), 4),
        },
        "requests_grown": sum(f > c for f, c in zip(forwarded, client_tokens, strict=True)),
        "requests_shrunk": sum(f < c for f, c in zip(forwarded, client_tokens, strict=True)),
        "memory": servers.memory_share(records),
        "memory_tokens_recorded": sum(memory),
        "memory_deadline_ms": DEADLINE_MS,
        "last_request": {"client": client_tokens[-1], "forwarded": forwarded[-1]},
        "seconds": round(seconds, 1),
        "seconds_waiting_for_derived_work": round(waited, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common.common_arguments(parser)
    args = parser.parse_args(argv)
    data_dir = args.data_dir or common.default_data_dir()
    turns = 12 if args.quick else TURNS
    pairs = dialogue(data_dir, turns)
    if len(pairs) < turns:
        raise SystemExit(f"LoCoMo's first conversation gave {len(pairs)} exchanges, not {turns}")
    result = common.base_result(
        "forwarded",
        "Tokens forwarded upstream ÷ tokens the client sent, over a "
        f"{turns}-turn conversation through a real proxy process (MiniLM on, default floors).",
        args.quick,
    )
    with tempfile.TemporaryDirectory(prefix="cf-forwarded-") as tmp:
        folder = Path(tmp)
        runs = [
            run("full history", pairs, folder, keep=0),
            run(f"last {KEEP} messages", pairs, folder, keep=KEEP),
            run("full history, 4k window", pairs, folder, keep=0, extra="context_window: 4096\n"),
        ]
    result["goal"] = {"full_history_ratio_max": GOAL}
    result["runs"] = runs
    result["goal_met"] = runs[0]["ratio"] <= GOAL and runs[2]["ratio"] <= GOAL
    # ``run`` stops the benchmark when the fake saw another number of requests than were sent.
    result["correctness"] = {"every request reached the upstream": True}
    path = common.write_result(result, args.results_dir, args.results_md)
    for r in runs:
        print(
            f"{r['label']}: client {r['client_tokens']:,} forwarded {r['forwarded_tokens']:,} "
            f"ratio {r['ratio']:.3f} (memory on {r['memory']['with_memory']} requests)"
        )
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
