"""Tool-output compaction on a long agent session: tokens sent, requests kept under the
limit and the window, cache-prefix stability and provider validity, request by request.

**The session.** By default, the one recorded from the real Claude Code
(``benchmarks/data/claude-code-session.jsonl.gz``, made by ``record_agent_session.py``: 400
tool calls the client ran itself over a copy of ``src/``, every request body as the upstream
received it); without it, one recorded now when the pinned Claude Code is installed, else the
synthesized session, and the output says which. ``--synthesized`` (and ``--quick``, 60
calls): an Anthropic Messages conversation of ``--calls`` tool calls (Read, Grep and Bash
outputs) over this repository's real files in the shape Claude Code sends (a system prompt,
the task, per step an assistant ``tool_use`` and a user ``tool_result``, a ``cache_control``
breakpoint on the last block). ``--session FILE``: another recording, or request bodies as
JSON lines. Each request is compacted by ``contextfold.server.proxy.outputs.compact`` with
the limit ``--limit`` and compared with:

* **none**: the request as the agent sent it;
* **clear-old** (what an agent's own tool-result clearing does): every output but the newest
  ``keep_recent`` replaced by a fixed placeholder on every request.

Reported per strategy: total input tokens over the session (o200k, exact counts of the JSON of
each request's parts), the largest and last request, requests over the limit and over the
model's window, and "prefix kept": the share of requests whose messages start with the
previous request's messages unchanged (the provider's prompt cache can then serve everything
before the new turn), also counted between *compaction events* only (a request whose stubbed
outputs differ from the previous request's), and the tokens not served from that cache (each
request pays afresh for everything from its first message that differs from the previous
request's). For contextfold, the compaction ratio request by request (tokens before / after).
Every request sent is checked against the provider's rules
(``contextfold.testing.payload_problem``: every ``tool_use`` answered by its ``tool_result``
in the next message, user first, roles alternating; Claude Code's inline ``system`` messages
passed over).

Run: ``python benchmarks/bench_tool_outputs.py`` (the recorded session; results named
``tool_outputs_recorded``), ``--synthesized`` (``tool_outputs``), ``--quick``.
"""

from __future__ import annotations

import argparse
import copy
import gzip
import itertools
import json
import random
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import _common as common
import record_agent_session as recorder
from contextfold.server.config import OutputSettings
from contextfold.server.proxy.outputs import compact, window_of
from contextfold.testing import payload_problem
from contextfold.tokens import TiktokenCounter

SYSTEM = (
    "You are an interactive CLI tool that helps users with software engineering tasks. Use "
    "the tools available to you to read, search and run code in the repository."
)
TOOLS = [
    {"name": "Read", "description": "Read a file", "input_schema": {"type": "object"}},
    {"name": "Grep", "description": "Search file contents", "input_schema": {"type": "object"}},
    {"name": "Bash", "description": "Run a shell command", "input_schema": {"type": "object"}},
]
PLACEHOLDER = "[Old tool result content cleared]"
RECORDING = recorder.DEFAULT_OUT


def _files() -> list[Path]:
    roots = [common.ROOT / "src", common.ROOT / "tests", common.ROOT / "docs"]
    return sorted(p for r in roots for p in r.rglob("*") if p.suffix in {".py", ".md"})


def _outputs(calls: int, seed: int) -> Iterator[tuple[str, dict[str, Any], str]]:
    """(tool name, input, output) for ``calls`` steps over the repository's files."""
    rng = random.Random(seed)
    files = _files()
    words = ["def ", "class ", "import ", "assert ", "return ", "raise ", "async ", "yield "]
    for _ in range(calls):
        kind = rng.choices(["Read", "Grep", "Bash"], weights=[6, 3, 1])[0]
        path = rng.choice(files)
        rel = str(path.relative_to(common.ROOT))
        if kind == "Read":
            lines = path.read_text(encoding="utf-8").splitlines()
            text = "\n".join(f"{i + 1:6}\t{line}" for i, line in enumerate(lines[:2000]))
            yield kind, {"file_path": rel}, text
        elif kind == "Grep":
            word = rng.choice(words)
            hits = [
                f"{p.relative_to(common.ROOT)}:{i + 1}:{line}"
                for p in rng.sample(files, 12)
                for i, line in enumerate(p.read_text(encoding="utf-8").splitlines())
                if word in line
            ]
            yield kind, {"pattern": word}, "\n".join(hits[:300]) or "No matches found"
        else:
            done = subprocess.run(
                ["git", "log", "-3", "--stat", "--", rel],
                cwd=common.ROOT,
                capture_output=True,
                text=True,
                check=False,
            )
            yield kind, {"command": f"git log -3 --stat -- {rel}"}, done.stdout or "(no output)"


