"""Does every exchange the proxy acknowledged survive SIGTERM and kill -9?

Measured from the outside only, so it means the same whatever the proxy does inside: the fake
provider (``tests/fake_llm.py``) and ``contextfold proxy`` each run in their own process; this
client talks HTTP, sends signals, reads the proxy's RSS from ``/proc/<pid>/status`` and reads
the store file with plain ``sqlite3``. Every user message ends with a unique nonce that the
fake echoes in its reply. An exchange is *acknowledged* when the client got a complete 200
reply carrying its nonce; it is *stored* when a ``user`` turn and an ``assistant`` turn in
``turns.content_text`` both contain the nonce.

* Load: 50 sessions for 3 minutes, each sending its next request as soon as the last reply
  is in (growing history, JSON and streaming alternating, a new conversation every 20
  turns), so the proxy runs at the highest rate it sustains. Then SIGTERM while requests are
  still in flight, wait for the exit (seconds, exit code), and count acknowledged exchanges
  missing from the store. RSS is sampled every 0.5 s: a growing backlog shows as growing RSS.
* Wide: the same with 200 sessions for 60 s.
* Crash: 50 trials on one store file: start the proxy, run 8 sessions, kill -9 it 0.2-2 s
  into the run (uniform, seeded), then count acknowledged exchanges missing and run
  ``PRAGMA integrity_check``; restart the proxy, let it settle, stop it with SIGTERM and check
  that in every session that has compacted (``sessions.compaction_watermark > 0``) each tag
  of its segments has a ``tag_summaries`` row. The memory config has a 512-token
  ``context_window`` and two protected recent turns, so sessions compact within seconds.

Bars (reported, never fatal): 0 missing after SIGTERM, a clean exit (code 0, no kill), 0
missing after kill -9, integrity ``ok`` every time, 0 inconsistent sessions.

Run: ``python benchmarks/bench_durability.py`` (about 10 minutes; ``--quick`` for the smoke
test; ``--load-seconds``, ``--wide-seconds``, ``--crash-trials`` … for a medium run).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _common as common
import _servers as servers

LOG_NEEDLES = ("exchange not stored", "memory write failed", "giving up", "Traceback", "ERROR")

# Compaction within a few turns: 70 % of 512 tokens is about three exchanges of crash text.
CRASH_MEMORY = """context_window: 512
compaction:
  protected_recent_turns: 2
