"""Trim a 2,000-message agent conversation to 8,000 tokens: ``contextfold.trim_history`` against
LangChain's ``trim_messages``, in the same process, on the same input, with the same counter.

The conversation is real dialogue (LoCoMo turns; speaker A as the user, speaker B as the
assistant) with tool traffic woven in: after every ``TOOL_EVERY``-th turn the assistant calls
``search_memory`` (every third time together with a parallel ``get_session`` call, and sometimes
with a line of text), one tool message answers each call, and the assistant replies. It opens
with a system message and ends with a user message.

Fair play:

- Both sides count with one ``TiktokenCounter("o200k_base")`` instance (its LRU cache warm and
  shared) and the same OpenAI cost model as ``contextfold.tokens.count_messages``: the
  cookbook's 3 tokens per message plus every value (role, content, ``tool_call_id``), and each
  tool call's id, type, name and compact sorted-key JSON arguments plus 1. LangChain gets it as
  a list counter (its fastest path, no per-message wrapper); ours adds the 3-token per-request
  overhead once, so LangChain gets ``max_tokens - 3`` and both keep
  ``3 + Σ message costs <= 8,000``.
- Messages are converted to LangChain's classes once, outside the timed region.
- Runs are interleaved (ours, then each LangChain config, repeatedly) after warm-up runs.

Run: ``python benchmarks/bench_history_trim.py`` (``--quick`` for the smoke test).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
    trim_messages,
)

import _common as common
from contextfold import (
    Message,
    TextBlock,
    TiktokenCounter,
    ToolResultBlock,
    ToolUseBlock,
    trim_history,
)
from contextfold.tokens import OVERHEADS, count_messages

ENCODING = "o200k_base"
FORMAT = "openai"
TOOL_EVERY = 6
RATIO_GOAL = 5.0
OURS = "contextfold trim_history"
LC_START_END = "langchain trim_messages (start_on human, end_on human/tool)"
LC_DEFAULT = "langchain trim_messages (default: no start_on/end_on)"
KEYS = {OURS: "ours", LC_START_END: "lc_start_end", LC_DEFAULT: "lc_default"}
SYSTEM_PROMPT = (
    "You are a warm, attentive companion assistant. You remember what the user told you in "
    "earlier sessions and use the search_memory and get_session tools to look details up "
    "before answering questions about the past. Quote dates exactly as the tools return them, "
    "say so when the memory has nothing on a topic, and never invent events."
)


# --------------------------------------------------------------------------- the conversation


def build_conversation(turns: list[common.Turn], n: int) -> list[Message]:
    """``n`` messages: a system message, dialogue with tool exchanges, a final user message."""
    out = [Message(role="system", content=SYSTEM_PROMPT)]
    exchanges = 0
    for i, turn in enumerate(turns):
        if len(out) >= n - 1:
            break
        out.append(Message(role="user" if turn.first_speaker else "assistant", content=turn.text))
        if (i + 1) % TOOL_EVERY or i + 1 >= len(turns):
            continue
        nxt = turns[i + 1]
        calls: list[Any] = []
        if exchanges % 4 == 1:
            calls.append(TextBlock(text="Let me check what you told me before."))
        calls.append(
            ToolUseBlock(
                id=f"call_{exchanges}_0",
                name="search_memory",
                input={"query": " ".join(nxt.text.split()[:8]), "limit": 3},
            )
        )
        earlier = turns[max(0, i - 40) : max(0, i - 40) + 3]
        results = [
            json.dumps(
                [{"dia_id": t.dia_id, "speaker": t.speaker, "text": t.text} for t in earlier]
            )
        ]
        if exchanges % 3 == 2:  # parallel calls
            session = turn.dia_id.split(":")[0]
            calls.append(
                ToolUseBlock(id=f"call_{exchanges}_1", name="get_session", input={"id": session})
            )
            results.append(json.dumps({"session": session, "date_time": turn.date}))
        exchanges += 1
        ids = [b.id for b in calls if isinstance(b, ToolUseBlock)]
        exchange = [
            Message(role="assistant", content=tuple(calls)),
            *(
                Message(role="tool", content=(ToolResultBlock(tool_use_id=tid, content=text),))
                for tid, text in zip(ids, results, strict=True)
            ),
        ]
        if len(out) + len(exchange) >= n - 1:
            continue  # never cut an exchange in half at the end
        out += exchange
    while out[-1].role != "user" or len(out) < n:
        # finish on a user message, exactly n long
        if len(out) >= n:
            out.pop()
            continue
        turn = next(t for t in reversed(turns) if t.first_speaker)
        out.append(Message(role="user", content=turn.text))
    if len(out) != n:
        raise SystemExit(f"built {len(out)} messages, expected {n}")
    return out


def to_langchain(messages: Sequence[Message]) -> list[BaseMessage]:
    out: list[BaseMessage] = []
    for m in messages:
        text = "\n".join(b.text for b in m.content if isinstance(b, TextBlock))
        if m.role == "system":
            out.append(SystemMessage(content=text))
        elif m.role == "user":
            out.append(HumanMessage(content=text))
        elif m.role == "assistant":
            calls = [
                {"name": b.name, "args": dict(b.input), "id": b.id, "type": "tool_call"}
                for b in m.content
                if isinstance(b, ToolUseBlock)
            ]
            out.append(AIMessage(content=text, tool_calls=calls))
        else:
            for b in m.content:
                assert isinstance(b, ToolResultBlock)
                out.append(ToolMessage(content=b.content, tool_call_id=b.tool_use_id))
    return out


# --------------------------------------------------------------------------- the shared counter


def langchain_counter(counter: TiktokenCounter) -> Callable[[list[BaseMessage]], int]:
    """A list token counter for LangChain with ``count_messages``'s OpenAI cost model: the
    cookbook's 3 per message plus every value (role, content, ``tool_call_id``), and each tool
    call's id, ``"function"``, name and compact sorted-key JSON arguments plus 1."""
    oh = OVERHEADS[FORMAT]
    count = counter.count
    dumps = json.dumps
    roles = {SystemMessage: "system", HumanMessage: "user", AIMessage: "assistant"}
    function = count("function")

    def count_list(messages: list[BaseMessage]) -> int:
        total = 0
        for m in messages:
            total += oh.per_message
            content = m.content
            if content:
                total += count(content)  # type: ignore[arg-type]  # always str here
            if type(m) is ToolMessage:
                total += count("tool") + count(m.tool_call_id)
                continue
            total += count(roles[type(m)])
            if type(m) is not AIMessage or not m.tool_calls:
                continue
            for call in m.tool_calls:
                args = dumps(
                    call["args"], sort_keys=True, separators=(",", ":"), ensure_ascii=False
                )
                total += count(call["id"] or "") + function + count(call["name"]) + count(args)
                total += oh.per_part
        return total

    return count_list


