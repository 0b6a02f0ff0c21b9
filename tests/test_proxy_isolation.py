"""What one conversation may recall of another, through the real proxy and the real ``openai``
SDK: a shared prompt template, an edited message and a session token carried to another
credential each open only their own branch of the conversation tree, never what was said after
it. With the default configuration (no marker text in replies: conversations are found by the
history they resend), and the marker test again with markers opted in."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from contextfold.memory.engine import MemoryEngine
from contextfold.server.config import ProxySettings, ServerConfig
from contextfold.server.proxy.session import SESSION_HEADER, find_tokens
from fake_llm import FakeLLMServer
from proxy_support import Served, closed_after_test, serve

IBAN = "DE89 3704 0044 0532 0130 00"


def client(served: Served, api_key: str) -> openai.OpenAI:
    return closed_after_test(
        openai.OpenAI(base_url=f"{served.url}/v1", api_key=api_key, max_retries=0)
    )


def chat(api: openai.OpenAI, history: list[Any], text: str) -> str:
    """Send ``history`` plus the user message ``text``; append both and the reply (as the
    client received it) to ``history``; return the reply's session (from its header)."""
    history.append({"role": "user", "content": text})
    raw = api.chat.completions.with_raw_response.create(model="m", messages=history)
    reply = raw.parse().choices[0].message.content
    assert reply is not None
    history.append({"role": "assistant", "content": reply})
    return str(raw.headers[SESSION_HEADER]).split(".")[0]


def upstream_text(fake: FakeLLMServer) -> str:
    return fake.requests[-1].raw.decode()


@pytest.mark.parametrize("bob_key", ["sk-alice", "sk-bob"])
def test_a_shared_prompt_template_recalls_nothing_of_its_author(
    proxy: Served, fake_llm: FakeLLMServer, engine: MemoryEngine, bob_key: str
) -> None:
    fake_llm.reply = "Noted."
    alice, history = client(proxy, "sk-alice"), []
    alice_sid = chat(alice, history, "Help me set up my monthly bank transfers.")
    template = list(history)  # her first message and the reply she got, marker included
    chat(alice, history, f"My IBAN is {IBAN}.")
    chat(alice, history, "Thanks, that is all for today.")
    # Control: Alice herself, keeping only her last exchange, is reminded of it.
    chat(alice, history[-1:], "What is my IBAN?")
    assert IBAN in upstream_text(fake_llm)

    bob_sid = chat(client(proxy, bob_key), list(template), "What is my IBAN?")
    assert IBAN not in upstream_text(fake_llm) and "0532" not in upstream_text(fake_llm)
    assert bob_sid != alice_sid
    branch = engine.store.session(bob_sid)
    if bob_key == "sk-alice":  # the same credential: a branch of her first exchange
        assert (branch.parent_id, branch.fork_seq) == (alice_sid, 2)
    else:  # another credential: the template's marker opens nothing, a new conversation
        assert branch.parent_id is None
        assert engine.store.principal_of(bob_sid) != engine.store.principal_of(alice_sid)
    assert [t.message.text() for t in engine.store.turns(bob_sid)][-1] == "Noted."


def test_an_edited_message_never_recalls_what_it_replaced(
    proxy: Served, fake_llm: FakeLLMServer, engine: MemoryEngine
) -> None:
    fake_llm.reply = "Understood."
    api, history = client(proxy, "sk-test"), []
    sid = chat(api, history, "Let us plan the product launch.")
    chat(api, history, "The launch codename is BLUEFALCON, keep it secret.")
    # Control: the original branch, trimmed to its last reply, recalls the codename.
    chat(api, history[-1:], "What is the launch codename?")
    assert "BLUEFALCON" in upstream_text(fake_llm)

    edited = history[:2]  # u1, a1, then u2 rewritten
    branch = chat(api, edited, "Actually, what is the launch codename?")
    chat(api, edited, "Remind me of the codename once more.")
    assert "BLUEFALCON" not in upstream_text(fake_llm)
    assert all("BLUEFALCON" not in r.raw.decode() for r in fake_llm.requests[-2:])
    session = engine.store.session(branch)
    assert (session.parent_id, session.fork_seq) == (sid, 2)
    assert not any("BLUEFALCON" in t.message.text() for t in engine.store.turns(branch))


@pytest.mark.parametrize("markers", [False, True])
def test_a_token_minted_for_one_key_opens_nothing_for_another(
    fake_llm: FakeLLMServer, engine: MemoryEngine, markers: bool
) -> None:
    config = ServerConfig(port=0, proxy=ProxySettings(upstream=fake_llm.url, markers=markers))
    with serve(config, engine) as proxy:
        _a_token_opens_nothing_for_another(proxy, fake_llm, engine, markers)


def _a_token_opens_nothing_for_another(
    proxy: Served, fake_llm: FakeLLMServer, engine: MemoryEngine, markers: bool
) -> None:
    fake_llm.reply = "Okay."
    history: list[Any] = []
    victim = chat(client(proxy, "sk-alice"), history, "My locker code is 4417.")
    history.append({"role": "user", "content": "I will need it on Monday."})
    raw = client(proxy, "sk-alice").chat.completions.with_raw_response.create(
        model="m", messages=history
    )
    history.append({"role": "assistant", "content": raw.parse().choices[0].message.content})
    # The marker in the reply (opted in), or the session header, sent by someone else.
    tokens = find_tokens(history[-1]["content"])
    assert bool(tokens) == markers
    stolen = tokens[0] if markers else raw.headers[SESSION_HEADER]
    thief = openai.OpenAI(
        base_url=f"{proxy.url}/v1",
        api_key="sk-mallory",
        max_retries=0,
        default_headers={SESSION_HEADER: stolen},
    )
    taken = chat(thief, history[-1:], "What is my locker code?")
    assert "4417" not in upstream_text(fake_llm)
    assert taken != victim
    proxy.drain()
    assert proxy.events.recent()[-1].extra["session_source"] == "forged"
    # Nothing was written into the victim's conversation either.
    assert len(engine.store.turns(victim)) == 4
    assert engine.store.principal_of(taken) != engine.store.principal_of(victim)