"""


@dataclass
class Drive:
    """What the clients saw."""

    acknowledged: set[str] = field(default_factory=set)  # nonces of complete 200 replies
    requests: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    errors_before_stop: servers.Tally = field(default_factory=servers.Tally)
    errors_after_stop: servers.Tally = field(default_factory=servers.Tally)
    no_echo: int = 0  # complete 200 replies without their nonce (the harness is wrong)
    sessions: set[str] = field(default_factory=set)
    seconds: float = 0.0


async def drive(
    url: str,
    sessions: int,
    max_turns: int,
    label: str,
    stopper: Callable[[], None],
    after: float,
    *,
    long_text: bool = False,
) -> Drive:
    """``sessions`` clients sending back to back; ``after`` seconds in, ``stopper()`` runs
    (a signal to the proxy) and the clients send nothing new; requests in flight finish or
    fail."""
    out = Drive()
    stop = asyncio.Event()

    async def session(client: Any, n: int) -> None:
        round_ = 0
        while not stop.is_set():
            history: list[dict[str, Any]] = []
            for t in range(max_turns):
                if stop.is_set():
                    return
                text = servers.user_text(n * 100 + round_, t)
                if long_text:
                    text += " " + " ".join(servers.user_text(n + k, t + k) for k in (1, 2, 3))
                nonce, message = servers.nonce_message(f"{label}-{n}-{round_}-{t}", text)
                history.append({"role": "user", "content": message})
                out.requests += 1
                exchange = await servers.chat(client, url, history, stream=t % 2 == 1)
                if exchange.error or not exchange.complete:
                    tally = out.errors_after_stop if stop.is_set() else out.errors_before_stop
                    tally.add(exchange.error or "incomplete reply", exchange.reply)
                    return
                out.latencies_ms.append(exchange.seconds * 1000)
                if exchange.session:
                    out.sessions.add(exchange.session)
                if nonce in exchange.text:
                    out.acknowledged.add(nonce)
                else:
                    out.no_echo += 1
                history.append({"role": "assistant", "content": exchange.reply})
            round_ += 1

    async def timer() -> None:
        await asyncio.sleep(after)
        stopper()
        stop.set()

    start = time.perf_counter()
    async with servers.client_session(sessions + 10) as client:
        await asyncio.gather(timer(), *(session(client, n) for n in range(sessions)))
    out.seconds = time.perf_counter() - start
    return out


async def warm_up(url: str, label: str) -> set[str]:
    """One exchange before the clock starts (the proxy's first request loads its tokenizer);
    its nonce, which counts as acknowledged like any other."""
    async with servers.client_session(2) as client:
        nonce, message = servers.nonce_message(f"{label}-warm", "Warming up.")
        exchange = await servers.chat(client, url, [{"role": "user", "content": message}], False)
    return {nonce} if exchange.status == 200 and nonce in exchange.text else set()


def _drive_summary(d: Drive, seconds: float) -> dict[str, Any]:
    return {
        "requests": d.requests,
        "requests_per_s": round(len(d.latencies_ms) / seconds, 1),
        "acknowledged": len(d.acknowledged),
        "conversations": len(d.sessions),
        "latency_ms": {
            "p50": round(common.percentile(d.latencies_ms, 50), 2),
            "p99": round(common.percentile(d.latencies_ms, 99), 2),
        },
        "errors_before_stop": d.errors_before_stop.total,
        "errors_after_stop": d.errors_after_stop.total,
        "error_samples": d.errors_before_stop.samples + d.errors_after_stop.samples,
        "replies_without_nonce": d.no_echo,
    }


def _rss(samples: list[tuple[float, float]], term_at: float) -> dict[str, Any]:
    during = [mb for t, mb in samples if t <= term_at] or [0.0]
    exiting = [mb for t, mb in samples if t > term_at]
    step = max(1, len(samples) // 40)
    return {
        "start": during[0],
        "max": max(during),
        "end": during[-1],
        "max_while_exiting": max(exiting) if exiting else None,
        "timeline": samples[::step],
    }


def load_part(
    upstream: str, folder: Path, label: str, sessions: int, seconds: float, args: Any
) -> dict[str, Any]:
    store = folder / f"{label}.db"
    config = servers.write_memory_config(
        folder / f"{label}.yaml", store, embedder=args.embedder == "minilm"
    )
    log = folder / f"{label}.log"
    proxy = servers.ContextfoldProxy(upstream, config, folder / "home", log)
    ready_s = proxy.wait_ready()
    sampler = servers.RssSampler(proxy.pid)
    began = time.monotonic()
    d = asyncio.run(drive(proxy.url, sessions, args.max_turns, label, proxy.send_term, seconds))
    code, exit_s, killed = proxy.wait_exit(args.exit_timeout)
    samples = sampler.stop()
    missing = servers.missing_exchanges(store, d.acknowledged)
    print(
        f"{label}: {len(d.acknowledged):,} acknowledged, {missing['missing_exchanges']:,} "
        f"missing after SIGTERM, exit {code} in {exit_s:.1f} s",
        flush=True,
    )
    return {
        "label": label,
        "sessions": sessions,
        "seconds": seconds,
        "startup_s": round(ready_s, 2),
        **_drive_summary(d, seconds),
        **missing,
        "exit_code": code,
        "exit_seconds": exit_s,
        "killed_after_timeout": killed,
        "rss_mb": _rss(samples, proxy.term_at - began),
        "log_lines": servers.log_lines(log, *LOG_NEEDLES),
    }


def integrity(store: Path) -> str:
    conn = servers.open_store(store)
    try:
        return "; ".join(row[0] for row in conn.execute("PRAGMA integrity_check"))
    finally:
        conn.close()


def tag_summary_gaps(store: Path) -> tuple[int, dict[str, list[str]]]:
    """(sessions that compacted, {session: segment tags without a tag summary})."""
    conn = servers.open_store(store)
    try:
        compacted = [
            sid for (sid,) in conn.execute("SELECT id FROM sessions WHERE compaction_watermark > 0")
        ]
        gaps = {}
        for sid in compacted:
            tags = {
                tag
                for (raw,) in conn.execute("SELECT tags FROM segments WHERE session_id = ?", (sid,))
                for tag in json.loads(raw)
            }
            rows = conn.execute("SELECT tag FROM tag_summaries WHERE session_id = ?", (sid,))
            have = {t for (t,) in rows}
            if tags - have:
                gaps[sid] = sorted(tags - have)
    finally:
        conn.close()
    return len(compacted), gaps


def crash_part(upstream: str, folder: Path, args: Any) -> dict[str, Any]:
    store = folder / "crash.db"
    config = servers.write_memory_config(
        folder / "crash.yaml", store, embedder=args.embedder == "minilm", extra=CRASH_MEMORY
    )
    log = folder / "crash.log"
    rng = random.Random(args.seed)
    trials = []
    for i in range(args.crash_trials):
        proxy = servers.ContextfoldProxy(upstream, config, folder / "home", log)
        proxy.wait_ready()
        warm = asyncio.run(warm_up(proxy.url, f"crash{i}"))
        after = round(rng.uniform(0.2, 2.0), 3)
        d = asyncio.run(
            drive(
                proxy.url,
                args.crash_sessions,
                args.max_turns,
                f"crash{i}",
                proxy.process.kill,
                after,
                long_text=True,
            )
        )
        kill_code = proxy.process.wait(10)
        d.acknowledged |= warm
        missing = servers.missing_exchanges(store, d.acknowledged)
        check = integrity(store)
        restart = servers.ContextfoldProxy(upstream, config, folder / "home", log)
        restart.wait_ready()
        time.sleep(args.settle)
        code, exit_s, killed = restart.terminate(args.exit_timeout)
        compacted, gaps = tag_summary_gaps(store)
        after_restart = servers.missing_exchanges(store, d.acknowledged)
        trials.append(
            {
                "trial": i,
                "kill_after_s": after,
                "kill_exit_code": kill_code,
                "requests": d.requests,
                "acknowledged": len(d.acknowledged),
                "replies_without_nonce": d.no_echo,
                "errors_before_kill": d.errors_before_stop.total,
                **missing,
                "missing_after_restart": after_restart["missing_exchanges"],
                "integrity_check": check,
                "restart_exit_code": code,
                "restart_exit_seconds": exit_s,
                "restart_killed_after_timeout": killed,
                "compacted_sessions_in_store": compacted,
                "inconsistent_sessions_in_store": len(gaps),
                "gap_samples": dict(list(gaps.items())[:3]),
            }
        )
        print(
            f"crash {i}: killed at {after:.2f} s, {len(d.acknowledged)} acknowledged, "
            f"{missing['missing_exchanges']} missing, integrity {check}, "
            f"{len(gaps)}/{compacted} compacted sessions inconsistent",
            flush=True,
        )
    last = trials[-1] if trials else {}
    return {
        "trials": len(trials),
        "sessions_per_trial": args.crash_sessions,
        "kill_window_s": [0.2, 2.0],
        "settle_s": args.settle,
        "seed": args.seed,
        "acknowledged": sum(t["acknowledged"] for t in trials),
        "missing_exchanges": sum(t["missing_exchanges"] for t in trials),
        "missing_after_restart": sum(t["missing_after_restart"] for t in trials),
        "trials_with_missing": sum(1 for t in trials if t["missing_exchanges"]),
        "integrity_failures": sum(1 for t in trials if t["integrity_check"] != "ok"),
        "compacted_sessions": last.get("compacted_sessions_in_store", 0),
        "inconsistent_sessions": last.get("inconsistent_sessions_in_store", 0),
        "restart_exit_codes": sorted({t["restart_exit_code"] for t in trials}, key=str),
        "log_lines": servers.log_lines(log, *LOG_NEEDLES),
        "trial_details": trials,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common.common_arguments(parser)
    parser.add_argument("--load-sessions", type=int, default=50)
    parser.add_argument("--load-seconds", type=float, default=180.0)
    parser.add_argument("--wide-sessions", type=int, default=200)
    parser.add_argument("--wide-seconds", type=float, default=60.0)
    parser.add_argument("--crash-trials", type=int, default=50)
    parser.add_argument("--crash-sessions", type=int, default=8)
    parser.add_argument("--max-turns", type=int, default=20, help="turns per conversation")
    parser.add_argument(
        "--settle", type=float, default=0.5, help="seconds the restarted proxy runs"
    )
    parser.add_argument(
        "--exit-timeout", type=float, default=300.0, help="SIGTERM, then SIGKILL after this"
    )
    parser.add_argument("--embedder", choices=("none", "minilm"), default="none")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--parts", default="load,wide,crash", help="comma-separated: load, wide, crash"
    )
    args = parser.parse_args()
    if args.quick:
        args.load_seconds, args.wide_seconds, args.crash_trials = 10.0, 5.0, 3
        args.settle, args.exit_timeout = 0.2, 60.0
    parts = {p.strip() for p in args.parts.split(",") if p.strip()}
    result = common.base_result(
        "durability",
        "Acknowledged exchanges missing from the store after SIGTERM under load "
        f"({args.load_sessions} and {args.wide_sessions} sessions) and after kill -9 "
        f"({args.crash_trials} trials), store integrity, tag-summary consistency and the "
        "proxy's RSS, all measured from outside the proxy.",
        args.quick,
    )
    result["parameters"] = {
        "parts": sorted(parts),
        "load_sessions": args.load_sessions,
        "load_seconds": args.load_seconds,
        "wide_sessions": args.wide_sessions,
        "wide_seconds": args.wide_seconds,
        "crash_trials": args.crash_trials,
        "crash_sessions": args.crash_sessions,
        "max_turns_per_conversation": args.max_turns,
        "settle_s": args.settle,
        "exit_timeout_s": args.exit_timeout,
        "embedder": args.embedder,
        "crash_memory_config": CRASH_MEMORY.strip().replace("\n", "; "),
        "upstream": "tests/fake_llm.py in its own process (OpenAI wire format)",
        "proxy": "`python -m contextfold proxy` in its own process, store in a SQLite file",
    }
    folder = Path(tempfile.mkdtemp(prefix="cf-bench-durability-"))
    fake, upstream = servers.start_fake()
    configs, crash = [], None
    part_seconds: dict[str, float] = {}
    try:
        clock = time.monotonic()
        if "load" in parts:
            configs.append(
                load_part(upstream, folder, "load", args.load_sessions, args.load_seconds, args)
            )
            part_seconds["load"], clock = round(time.monotonic() - clock, 1), time.monotonic()
        if "wide" in parts:
            configs.append(
                load_part(upstream, folder, "wide", args.wide_sessions, args.wide_seconds, args)
            )
            part_seconds["wide"], clock = round(time.monotonic() - clock, 1), time.monotonic()
        if "crash" in parts:
            crash = crash_part(upstream, folder, args)
            part_seconds["crash"] = round(time.monotonic() - clock, 1)
    finally:
        servers.stop(fake)
    result["configs"] = configs
    result["part_seconds"] = part_seconds
    result["crash"] = crash
    met: dict[str, bool] = {}
    for c in configs:
        met[f"{c['label']}: no missing after SIGTERM"] = c["missing_exchanges"] == 0
        met[f"{c['label']}: clean exit"] = c["exit_code"] == 0 and not c["killed_after_timeout"]
    if crash is not None:
        met["crash: no missing after kill -9"] = crash["missing_exchanges"] == 0
        met["crash: integrity ok"] = crash["integrity_failures"] == 0
        met["crash: tag summaries consistent"] = crash["inconsistent_sessions"] == 0
    result["goals"] = {"met": met}
    # The harness's own checks (not the proxy's bars): replies echo their nonce, and each part
    # acknowledged something to check.
    acknowledged = [c["acknowledged"] for c in configs]
    if crash is not None:
        acknowledged.append(crash["acknowledged"])
    no_echo = sum(c["replies_without_nonce"] for c in configs) + sum(
        t["replies_without_nonce"] for t in (crash or {}).get("trial_details", [])
    )
    result["correctness"] = {
        "replies_echo_their_nonce": no_echo == 0,
        "every_part_acknowledged_exchanges": all(n > 0 for n in acknowledged),
    }
    result["machine"]["load_avg_1m_at_end"] = round(os.getloadavg()[0], 2)
    result["peak_rss_mb"] = common.peak_rss_mb()
    result["work_dir"] = str(folder)
    path = common.write_result(result, args.results_dir, args.results_md)
    shown = {
        "configs": [{k: v for k, v in c.items() if k != "rss_mb"} for c in configs],
        "rss_mb": [{k: v for k, v in c["rss_mb"].items() if k != "timeline"} for c in configs],
        "crash": {k: v for k, v in (crash or {}).items() if k != "trial_details"},
        "goals": result["goals"],
    }
    print(json.dumps(shown, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
