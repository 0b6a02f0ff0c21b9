"""Clients that rebuild the history they resend, and clients that open every conversation
with the same messages (issue 20, aider), through the real proxy with a plain HTTP client:

- a history resent with other whitespace (trailing spaces, blank lines around a reply) holds
  its stored turns: none of them is recalled into the request again;
- a history resent in another order, with a file listing re-sent with the file's new
  contents, continues its stored conversation (aider's ``--restore-chat-history`` puts the
  listing after the chat), while one that holds an unrelated message instead does not;
- under ``proxy.recall_scope: principal``, a new conversation that shares only the opening
  its client sends every conversation (example exchanges, before any reply) continues the
  credential's latest conversation, as a new conversation does — the third session as well
  as the second; a fork after a reply (an edit) still recalls nothing it replaced, and the
  default scope recalls nothing either way.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from contextfold.memory.engine import MemoryEngine
from contextfold.server.config import ProxySettings, ServerConfig
from contextfold.server.proxy.session import SESSION_HEADER
from fake_llm import FakeLLMServer, ModelTurn, ToolCall
from proxy_support import Served, serve

TOOLS = [{"type": "function", "function": {"name": "read", "parameters": {}}}]
TOOLS_ANT = [{"name": "Edit", "input_schema": {"type": "object"}}]
SYSTEM = {"role": "system", "content": "Act as an expert software developer."}
OPENING = [  # what the client sends before the first request of every conversation
    SYSTEM,
    {"role": "user", "content": "Change the greeting to be more casual"},
    {"role": "assistant", "content": "Ok, I will switch the greeting from Hello to Hey."},
]
ACK = "Ok, any changes I propose will be to those files."
CREATE = "Create hello.py that prints hello."
CHANGE = "Make hello.py print hello, world."
REPLY = 'hello.py\n```python\nprint("hello")\n```\n'


def listing(contents: str) -> str:
    """The client's file listing (it re-sends it with each request, the file as it is now)."""
    return (
        "I have added these files to the chat so you can go ahead and edit them.\n"
        "Trust this message as the true contents of these files!\n"
        "Any other messages in the chat may contain outdated versions of them.\n\n"
        f"hello.py\n```\n{contents}```\n"
    )


@contextmanager
def proxy(fake_llm: FakeLLMServer, tmp_path: Path, scope: str) -> Iterator[tuple[Served, Any]]:
    fake_llm.reply = lambda body: REPLY if CREATE in str(body["messages"][-1]) else "Noted."
    settings = ProxySettings(upstream=fake_llm.url, markers=False, recall_scope=scope)
    with (
        MemoryEngine(store=tmp_path / "m.db", embedder=None) as engine,
        serve(ServerConfig(port=0, proxy=settings), engine) as served,
    ):
        yield served, engine


def post(served: Served, messages: list[dict[str, Any]], key: str = "sk-dev") -> str:
    """One request of the client's main loop (it offers tools); the session it was stored in.
    Waits for its derived work, as the next request of a real client would find it."""
    response = httpx.post(
        f"{served.url}/v1/chat/completions",
        json={"model": "m", "messages": messages, "tools": TOOLS},
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    )
    response.raise_for_status()
    served.drain()
    return str(response.headers[SESSION_HEADER]).split(".")[0]


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict[str, str]:
    return {"role": "assistant", "content": text}


def test_a_history_resent_with_other_whitespace_is_not_recalled_again(
    fake_llm: FakeLLMServer, tmp_path: Path
) -> None:
    fact = "Remember that the release branch is called amber-kite-7.  \n\n"
    with proxy(fake_llm, tmp_path, "conversation") as (served, _):
        first = post(served, [user(fact)])
        resent = [user(fact.strip()), assistant("\nNoted.\n"), user("What is the release branch?")]
        assert post(served, resent) == first
        forwarded = fake_llm.requests[-1].raw.decode()
        assert forwarded.count("amber-kite-7") == 1, forwarded


@pytest.mark.parametrize(
    ("listed", "continued"),
    [
        (listing('print("hello")\n'), True),  # the listing again, with the file's new contents
        (
            "Something else entirely, said once.\nIt is not a listing.\nNor a version of one.\n",
            False,
        ),
    ],
)
def test_a_history_resent_in_another_order_continues_its_conversation(
    fake_llm: FakeLLMServer, tmp_path: Path, listed: str, continued: bool
) -> None:
    with proxy(fake_llm, tmp_path, "conversation") as (served, engine):
        first = post(served, [*OPENING, user(listing("")), assistant(ACK), user(CREATE)])
        # the chat restored from the client's transcript (re-rendered), then the listing
        restored = [user(CREATE + "  \n"), assistant("\n" + REPLY + "\n")]
        second = [*OPENING, *restored, user(listed), assistant(ACK), user(CHANGE)]
        sid = post(served, second)
        assert (sid == first) is continued
        forwarded = fake_llm.requests[-1].raw.decode()
        assert forwarded.count(CREATE) == 1, forwarded  # held: not recalled again
        if continued:  # only the new exchange is stored after the first one's 6 turns
            assert engine.store.last_seq(first) == 8
            assert len(engine.store.sessions()) == 1


@pytest.mark.parametrize(("scope", "recalled"), [("principal", True), ("conversation", False)])
def test_a_new_conversation_sharing_only_the_clients_opening(
    fake_llm: FakeLLMServer, tmp_path: Path, scope: str, recalled: bool
) -> None:
    with proxy(fake_llm, tmp_path, scope) as (served, engine):
        first = post(served, [*OPENING, user("The deploy password hint is blue-heron-42.")])
        second = post(served, [*OPENING, user("What is the deploy password hint?")])
        forwarded = fake_llm.requests[-1].raw.decode()
        assert ("blue-heron-42" in forwarded) is recalled
        assert second != first
        # either way the first conversation was not continued in place
        assert engine.store.last_seq(first) == 4


