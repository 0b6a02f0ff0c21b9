"""Deterministic stand-ins for tests and examples: real implementations of the protocols that
need no model files; and ``payload_problem``, the providers' rules for a conversation, which
the property tests check every formatter's payload against and the tool-output benchmark
checks every compacted request against.

``HashEmbedder`` embeds a text as its hashed, stemmed bag of words (the "hashing trick"),
L2-normalised: texts that share words are similar, texts that don't are orthogonal. It is fast
and deterministic across processes, which makes it the embedder for tests that are not about
embedding quality.

>>> e = HashEmbedder(dim=64)
>>> v = e.embed(["refund policy", "refund rules", "weather today"])
>>> bool(v[0] @ v[1] > v[0] @ v[2])
True
>>> call = {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f"}]}
>>> payload_problem("anthropic", {"messages": [{"role": "user", "content": "hi"}, call]})
'the last turn (assistant) ends on tool calls never answered'
"""

from __future__ import annotations

import hashlib
import itertools
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from contextfold.retrieval.sparse import analyze

__all__ = ["HashEmbedder", "payload_problem", "proxy_command"]


class HashEmbedder:
    """An ``Embedder`` from hashed word counts; ``dim`` buckets (default 256)."""

    def __init__(self, dim: int = 256) -> None:
        self._dim = dim

    @property
    def name(self) -> str:
        return f"hash-{self._dim}"

    @property
    def dim(self) -> int:
        return self._dim

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        out = np.zeros((len(texts), self._dim), dtype=np.float32)
        for row, text in enumerate(texts):
            for term in analyze(text) or analyze(text, stopwords=None):
                digest = hashlib.blake2b(term.encode(), digest_size=8).digest()
                bucket = int.from_bytes(digest[:4], "little") % self._dim
                out[row, bucket] += 1.0 if digest[4] & 1 else -1.0
            norm = float(np.linalg.norm(out[row]))
            if norm > 0:
                out[row] /= norm
        return out


# -- what the providers accept ----------------------------------------------------------------


def payload_problem(
    fmt: str, payload: dict[str, Any], *, inline_system: bool = False
) -> str | None:
    """Why the provider of ``fmt`` ("anthropic", "gemini", "openai") would refuse the
    conversation in ``payload``, or ``None``. Other formats: ``None``.

    Anthropic and Gemini: the first turn is the user's, roles alternate, no turn is empty, a
    turn's tool results come first and answer exactly the calls of the turn right before it,
    and a conversation does not end on unanswered calls. OpenAI: each ``tool`` message
    answers a call of the assistant message before its run of tool messages, and every call
    is answered by that run. ``inline_system``: pass over ``system`` messages among the
    Anthropic ``messages`` (Claude Code 2.1 sends them; the API takes them where they stand).
    """
    check = _CHECKS.get(fmt)
    return None if check is None else check(payload, inline_system)


def _blocks(content: Any) -> list[dict[str, Any]]:
    """A message's content as blocks (a string is one text block)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    return [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []


def _alternation(turns: list[tuple[str, list[str], list[str]]]) -> str | None:
    """``turns``: (role, its call ids, its result ids), in order."""
    if turns and turns[0][0] != "user":
        return f"the first turn is the {turns[0][0]}'s, not the user's"
    for i, (before, (role, _, results)) in enumerate(itertools.pairwise([("", [], []), *turns])):
        if role == before[0]:
            return f"turns {i - 1} and {i}: two {role} turns in a row"
        if role == "user" and sorted(results) != sorted(before[1]):
            return f"turn {i}: the results {results} answer the calls {before[1]}"
        if role != "user" and results:
            return f"turn {i} ({role}): tool results outside a user turn"
    if turns and turns[-1][0] != "user" and turns[-1][1]:
        return f"the last turn ({turns[-1][0]}) ends on tool calls never answered"
    return None


def _anthropic(payload: dict[str, Any], inline_system: bool) -> str | None:
    turns: list[tuple[str, list[str], list[str]]] = []
    for i, message in enumerate(payload.get("messages") or []):
        role = message.get("role")
        if inline_system and role == "system":
            continue
        if role not in ("user", "assistant"):
            return f"message {i}: the role {role!r} among the messages"
        blocks = _blocks(message.get("content"))
        if not blocks:
            return f"message {i} ({role}): an empty turn"
        kinds = [b.get("type") for b in blocks]
        results = [str(b.get("tool_use_id")) for b in blocks if b.get("type") == "tool_result"]
        if kinds[: len(results)] != ["tool_result"] * len(results):
            return f"message {i} ({role}): tool results do not come first"
        calls = [str(b.get("id")) for b in blocks if b.get("type") == "tool_use"]
        turns.append((str(role), calls, results))
    return _alternation(turns)


def _gemini(payload: dict[str, Any], inline_system: bool) -> str | None:
    turns: list[tuple[str, list[str], list[str]]] = []
    for i, turn in enumerate(payload.get("contents") or []):
        parts = [p for p in turn.get("parts") or [] if isinstance(p, dict)]
        if not parts:
            return f"turn {i} ({turn.get('role')}): an empty turn"
        results = [str(p["functionResponse"].get("id")) for p in parts if "functionResponse" in p]
        if not all("functionResponse" in p for p in parts[: len(results)]):
            return f"turn {i}: function responses do not come first"
        calls = [str(p["functionCall"].get("id")) for p in parts if "functionCall" in p]
        turns.append((str(turn.get("role")), calls, results))
    return _alternation(turns)


def _openai(payload: dict[str, Any], inline_system: bool) -> str | None:
    pending: list[str] = []
    for i, message in enumerate(payload.get("messages") or []):
        if message.get("role") == "tool":
            if message.get("tool_call_id") not in pending:
                return f"message {i}: a tool result without its call before it"
            pending.remove(message["tool_call_id"])
            continue
        if pending:
            return f"message {i}: the calls {pending} are left unanswered before it"
        if message.get("role") == "assistant":
            pending = [c.get("id") for c in message.get("tool_calls") or []]
    return f"the calls {pending} are never answered" if pending else None


_CHECKS: dict[str, Callable[[dict[str, Any], bool], str | None]] = {
    "anthropic": _anthropic,
    "gemini": _gemini,
    "openai": _openai,
}


def proxy_command(upstream: str, port: int, *options: str) -> list[str]:
    """The command that runs ``contextfold proxy`` with this interpreter in front of
    ``upstream`` on ``port``, ``options`` after (the benchmarks' and the agent tests' proxy
    processes).

    >>> " ".join(proxy_command("http://127.0.0.1:9", 5757, "--log-level", "warning")[2:])
    'contextfold proxy --upstream http://127.0.0.1:9 --port 5757 --log-level warning'
    """
    return [
        sys.executable,
        "-m",
        "contextfold",
        "proxy",
        "--upstream",
        upstream,
        "--port",
        str(port),
        *options,
    ]