def request_tokens(count_list: Callable[[list[BaseMessage]], int], kept: list[BaseMessage]) -> int:
    return OVERHEADS[FORMAT].per_request + count_list(kept)


# --------------------------------------------------------------------------- checks


def pairs_intact_ours(messages: Sequence[Message]) -> bool:
    calls = [t for m in messages for t in m.tool_use_ids]
    results = [t for m in messages for t in m.tool_result_ids]
    return sorted(calls) == sorted(results) and _ordered(
        [(m.tool_use_ids, m.tool_result_ids) for m in messages]
    )


def pairs_intact_langchain(messages: Sequence[BaseMessage]) -> bool:
    rows: list[tuple[tuple[str, ...], tuple[str, ...]]] = []
    for m in messages:
        if isinstance(m, AIMessage):
            rows.append((tuple(c["id"] or "" for c in m.tool_calls), ()))
        elif isinstance(m, ToolMessage):
            rows.append(((), (m.tool_call_id,)))
        else:
            rows.append(((), ()))
    calls = sorted(t for c, _ in rows for t in c)
    results = sorted(t for _, r in rows for t in r)
    return calls == results and _ordered(rows)


def _ordered(rows: list[tuple[tuple[str, ...], tuple[str, ...]]]) -> bool:
    """Every result comes after its call."""
    seen: set[str] = set()
    for calls, results in rows:
        if any(r not in seen for r in results):
            return False
        seen.update(calls)
    return True


