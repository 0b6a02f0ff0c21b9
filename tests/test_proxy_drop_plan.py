"""The history the proxy leaves out (``recall._planned_drop``): the raw messages whose every
parsed message the history filter removed, except where leaving one out would split a tool
call from its result or (Anthropic) leave an assistant turn first. Those few are kept, and
the rest is still left out: giving up on the whole filter sent the whole history (a coding
agent's request went back from 41 messages to all 169 at each new task, past the window)."""

from __future__ import annotations

from typing import Any

from contextfold.server.proxy.recall import _orphans, _planned_drop
from contextfold.server.proxy.wire import WIRES


def _openai_history() -> dict[str, Any]:
    """A user turn, then three tool calls each with its result, then a reply and a question;
    the first call makes two calls at once (its results are two messages)."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Fix the tests."}]
    calls = [
        {"id": f"c{i}", "type": "function", "function": {"name": "read", "arguments": "{}"}}
        for i in range(4)
    ]
    messages.append({"role": "assistant", "content": None, "tool_calls": calls[:2]})
    messages += [{"role": "tool", "tool_call_id": f"c{i}", "content": f"out {i}"} for i in (0, 1)]
    for i in (2, 3):
        messages.append({"role": "assistant", "content": None, "tool_calls": [calls[i]]})
        messages.append({"role": "tool", "tool_call_id": f"c{i}", "content": f"out {i}"})
    messages += [
        {"role": "assistant", "content": "Fixed."},
        {"role": "user", "content": "Thanks, what changed?"},
    ]
    return {"model": "gpt-x", "messages": messages}


def test_a_split_tool_call_keeps_its_pair_and_the_rest_is_still_left_out() -> None:
    wire = WIRES["openai"]
    body = _openai_history()
    parsed = wire.parse(body)
    # Parsed: 0 user, 1 the two-call message, 2 both its results (raw 2 and 3), 3-6 the two
    # other calls and results. The filter removed the user turn, the two-call message and the
    # third call and result (parsed 0, 1, 3, 4), not the two results: leaving raw 1 out
    # would split c0 and c1 from them.
    removed = {0, 1, 3, 4}
    drop, dropped = _planned_drop(wire, body, parsed, removed)
    kept = [m for i, m in enumerate(parsed.messages) if i not in set(dropped)]
    assert not _orphans(kept)
    assert drop == {0, 4, 5}  # the two-call message kept; the rest still left out
    assert dropped == [0, 3, 4]
    # Nothing to split: exactly what the filter removed.
    drop, _ = _planned_drop(wire, body, parsed, {0, 1, 2, 3, 4})
    assert drop == {0, 1, 2, 3, 4, 5}


def _anthropic_history() -> dict[str, Any]:
    """Two tasks of an agent: each a user turn, tool calls with their results (a result and
    the next text in one user turn), and a reply."""
    messages: list[dict[str, Any]] = []
    for task in range(2):
        messages.append({"role": "user", "content": f"Task {task}."})
        for i in range(3):
            ref = f"t{task}_{i}"
            use = {"type": "tool_use", "id": ref, "name": "Read", "input": {}}
            messages.append({"role": "assistant", "content": [{"type": "text", "text": "."}, use]})
            result = {"type": "tool_result", "tool_use_id": ref, "content": f"out {ref}"}
            messages.append({"role": "user", "content": [result]})
        messages.append({"role": "assistant", "content": f"Done {task}."})
    messages.append({"role": "user", "content": "What changed?"})
    return {"model": "claude-x", "max_tokens": 100, "messages": messages}


def test_every_removed_prefix_leaves_out_what_it_can_and_splits_no_tool_call() -> None:
    """Whatever the filter removes (every prefix, and every prefix with one message spared),
    what is left out splits no tool call from its result, leaves a user turn first where the
    provider wants one, and is only what the filter removed."""
    for name, body in (("openai", _openai_history()), ("anthropic", _anthropic_history())):
        wire = WIRES[name]
        parsed = wire.parse(body)
        n = len(parsed.messages)
        for k in range(n):
            for spared in (None, *range(k)):
                removed = set(range(k)) - {spared}
                drop, dropped = _planned_drop(wire, body, parsed, removed)
                kept = [m for i, m in enumerate(parsed.messages) if i not in set(dropped)]
                assert not _orphans(kept), (name, removed)
                assert set(dropped) <= removed, (name, removed)
                left = [i for i in range(len(wire.items(body))) if i not in drop]
                if name != "openai" and drop:
                    assert wire.raw_role(body, left[0]) == "user", (name, removed)
