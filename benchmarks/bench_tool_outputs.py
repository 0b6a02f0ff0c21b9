"""Tool-output compaction on a long agent session: tokens sent, requests kept under the
limit, cache-prefix stability and provider validity, request by request.

The session is an Anthropic Messages conversation of ``--calls`` tool calls (Read, Grep and
Bash outputs) over this repository's real files, in the shape Claude Code sends: a system
prompt, the task, then per step an assistant ``tool_use`` and a user ``tool_result``, with a
``cache_control`` breakpoint on the last block of the last message. ``--session FILE`` replays
recorded request bodies instead (JSON lines, one request body per line, as the agent sent
them). Each request is compacted by ``contextfold.server.proxy.outputs.compact`` with the
limit ``--limit`` and compared with:

* **none**: the request as the agent sent it;
* **clear-old** (what an agent's own tool-result clearing does): every output but the newest
  ``keep_recent`` replaced by a fixed placeholder on every request.

Reported per strategy: total input tokens over the session (o200k, exact counts of the JSON
bodies), the largest request, requests over the limit, and "prefix kept": the share of
requests whose messages start with the previous request's messages unchanged (the provider's
prompt cache can then serve everything before the new turn), and the tokens not served from
that cache (each request pays afresh for everything from its first message that differs from
the previous request's). Every compacted request is
checked for validity: every ``tool_use`` answered by a ``tool_result`` in the next message,
user first, roles alternating.

Run: ``python benchmarks/bench_tool_outputs.py`` (``--quick``: 60 calls).
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import _common as common
from contextfold.server.config import OutputSettings
from contextfold.server.proxy.outputs import compact
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


def recorded_session(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def clear_old(body: dict[str, Any], keep_recent: int) -> dict[str, Any]:
    """Every tool output but the newest ``keep_recent`` replaced by one placeholder."""
    out = copy.deepcopy(body)
    results = [
        b
        for m in out["messages"]
        if isinstance(m.get("content"), list)
        for b in m["content"]
        if isinstance(b, dict) and b.get("type") == "tool_result"
    ]
    for block in results[: max(0, len(results) - keep_recent)]:
        block["content"] = PLACEHOLDER
    return out


def valid(body: dict[str, Any]) -> str | None:
    """Why ``body`` would be refused by the Messages API, or None."""
    messages = body["messages"]
    if not messages or messages[0]["role"] != "user":
        return "does not start with a user message"
    for i, msg in enumerate(messages):
        if i and msg["role"] == messages[i - 1]["role"]:
            return f"message {i}: two {msg['role']} messages in a row"
        blocks = msg["content"] if isinstance(msg["content"], list) else []
        uses = [b["id"] for b in blocks if b.get("type") == "tool_use"]
        if uses:
            after = messages[i + 1]["content"] if i + 1 < len(messages) else []
            answered = [b.get("tool_use_id") for b in after if b.get("type") == "tool_result"]
            if i + 1 < len(messages) and answered != uses:
                return f"message {i}: tool_use {uses} answered by {answered}"
    return None


def run(
    bodies: list[dict[str, Any]],
    strategy: Callable[[dict[str, Any]], dict[str, Any]],
    counter: TiktokenCounter,
    limit: int,
) -> dict[str, Any]:
    tokens, invalid, kept_prefix, over, uncached = [], [], 0, 0, 0
    previous: list[Any] | None = None
    for i, body in enumerate(bodies):
        out = strategy(body)
        n = counter.count(json.dumps(out, ensure_ascii=False))
        tokens.append(n)
        over += n > limit
        problem = valid(out)
        if problem:
            invalid.append(f"request {i}: {problem}")
        messages = _without_breakpoints(out["messages"])
        if previous is not None and messages[: len(previous)] == previous:
            kept_prefix += 1
        common_len = 0
        for a, b in zip(messages, previous or [], strict=False):
            if a != b:
                break
            common_len += 1
        # What the prompt cache serves: the request up to the first message that changed.
        cached = counter.count(json.dumps(_head(out, common_len), ensure_ascii=False))
        uncached += n - cached if common_len else n
        previous = messages
    return {
        "requests": len(bodies),
        "total_tokens": sum(tokens),
        "uncached_tokens": uncached,
        "largest_request_tokens": max(tokens),
        "last_request_tokens": tokens[-1],
        "requests_over_limit": over,
        "prefix_kept_share": round(kept_prefix / max(1, len(bodies) - 1), 4),
        "invalid": invalid[:5],
        "invalid_count": len(invalid),
    }


def _head(body: dict[str, Any], messages: int) -> dict[str, Any]:
    """``body`` with only its first ``messages`` messages (the cacheable prefix)."""
    return {**body, "messages": body["messages"][:messages]}


def _without_breakpoints(messages: list[Any]) -> list[Any]:
    """The messages without ``cache_control`` marks (the agent moves its breakpoint each turn;
    the cache prefix is the content)."""
    text = json.dumps(messages, ensure_ascii=False)
    out: list[Any] = json.loads(text)
    for msg in out:
        if isinstance(msg.get("content"), list):
            for block in msg["content"]:
                if isinstance(block, dict):
                    block.pop("cache_control", None)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common.common_arguments(parser)
    parser.add_argument("--calls", type=int, default=400, help="tool calls in the session")
    parser.add_argument("--limit", type=int, default=150_000, help="compact_above, in tokens")
    parser.add_argument("--keep-recent", type=int, default=4)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--session", type=Path, default=None, help="recorded bodies (JSONL)")
    args = parser.parse_args()
    if args.quick:
        args.calls, args.limit = 60, 20_000
    bodies = (
        recorded_session(args.session)
        if args.session
        else synthesized_session(args.calls, args.seed)
    )
    settings = OutputSettings(compact_above=args.limit, keep_recent=args.keep_recent)
    counter = TiktokenCounter("o200k_base")
    strategies: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
        "none": lambda body: body,
        "contextfold": lambda body: compact("anthropic", body, settings)[0],
        "clear-old": lambda body: clear_old(body, args.keep_recent),
    }
    results = {name: run(bodies, fn, counter, args.limit) for name, fn in strategies.items()}
    for name, r in results.items():
        print(name, {k: v for k, v in r.items() if k != "invalid"}, flush=True)
    none, ours = results["none"], results["contextfold"]
    result = common.base_result("tool_outputs", __doc__.split("\n\n")[0], args.quick)
    result.update(
        parameters={
            "session": str(args.session) if args.session else "synthesized",
            "calls": len(bodies),
            "limit_tokens": args.limit,
            "keep_recent": args.keep_recent,
            "seed": args.seed,
            "counter": "tiktoken o200k_base over the JSON body",
        },
        strategies=results,
        ratios={
            "total_none_over_contextfold": round(none["total_tokens"] / ours["total_tokens"], 2),
            "uncached_clear_old_over_contextfold": round(
                results["clear-old"]["uncached_tokens"] / ours["uncached_tokens"], 2
            ),
            "largest_none_over_contextfold": round(
                none["largest_request_tokens"] / ours["largest_request_tokens"], 2
            ),
        },
        correctness={
            "every compacted request valid": ours["invalid_count"] == 0,
            "no request over the limit after compaction": ours["requests_over_limit"] == 0,
        },
        peak_rss_mb=common.peak_rss_mb(),
    )
    path = common.write_result(result, args.results_dir, args.results_md)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