def is_suffix(kept: Sequence[Any], original: Sequence[Any], head: int) -> bool:
    """``kept`` is the first ``head`` messages plus a contiguous tail of ``original``."""
    tail = list(kept[head:])
    return list(kept[:head]) == list(original[:head]) and (
        not tail or tail == list(original[len(original) - len(tail) :])
    )


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common.common_arguments(parser)
    parser.add_argument("--messages", type=int, default=None, help="default 2,000")
    parser.add_argument("--max-tokens", type=int, default=None, help="default 8,000")
    parser.add_argument("--repeats", type=int, default=None, help="timed runs each (default 100)")
    args = parser.parse_args(argv)
    quick = args.quick
    n = args.messages or (120 if quick else 2_000)
    max_tokens = args.max_tokens or (1_000 if quick else 8_000)
    repeats = args.repeats or (3 if quick else 100)
    warmup = 2 if quick else 5
    data_dir = args.data_dir or common.default_data_dir()
    common.check_data(data_dir)

    messages = build_conversation(common.locomo_turns(data_dir), n)
    lc_messages = to_langchain(messages)
    counter = TiktokenCounter(ENCODING)
    count_list = langchain_counter(counter)
    per_request = OVERHEADS[FORMAT].per_request

    runners: dict[str, Callable[[], list[Any]]] = {
        OURS: partial(trim_history, messages, max_tokens, counter, format=FORMAT),
        LC_START_END: partial(
            trim_messages,
            lc_messages,
            max_tokens=max_tokens - per_request,
            strategy="last",
            token_counter=count_list,
            include_system=True,
            start_on="human",
            end_on=("human", "tool"),
        ),
        LC_DEFAULT: partial(
            trim_messages,
            lc_messages,
            max_tokens=max_tokens - per_request,
            strategy="last",
            token_counter=count_list,
            include_system=True,
        ),
    }
    times = {label: common.Samples() for label in runners}
    kept: dict[str, list[Any]] = {}
    for label, run in runners.items():
        for _ in range(warmup):
            kept[label] = run()
    for _ in range(repeats):
        for label, run in runners.items():
            result = times[label].add(common.time_call(run))
            if result != kept[label]:
                raise SystemExit(f"{label} returned a different result on a repeat run")

    # The same numbers through both cost models: they must agree message by message.
    parity = all(
        count_messages([m], counter, FORMAT) == count_list(to_langchain([m])) for m in messages
    )
    ours_label = OURS
    configs: list[dict[str, Any]] = []
    correctness: dict[str, bool] = {"counter_parity": parity}
    for label in runners:
        result = kept[label]
        if label == ours_label:
            as_lc = to_langchain(result)
            pairs = pairs_intact_ours(result)
            suffix = is_suffix(result, messages, 1)
            own_count = per_request + count_messages(result, counter, FORMAT)
        else:
            as_lc = result
            pairs = pairs_intact_langchain(result)
            suffix = is_suffix(result, lc_messages, 1)
            own_count = None
        tokens = request_tokens(count_list, as_lc)
        stats = times[label].stats()
        configs.append(
            {
                "label": label,
                "timings": stats,
                "messages_per_s": round(n / (stats["median_ms"] / 1000)),
                "messages_kept": len(result),
                "tokens_used": tokens,
                "tool_pairs_intact": pairs,
                "starts_after_system_with": type(as_lc[1]).__name__ if len(as_lc) > 1 else None,
                "contiguous_suffix": suffix,
            }
        )
        key = KEYS[label]
        correctness[f"{key}_tokens_le_max"] = tokens <= max_tokens
        correctness[f"{key}_system_kept"] = isinstance(as_lc[0], SystemMessage)
        if own_count is not None:
            correctness["ours_count_agrees_with_shared_counter"] = own_count == tokens
            correctness["ours_tool_pairs_intact"] = pairs
            correctness["ours_contiguous_suffix"] = suffix
    ours_median = configs[0]["timings"]["median_ms"]
    ratios = {c["label"]: round(c["timings"]["median_ms"] / ours_median, 2) for c in configs[1:]}
    ours_cpu = configs[0]["timings"]["cpu_median_ms"]
    cpu_ratios = {
        c["label"]: round(c["timings"]["cpu_median_ms"] / ours_cpu, 2) if ours_cpu else None
        for c in configs[1:]
    }

    kinds = {"system": 0, "user": 0, "assistant": 0, "assistant_tool_calls": 0, "tool": 0}
    parallel = 0
    for m in messages:
        calls = len(m.tool_use_ids)
        kinds["assistant_tool_calls" if calls else m.role] += 1
        parallel += calls > 1
    result_doc = common.base_result(
        "history_trim",
        "Trim a 2,000-message conversation with tool calls (LoCoMo dialogue turns, tool calls "
        "and results, some parallel) to 8,000 tokens. Ours: `contextfold.trim_history(messages, "
        "8000, counter, format='openai')`. Peer: LangChain `trim_messages(strategy='last', "
        "include_system=True)` with and without `start_on='human', end_on=('human','tool')`, "
        "given a list token counter that uses the same `TiktokenCounter` instance and the same "
        "OpenAI cost model (`max_tokens - 3` for the per-request overhead ours adds), messages "
        "converted once outside the timed region, runs interleaved. *Tokens used* is each result "
        "under that shared counter, per-request overhead included.",
        quick,
    )
    result_doc.update(
        {
            "parameters": {
                "n_messages": n,
                "messages_by_kind": {**kinds, "parallel_call_messages": parallel},
                "input_tokens": per_request + count_messages(messages, counter, FORMAT),
                "max_tokens": max_tokens,
                "encoding": ENCODING,
                "format": FORMAT,
                "repeats": repeats,
                "warmup": warmup,
                "tool_exchange_every": TOOL_EVERY,
                "data": ["locomo/locomo10.json"],
            },
            "configs": configs,
            "ratios_langchain_over_ours": ratios,
            "ratios_langchain_over_ours_cpu": cpu_ratios,
            "goals": {
                "min_ratio": RATIO_GOAL,
                "met": {label: r >= RATIO_GOAL for label, r in ratios.items()},
            },
            "correctness": correctness,
            "peak_rss_mb": common.peak_rss_mb(),
        }
    )
    path = common.write_result(result_doc, args.results_dir, args.results_md)
    for c in configs:
        t = c["timings"]
        print(
            f"{c['label']:<62} median {t['median_ms']:8.3f} ms  p95 {t['p95_ms']:8.3f} ms  "
            f"kept {c['messages_kept']:>5}  tokens {c['tokens_used']:>6,}  "
            f"pairs {'ok' if c['tool_pairs_intact'] else 'BROKEN'}"
        )
    for label, r in ratios.items():
        print(f"ratio {label} / ours: {r:.2f}x")
    bad = [k for k, v in correctness.items() if not v]
    print(f"correctness: {'ok' if not bad else 'FAILED ' + ', '.join(bad)}; wrote {path}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
