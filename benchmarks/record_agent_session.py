"""Record a long agent session from the real Claude Code (issue 20, point 5).

The pinned client (``tests/agents/versions.txt``, installed by ``scripts/install-agents``)
reviews a copy of this project's ``src/`` against the scripted loopback upstream of
``tests/agents`` (``long_session.py``): the script asks for hundreds of tool calls (Read,
Edit, Bash: grep, find, ls, wc, git), the client runs every one of them for real, and every
request body of its conversation is written down as the upstream received it.
``bench_tool_outputs.py`` replays the recording; nothing here talks to the internet.

**The file** is gzip'd JSON lines: a header ``{"recording": {...}}`` (client, version, date,
command, counts), then one line per request, coded against the request before it, since each
request resends the whole conversation: ``{"keep": k, "same": [keys], "order": [keys],
"body": {...}}`` is the previous body's first ``k`` messages followed by ``body["messages"]``,
the previous body's values for the top-level keys in ``same`` and ``body``'s other keys, in
the key order ``order``. ``read_recording`` gives the bodies back exactly as they were sent
(a 400-call session: about 230 MB of request bodies, 0.7 MB on disk).

Run: ``AGENTS_DIR=... python benchmarks/record_agent_session.py`` (writes
``benchmarks/data/claude-code-session.jsonl.gz``; ``--calls 30 --out FILE`` for a short one).
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import IO, Any

import _common as common

AGENTS = common.ROOT / "tests" / "agents"
DEFAULT_OUT = common.BENCH_DIR / "data" / "claude-code-session.jsonl.gz"
JSON = dict[str, Any]


class DeltaWriter:
    """Writes request bodies to a gzip'd recording, each coded against the one before."""

    def __init__(self, out: IO[bytes]) -> None:
        self._gz = gzip.GzipFile(fileobj=out, mode="wb", compresslevel=9, mtime=0)
        self._previous: JSON = {}
        self.count = 0

    def line(self, value: JSON) -> None:
        self._gz.write(json.dumps(value, ensure_ascii=False).encode() + b"\n")

    def write(self, body: JSON) -> None:
        prev = self._previous
        messages, before = body.get("messages") or [], prev.get("messages") or []
        keep = 0
        while keep < min(len(messages), len(before)) and messages[keep] == before[keep]:
            keep += 1
        same = [k for k in body if k != "messages" and k in prev and prev[k] == body[k]]
        rest = {k: v for k, v in body.items() if k not in same and k != "messages"}
        if "messages" in body:
            rest["messages"] = messages[keep:]
        self.line({"keep": keep, "same": same, "order": list(body), "body": rest})
        self._previous = body
        self.count += 1

    def close(self) -> None:
        self._gz.close()


def read_recording(path: Path) -> tuple[JSON, list[JSON]]:
    """The header and the request bodies of a recording, as they were sent."""
    meta: JSON = {}
    bodies: list[JSON] = []
    previous: JSON = {}
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for text in f:
            entry = json.loads(text)
            if "recording" in entry:
                meta = entry["recording"]
                continue
            part = entry["body"]
            merged = {**{k: previous[k] for k in entry["same"]}, **part}
            if "messages" in part:
                merged["messages"] = (previous.get("messages") or [])[: entry["keep"]] + part[
                    "messages"
                ]
            previous = {k: merged[k] for k in entry["order"]}
            bodies.append(previous)
    return meta, bodies


def harness() -> None:
    """Make ``tests/agents``'s modules importable (they import each other, and
    ``tests/fake_llm``, by name)."""
    for folder in (AGENTS.parent, AGENTS):
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))


def installed(client_id: str = "claude-latest") -> bool:
    """Whether the pinned client is installed (recording needs it)."""
    harness()
    from agent_harness import AGENTS_DIR, pins

    _, package, version = pins()[client_id]
    stamp = AGENTS_DIR / client_id / ".installed"
    return stamp.exists() and stamp.read_text().strip() == f"{package}@{version}"


def record(out: Path, calls: int, seed: int = 7, client_id: str = "claude-latest") -> JSON:
    """Record a session of about ``calls`` tool calls to ``out``; its header. Raises
    ``RuntimeError`` when the client failed or did not follow the script to its end."""
    harness()
    from long_session import record_session

    out.parent.mkdir(parents=True, exist_ok=True)
    part = out.with_name(out.name + ".part")
    with tempfile.TemporaryDirectory(prefix="cf-record-") as tmp, part.open("wb") as raw:
        writer = DeltaWriter(raw)
        session = record_session(
            Path(tmp),
            common.ROOT / "src",
            writer.write,
            client_id=client_id,
            calls=calls,
            seed=seed,
        )
        writer.close()
    finished = session.extra.get("final_answer") and session.steps_used == session.steps
    if session.rc != 0 or session.unscripted or not finished:
        part.unlink()
        raise RuntimeError(
            f"{client_id} exited {session.rc} after {session.requests} requests "
            f"({session.unscripted} unscripted, {session.steps_used} of {session.steps} "
            f"steps used): {session.stderr[-800:] or session.stdout[-800:]}"
        )
    meta = {
        **session.meta(),
        "repository": f"a copy of this project's src/ at commit {common.git_state()['commit']}",
        "recorder": "benchmarks/record_agent_session.py",
    }
    # the header first, now that the counts are known
    with out.open("wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as final:
        final.write(json.dumps({"recording": meta}).encode() + b"\n")
        with gzip.open(part, "rb") as recorded:
            shutil.copyfileobj(recorded, final)
    part.unlink()
    return meta


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=400, help="tool calls, about")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--client", default="claude-latest", help="a name in versions.txt")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    if not installed(args.client):
        sys.exit(f"{args.client} is not installed: run scripts/install-agents (AGENTS_DIR)")
    meta = record(args.out, args.calls, args.seed, args.client)
    print(f"wrote {args.out} ({args.out.stat().st_size:,} bytes): {meta}")


if __name__ == "__main__":
    main()