def synthesized_session(calls: int, seed: int) -> list[dict[str, Any]]:
    """The request bodies of one agent session, one per tool call (each the whole history)."""
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": "Find and fix the flaky test."}]}
    ]
    bodies = []
    for step, (name, args, text) in enumerate(_outputs(calls, seed)):
        ref = f"toolu_{step:04d}"
        note = {"type": "text", "text": f"Step {step}: checking with {name}."}
        use = {"type": "tool_use", "id": ref, "name": name, "input": args}
        messages.append({"role": "assistant", "content": [note, use]})
        result = {"type": "tool_result", "tool_use_id": ref, "content": text}
        messages.append({"role": "user", "content": [result]})
        body = {
            "model": "claude-sonnet-4-5",
            "max_tokens": 8192,
            "system": [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}],
            "tools": TOOLS,
            "messages": copy.deepcopy(messages),
            "stream": True,
        }
        last = body["messages"][-1]["content"][-1]
        last["cache_control"] = {"type": "ephemeral"}  # the agent's moving breakpoint
        bodies.append(body)
    return bodies


def jsonl_session(path: Path) -> list[dict[str, Any]]:
    """Request bodies, one JSON object a line (gzip'd when the name ends in ``.gz``)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def load_session(args: argparse.Namespace) -> tuple[list[dict[str, Any]], str, str]:
    """The bodies to replay, what they are (for the report) and the kind ("recorded" or
    "synthesized"): ``--session FILE`` (a recording of ``record_agent_session.py`` or plain
    JSON lines), else unless ``--synthesized`` or ``--quick`` the stored recording, else one
    recorded now when the pinned Claude Code is installed, else the synthesized session."""
    path = args.session
    if path is None and not (args.synthesized or args.quick):
        if RECORDING.exists():
            path = RECORDING
        elif recorder.installed():
            path = args.results_dir / "claude-code-session.jsonl.gz"
            print(f"no stored recording: recording one now to {path}", flush=True)
            recorder.record(path, args.calls, args.seed)
        else:
            print("no recording and no Claude Code installed: the synthesized session", flush=True)
    if path is None:
        bodies = synthesized_session(args.calls, args.seed)
        return bodies, f"synthesized, {len(bodies)} tool calls", "synthesized"
    with gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else path.open() as f:
        first = json.loads(f.readline() or "{}")
    if "recording" not in first:
        bodies = jsonl_session(path)
        return bodies, f"recorded ({_relative(path)}), {len(bodies)} requests", "recorded"
    meta, bodies = recorder.read_recording(path)
    what = (
        f"recorded from the real {meta.get('client')} {meta.get('version')} on "
        f"{str(meta.get('recorded'))[:10]} ({_relative(path)}): {meta.get('tool_calls')} tool "
        f"calls the client ran, {len(bodies)} requests"
    )
    return bodies, what, "recorded"


def _relative(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(common.ROOT))
    except ValueError:
        return str(path)


def clear_old(body: dict[str, Any], keep_recent: int) -> tuple[dict[str, Any], frozenset[str]]:
    """Every tool output but the newest ``keep_recent`` replaced by one placeholder; and the
    outputs cleared."""
    out = {**body, "messages": list(body["messages"])}
    found = [
        (i, j)
        for i, m in enumerate(out["messages"])
        if isinstance(m.get("content"), list)
        for j, b in enumerate(m["content"])
        if isinstance(b, dict) and b.get("type") == "tool_result"
    ]
    cleared = []
    for i, j in found[: max(0, len(found) - keep_recent)]:
        message = dict(out["messages"][i])
        blocks = list(message["content"])
        blocks[j] = {**blocks[j], "content": PLACEHOLDER}
        cleared.append(str(blocks[j].get("tool_use_id")))
        message["content"] = blocks
        out["messages"][i] = message
    return out, frozenset(cleared)


class PartCounter:
    """o200k tokens of a request: of its JSON without the messages, plus of each message's
    JSON. Each distinct part is counted once (a session resends its history every request:
    counting every body whole would tokenize hundreds of megabytes)."""

    def __init__(self) -> None:
        self._counter = TiktokenCounter("o200k_base")
        self._seen: dict[str, int] = {}

    def __call__(self, text: str) -> int:
        n = self._seen.get(text)
        if n is None:
            n = self._seen[text] = self._counter.count(text)
        return n


def _key(message: Any) -> str:
    """A message as the prompt cache sees it: its JSON without ``cache_control`` marks (the
    agent moves its breakpoint every turn; the cached prefix is the content), string content
    as the one text block it stands for (Claude Code sends its newest ``system`` message as a
    block carrying the breakpoint, and the same message as a string the next turn)."""
    if not isinstance(message, dict):
        return json.dumps(message, ensure_ascii=False)
    content = message.get("content")
    if isinstance(content, str):
        message = {**message, "content": [{"type": "text", "text": content}]}
    elif isinstance(content, list) and any(
        isinstance(b, dict) and "cache_control" in b for b in content
    ):
        blocks = [
            {k: v for k, v in b.items() if k != "cache_control"} if isinstance(b, dict) else b
            for b in content
        ]
        message = {**message, "content": blocks}
    return json.dumps(message, ensure_ascii=False)


Strategy = Callable[[dict[str, Any]], tuple[dict[str, Any], frozenset[str]]]


def run(
    bodies: list[dict[str, Any]],
    strategy: Strategy,
    counter: PartCounter,
    limit: int,
    window: int,
) -> dict[str, Any]:
    """Replay ``bodies`` through ``strategy`` (a body -> the body sent and the outputs it
    replaced). An *event* is a request whose replaced outputs differ from the previous
    request's; between events the previous request's messages should be a prefix of the
    next one's (the provider's prompt cache then serves everything before the new turn)."""
    tokens: list[int] = []
    invalid: list[str] = []
    kept_prefix = over = over_window = uncached = events = calm = calm_kept = 0
    previous: list[str] | None = None
    replaced: frozenset[str] = frozenset()
    for i, body in enumerate(bodies):
        out, changed = strategy(body)
        head = counter(json.dumps({k: v for k, v in out.items() if k != "messages"}))
        keys = [_key(m) for m in out["messages"]]
        sizes = [counter(json.dumps(m, ensure_ascii=False)) for m in out["messages"]]
        n = head + sum(sizes)
        tokens.append(n)
        over += n > limit
        over_window += n > window
        problem = payload_problem("anthropic", out, inline_system=True)
        if problem:
            invalid.append(f"request {i}: {problem}")
        event = changed != replaced
        events += event
        replaced = changed
        if previous is not None:
            kept = keys[: len(previous)] == previous
            kept_prefix += kept
            if not event:
                calm += 1
                calm_kept += kept
        common_len = 0
        for a, b in zip(keys, previous or [], strict=False):
            if a != b:
                break
            common_len += 1
        # What the prompt cache serves: the request up to the first message that changed.
        uncached += n - (head + sum(sizes[:common_len])) if common_len else n
        previous = keys
    return {
        "requests": len(bodies),
        "total_tokens": sum(tokens),
        "uncached_tokens": uncached,
        "largest_request_tokens": max(tokens),
        "last_request_tokens": tokens[-1],
        "requests_over_limit": over,
        "requests_over_window": over_window,
        "prefix_kept_share": round(kept_prefix / max(1, len(bodies) - 1), 4),
        "events": events,
        "prefix_kept_between_events": f"{calm_kept}/{calm}",
        "prefix_kept_between_events_share": round(calm_kept / calm, 4) if calm else None,
        "invalid": invalid[:5],
        "invalid_count": len(invalid),
        "per_request_tokens": tokens,
    }


def compaction_ratios(before: list[int], after: list[int]) -> dict[str, Any]:
    """Tokens before / after compaction, request by request."""
    compacted = [(i, b, a) for i, (b, a) in enumerate(zip(before, after, strict=True)) if a < b]
    ratios = [b / a for _, b, a in compacted]
    picks = sorted({round(q * (len(before) - 1)) for q in (0.25, 0.5, 0.75, 1.0)})
    if compacted:
        picks = sorted({compacted[0][0], *picks})
    return {
        "compacted_requests": len(compacted),
        "first_compacted_request": compacted[0][0] if compacted else None,
        "ratio_last": round(before[-1] / after[-1], 2),
        "ratio_median_compacted": round(statistics.median(ratios), 2) if ratios else 1.0,
        "ratio_max": round(max(ratios), 2) if ratios else 1.0,
        "samples": [{"request": i, "before": before[i], "after": after[i]} for i in picks],
    }


STUB = "[contextfold: tool output "


def _stubbed(body: dict[str, Any]) -> frozenset[str]:
    """The tool outputs of ``body`` that are compaction stubs."""
    return frozenset(
        str(b.get("tool_use_id"))
        for m in body.get("messages") or []
        if isinstance(m, dict) and isinstance(m.get("content"), list)
        for b in m["content"]
        if isinstance(b, dict)
        and b.get("type") == "tool_result"
        and isinstance(b.get("content"), str)
        and b["content"].startswith(STUB)
    )


def _recorded_reply(bodies: list[dict[str, Any]], i: int) -> Any:
    """The scripted upstream's step answering request ``i`` as the recorded model did: the
    assistant message request ``i + 1`` carries right after request ``i``'s messages (its
    text and tool calls, which the upstream renders with the ids it had when recording)."""
    from agent_upstream import Call, Step

    if i + 1 >= len(bodies):
        return Step(text="Done.")
    msg = bodies[i + 1]["messages"][len(bodies[i]["messages"])]
    content = msg.get("content")
    blocks = content if isinstance(content, list) else [{"type": "text", "text": content}]
    text = "".join(b.get("text", "") for b in blocks if b.get("type") == "text")
    calls = [Call(b["name"], b.get("input") or {}) for b in blocks if b.get("type") == "tool_use"]
    return Step(text=text, calls=calls)


def through_proxy(
    bodies: list[dict[str, Any]], settings: OutputSettings, sample: int
) -> dict[str, Any]:
    """Replay the session's last ``sample`` requests, in order, through a real
    ``contextfold proxy`` (memory on, ``tool_outputs`` as ``settings``) to the scripted
    upstream of ``tests/agents``, which answers each as the recorded model did — so each
    request continues the conversation the proxy stored, as the client's next request does —
    and, for the baseline, the same requests straight to a second such upstream. Checks what
    the upstream received: valid for the provider, stubbed as ``compact`` does offline, with
    the ``contextfold_restore`` tool on every compacted request; and times both paths (the
    first proxied request carries the whole history the proxy has not seen: it is reported
    apart)."""
    import httpx

    recorder.harness()
    from agent_harness import ProxyProcess
    from agent_upstream import Step
    from long_session import RecordingUpstream

    n = len(bodies)
    picks = list(range(max(0, n - sample), n))
    offline = [_stubbed(compact("anthropic", bodies[i], settings)[0]) for i in picks]
    seen: list[tuple[frozenset[str], str | None, bool]] = []

    def check(body: dict[str, Any]) -> None:
        tools = {t.get("name") for t in body.get("tools") or [] if isinstance(t, dict)}
        problem = payload_problem("anthropic", body, inline_system=True)
        seen.append((_stubbed(body), problem, "contextfold_restore" in tools))

    def steps() -> list[Any]:  # a step's index is its place in the recording: ids match
        return [Step(used=True) for _ in range(picks[0])] + [
            _recorded_reply(bodies, i) for i in picks
        ]

    def replay(url: str) -> tuple[int, list[float]]:
        answered, seconds = 0, []
        with httpx.Client(timeout=300) as client:
            for i in picks:
                start = time.perf_counter()
                reply = client.post(
                    url + "/v1/messages",
                    content=json.dumps(bodies[i], ensure_ascii=False).encode(),
                    headers={
                        "content-type": "application/json",
                        "x-api-key": "sk-bench-tool-outputs",
                        "anthropic-version": "2023-06-01",
                    },
                )
                seconds.append(time.perf_counter() - start)
                answered += reply.status_code == 200
        return answered, seconds

    with RecordingUpstream(steps(), lambda body: None) as upstream:
        _, direct = replay(upstream.url)
    config = {"compact_above": settings.compact_above, "keep_recent": settings.keep_recent}
    with RecordingUpstream(steps(), check) as upstream, tempfile.TemporaryDirectory() as home:
        proxy = ProxyProcess(upstream.url, Path(home), tool_outputs=config)
        try:
            answered, seconds = replay(proxy.url)
        finally:
            proxy.stop()
    compacted = [k for k, want in enumerate(offline) if want]
    added = [p - d for p, d in zip(seconds[1:], direct[1:], strict=True)]
    return {
        "requests": picks,
        "answered": answered,
        "forwarded": len(seen),
        "valid": sum(1 for _, problem, _ in seen if problem is None),
        "invalid": [f"request {picks[k]}: {p}" for k, (_, p, _) in enumerate(seen) if p][:5],
        "stubbed_as_offline": sum(
            1 for (got, _, _), want in zip(seen, offline, strict=False) if got == want
        ),
        "compacted": len(compacted),
        "restore_tool_on_compacted": sum(1 for k in compacted if k < len(seen) and seen[k][2]),
        "first_seconds": round(seconds[0], 2),
        "direct_seconds_median": round(statistics.median(direct[1:] or direct), 3),
        "seconds_median": round(statistics.median(seconds[1:] or seconds), 3),
        "seconds_max": round(max(seconds[1:] or seconds), 3),
        "added_ms_median": round(statistics.median(added) * 1000, 1) if added else None,
        "added_ms_max": round(max(added) * 1000, 1) if added else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common.common_arguments(parser)
    parser.add_argument("--calls", type=int, default=400, help="tool calls in the session")
    parser.add_argument("--limit", type=int, default=150_000, help="compact_above, in tokens")
    parser.add_argument("--keep-recent", type=int, default=4)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--session", type=Path, default=None, help="a recording, or request bodies (JSONL)"
    )
    parser.add_argument(
        "--synthesized", action="store_true", help="the synthesized session, not the recording"
    )
    parser.add_argument(
        "--through-proxy",
        type=int,
        default=0,
        metavar="N",
        help="also replay the last N requests, in order, straight and through a real "
        "contextfold proxy to the scripted upstream (needs tests/agents; 0: none)",
    )
    args = parser.parse_args()
    if args.quick:
        args.calls, args.limit = 60, 20_000
    bodies, what, kind = load_session(args)
    print(f"session: {what}", flush=True)
    settings = OutputSettings(compact_above=args.limit, keep_recent=args.keep_recent)
    model = bodies[0].get("model")
    window = window_of(model) or 200_000
    counter = PartCounter()

    needs: list[int | None] = []

    def ours(body: dict[str, Any]) -> tuple[dict[str, Any], frozenset[str]]:
        out, done = compact("anthropic", body, settings)
        needs.append(done.need if done else None)
        return out, frozenset(done.stubbed if done else ())

    strategies: dict[str, Strategy] = {
        "none": lambda body: (body, frozenset()),
        "contextfold": ours,
        "clear-old": lambda body: clear_old(body, args.keep_recent),
    }
    results = {
        name: run(bodies, fn, counter, args.limit, window) for name, fn in strategies.items()
    }
    for name, r in results.items():
        shown = {k: v for k, v in r.items() if k not in {"invalid", "per_request_tokens"}}
        print(name, shown, flush=True)
    none, mine = results["none"], results["contextfold"]
    ratios = compaction_ratios(none["per_request_tokens"], mine["per_request_tokens"])
    # a size-bucket crossing; the other events stub an output that just left the newest ones
    ratios["bucket_events"] = sum(1 for a, b in itertools.pairwise([None, *needs]) if a != b)
    print("compaction", ratios, flush=True)
    proxied = None
    if args.through_proxy:
        proxied = through_proxy(bodies, settings, args.through_proxy)
        print("through the proxy", proxied, flush=True)
    result = common.base_result(
        "tool_outputs" if kind == "synthesized" else "tool_outputs_recorded",
        __doc__.split("\n\n")[0],
        args.quick,
    )
    result.update(
        parameters={
            "session": what,
            "session_kind": kind,
            "calls": len(bodies),
            "model": model,
            "window_tokens": window,
            "limit_tokens": args.limit,
            "keep_recent": args.keep_recent,
            "seed": args.seed,
            "counter": "tiktoken o200k_base: the JSON body without its messages, plus each "
            "message's JSON",
        },
        strategies=results,
        compaction=ratios,
        through_proxy=proxied,
        ratios={
            "total_none_over_contextfold": round(none["total_tokens"] / mine["total_tokens"], 2),
            "uncached_clear_old_over_contextfold": round(
                results["clear-old"]["uncached_tokens"] / mine["uncached_tokens"], 2
            ),
            "largest_none_over_contextfold": round(
                none["largest_request_tokens"] / mine["largest_request_tokens"], 2
            ),
        },
        correctness={
            "every compacted request valid": mine["invalid_count"] == 0,
            "no request over the limit after compaction": mine["requests_over_limit"] == 0,
            "no request over the window after compaction": mine["requests_over_window"] == 0,
            "prefix kept between compaction events": mine["prefix_kept_between_events_share"]
            in (None, 1.0),
            **(
                {
                    "through the proxy: every request answered and valid": proxied["answered"]
                    == proxied["valid"]
                    == len(proxied["requests"]),
                    "through the proxy: stubbed as offline": proxied["stubbed_as_offline"]
                    == len(proxied["requests"]),
                    "through the proxy: restore tool on every compacted request": proxied[
                        "restore_tool_on_compacted"
                    ]
                    == proxied["compacted"],
                }
                if proxied
                else {}
            ),
        },
        peak_rss_mb=common.peak_rss_mb(),
    )
    path = common.write_result(result, args.results_dir, args.results_md)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