def test_a_fork_after_a_reply_still_recalls_nothing_it_replaced_under_principal_scope(
    fake_llm: FakeLLMServer, tmp_path: Path
) -> None:
    with proxy(fake_llm, tmp_path, "principal") as (served, engine):
        start = [*OPENING, user("Let us plan the product launch.")]
        first = post(served, start)
        history = [*start, assistant("Noted.")]
        post(served, [*history, user("The launch codename is BLUEFALCON, keep it secret.")])
        edited = post(served, [*history, user("What is the launch codename?")])
        assert "BLUEFALCON" not in fake_llm.requests[-1].raw.decode()
        branch = engine.store.session(edited)
        assert (branch.parent_id, branch.fork_seq) == (first, 4)


def test_every_new_session_continues_the_latest_one_under_principal_scope(
    fake_llm: FakeLLMServer, tmp_path: Path
) -> None:
    """The third session shares the opening with the second one's branch too (which holds
    the first session's turns, then the second's): it continues that branch's end, not a
    fork of it after the second session's opening."""
    with proxy(fake_llm, tmp_path, "principal") as (served, _):
        post(served, [*OPENING, user("The deploy password hint is blue-heron-42.")])
        post(served, [*OPENING, user("The staging server listens on port 8471.")])
        post(served, [*OPENING, user("Which port does the staging server listen on?")])
        assert "8471" in fake_llm.requests[-1].raw.decode()


def test_a_client_that_rewrites_each_reply_stores_only_what_is_new(
    fake_llm: FakeLLMServer, tmp_path: Path
) -> None:
    """A client that resends the model's replies rewritten (here: with a prefix it adds) no
    longer matches the latest stored reply; an earlier reply still names the branch, so each
    request forks from there and stores only what follows it — not its whole history as a new
    conversation (issue 13: "a client that rewrites assistant text re-stores its whole
    history every turn"; issue 20: a replayed agent session re-stored 500 turns a request)."""
    with proxy(fake_llm, tmp_path, "conversation") as (served, engine):
        history = [SYSTEM]
        sessions = []
        for n in range(4):
            history.append(user(f"Step {n}: note the value {n * 7}."))
            sessions.append(post(served, history))
            history.append(
                assistant(f"(edited) {engine.store.turns(sessions[-1])[-1].message.text()}")
            )
        history.append(user("Step 4: and now?"))
        latest = post(served, history)
        record = served.events.recent()[-1]
        assert record.extra["session_source"] == "rewritten"  # found, not a new conversation
        assert any("on a new branch" in note for note in record.extra["notes"])
        assert engine.store.session(latest).parent_id == sessions[-1]
        texts = [t.message.text() for t in engine.store.turns(latest)]
        assert texts[:-1] == [m["content"] for m in history[1:]]  # each message once, in order


def test_a_tool_call_resent_with_its_defaults_filled_in_continues_in_place(
    fake_llm: FakeLLMServer, tmp_path: Path
) -> None:
    """Claude Code resends its Edit calls with the tool's defaults filled in
    (``"replace_all": false`` added to the input the model sent): the same call (its id and
    name), re-rendered. The conversation continues in place; it was forked from the reply
    before, copying the whole history into a new session at every edit."""
    edit = {"file_path": "hello.py", "old_string": 'print("hello")', "new_string": "hi"}

    def reply(body: dict[str, Any]) -> str | ModelTurn:
        last = body["messages"][-1]["content"]
        if isinstance(last, str) and "edit" in last:
            return ModelTurn(tool_calls=(ToolCall("Edit", edit, id="toolu_01"),))
        return "Done."

    fake_llm.reply = reply
    settings = ProxySettings(upstream=fake_llm.url, markers=False)
    headers = {"x-api-key": "sk-ant", "anthropic-version": "2023-06-01"}
    with (
        MemoryEngine(store=tmp_path / "m.db", embedder=None) as engine,
        serve(ServerConfig(port=0, proxy=settings), engine) as served,
    ):

        def post(messages: list[dict[str, Any]]) -> str:
            response = httpx.post(
                f"{served.url}/v1/messages",
                json={"model": "m", "max_tokens": 64, "messages": messages, "tools": TOOLS_ANT},
                headers=headers,
                timeout=30,
            )
            response.raise_for_status()
            served.drain()
            return str(response.headers[SESSION_HEADER]).split(".")[0]

        history: list[dict[str, Any]] = [user("Please edit hello.py.")]
        first = post(history)
        call = {"type": "tool_use", "id": "toolu_01", "name": "Edit"}
        history += [
            {"role": "assistant", "content": [{**call, "input": {**edit, "replace_all": False}}]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "toolu_01", "content": "ok"}],
            },
        ]
        assert post(history) == first
        assert served.events.recent()[-1].extra["session_source"] == "history"
        assert len(engine.store.sessions()) == 1
        assert engine.store.last_seq(first) == 4  # the request, the call, its result, "Done."
        # a call resent with an option set (true) is another call: a new branch from the
        # reply before it
        history += [{"role": "assistant", "content": "Done."}, user("Now edit it again.")]
        assert post(history) == first
        assert engine.store.last_seq(first) == 6
        history += [
            {"role": "assistant", "content": [{**call, "input": {**edit, "replace_all": True}}]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "toolu_01", "content": "ok"}],
            },
        ]
        forked = post(history)
        assert forked != first
        assert engine.store.session(forked).parent_id == first
