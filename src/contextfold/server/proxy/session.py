"""Who asks, and which turn of which conversation a request continues.

**Principal.** Every request belongs to the caller's credential: the principal is a keyed hash
(HMAC-SHA256 with the server secret) of the upstream API key the client sends
(``Authorization``, ``x-api-key``, ``x-goog-api-key`` or ``?key=``), never the key itself. A
request without one belongs to the anonymous principal ``""``. Nothing is ever looked up
across principals.

**Tokens.** Every reply carries a token in the ``x-contextfold-session`` header; with
``proxy.markers: true`` (an opt-in, see ``markers``) the proxy also appends
``"\\n\\n<!-- contextfold:session=<token> -->"`` to assistant replies. A
token ``<session>.<seq>.<mac>`` names one stored turn; ``<mac>`` is the first 32 hex digits of
HMAC-SHA256(secret, principal, session, seq). A token minted for one credential verifies for no
other, and an edited or forged one verifies for none: it opens nothing. Every marker is removed
from the messages before they go upstream.

**Position** (``resolve``). A conversation is a tree. The request's last assistant message
names the stored reply it continues — by its token, or by its content (the stored turns' match
keys) within the principal. The messages before it must agree with that reply's ancestors as
far back as the request goes (clients trim the front); the messages after it are exactly the
new ones. Where they disagree (an edited or forked chat, a prompt template two users share),
the request continues from the deepest turn where they still agree, on a new branch; with no
agreement it starts a new conversation. A branch that has moved on since the reply (someone
else continued it) is forked too, so a request never recalls what another continuation said.
A client that rebuilds the history it resends in another order (aider moves its file listing
after the chat, with the file's new contents) continues the branch whose last turns are its
messages in any order — each the same, or for at most a quarter of them a version of one
(``_reordered``) — before a partial agreement is taken for a fork. Under
``proxy.recall_scope: principal``, a request that would fork short of a reply — agreeing
only with messages its client wrote, like the fixed example exchanges that open every
conversation of a client — is a new conversation (``locate``).

>>> token = make_token("p", "abc", 4, b"secret")
>>> verify_token(token, "p", b"secret"), verify_token(token, "q", b"secret")
(('abc', 4), None)
>>> text = "Hello." + marker_text(token)
>>> find_tokens(text) == [token], strip_markers(text)
(True, 'Hello.')
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from contextfold._bounded import BoundedMemo, text_size
from contextfold.memory.assemble import Held
from contextfold.store.models import message_key

if TYPE_CHECKING:
    from contextfold.items import Message
    from contextfold.store.protocols import MemoryStorage

__all__ = [
    "SESSION_HEADER",
    "Position",
    "find_tokens",
    "locate",
    "make_token",
    "marker_text",
    "principal_of",
    "resolve",
    "side_call",
    "strip_markers",
    "verify_token",
]

SESSION_HEADER = "x-contextfold-session"
MARKER_PREFIX = "\n\n"
_MAC_HEX = 32
_ID = r"[A-Za-z0-9_-]{1,64}"
_MARKER = re.compile(
    r"(?:\n\n)?<!-- contextfold:session=(?P<token>"
    + _ID
    + r"(?:\.[0-9]{1,12})?\.[0-9a-fA-F]{1,64}) -->"
)
_TOKEN = re.compile(
    r"(?P<sid>" + _ID + r")\.(?P<seq>[0-9]{1,12})\.(?P<mac>[0-9a-f]{" + str(_MAC_HEX) + r"})"
)
_CREDENTIAL_HEADERS = ("authorization", "x-api-key", "x-goog-api-key", "api-key")


def _mac(principal: str, session_id: str, seq: int, secret: bytes) -> str:
    message = f"{principal}\x00{session_id}\x00{seq}".encode()
    return hmac.new(secret, message, hashlib.sha256).hexdigest()[:_MAC_HEX]


def make_token(principal: str, session_id: str, seq: int, secret: bytes) -> str:
    """``<session>.<seq>.<mac>``: what the marker and the session header carry."""
    return f"{session_id}.{seq}.{_mac(principal, session_id, seq, secret)}"


def verify_token(token: str, principal: str, secret: bytes) -> tuple[str, int] | None:
    """(session, seq) of a token whose MAC verifies for ``principal``, else None (compared in
    constant time)."""
    match = _TOKEN.fullmatch(token.strip())
    if match is None:
        return None
    sid, seq = match.group("sid"), int(match.group("seq"))
    expected = _mac(principal, sid, seq, secret)
    return (sid, seq) if hmac.compare_digest(match.group("mac"), expected) else None


def marker_text(token: str) -> str:
    """The text appended to an assistant reply."""
    return f"{MARKER_PREFIX}<!-- contextfold:session={token} -->"


def find_tokens(text: str) -> list[str]:
    """The tokens of every marker in ``text``, in order (verified or not)."""
    if "contextfold:session=" not in text:
        return []
    return [m.group("token") for m in _MARKER.finditer(text)]


def strip_markers(text: str) -> str:
    """``text`` without its markers (each with the blank line the proxy put before it)."""
    if "contextfold:session=" not in text:
        return text
    return _MARKER.sub("", text)


def principal_of(headers: Mapping[str, str], query: Mapping[str, str], secret: bytes) -> str:
    """The keyed hash of the request's credential (``""`` when it carries none)."""
    credential = next((headers[h] for h in _CREDENTIAL_HEADERS if headers.get(h)), None)
    if credential is None:
        credential = query.get("key")
    if not credential:
        return ""
    value = credential.strip()
    if value.lower().startswith("bearer "):
        value = value[7:].strip()
    digest = hmac.new(secret, b"principal\x00" + value.encode(), hashlib.sha256)
    return digest.hexdigest()[:32]


@dataclass
class Position:
    """Where a request stands in the conversation tree.

    ``session_id``: the branch it continues (``None``: a new conversation, created when its
    exchange is committed); ``anchor``: the seq of the turn it continues after (0: none);
    ``new_from``: the index in the parsed messages of the first new message; ``expect_last``:
    the branch's last seq when it was resolved (the commit forks if it has moved on);
    ``source``: how it was found — ``marker``, ``header``, ``history`` (by content), ``new``,
    ``latest`` (a new conversation continuing the caller's latest one, ``locate``),
    ``rewritten`` (by content, from an earlier reply: no branch holds the latest one as the
    client resent it, ``_earlier_reply``) or ``forged`` (a token that did not verify);
    ``fork``: the (session, seq) a branch must be forked from before anything is recalled or
    stored (``None``: continue in place)."""

    session_id: str | None
    anchor: int
    new_from: int
    source: str
    expect_last: int | None = None
    fork: tuple[str, int] | None = None


# The match keys of recently seen messages: a chat resends its whole history every request.
_MATCH_KEYS: BoundedMemo[tuple[str, str, bool], str] = BoundedMemo(
    entries=100_000, max_bytes=32 << 20
)


def _match_key(message: Message) -> str:
    """``message_key``, remembered for the texts seen lately (looking a text up costs a hash
    and a compare; its key costs a normalisation and a SHA-256). A message's text, and
    whether it calls tools, hold all its key reads (a call's arguments included)."""
    text = message.text()
    memo = (message.role, text, bool(message.tool_use_ids))
    return _MATCH_KEYS.get(memo, lambda: message_key(message), size=text_size(text))


def resolve(
    store: MemoryStorage,
    principal: str,
    messages: Sequence[Message],
    tokens: Sequence[str],
    header: str | None,
    secret: bytes,
) -> Position:
    """The position of a request whose (marker-free) messages are ``messages``; ``tokens``
    are the marker tokens found in them (the latest message's first), ``header`` the session
    header. Reads the store; writes nothing."""
    turns = [i for i, m in enumerate(messages) if m.role != "system"]
    keys = [_match_key(messages[i]) for i in turns]
    last = next(
        (k for k in range(len(turns) - 1, -1, -1) if messages[turns[k]].role == "assistant"), None
    )
    offered = [t for t in ([header] if header else []) + list(tokens) if t]
    # The header, and the latest marker that verifies: a chat resends a marker with every
    # reply, and the older ones name the same branch further back.
    named: list[tuple[str, int, str]] = []
    for token in offered:
        found = verify_token(token, principal, secret)
        if found is not None:
            named.append((*found, "header" if token == header else "marker"))
            if token != header:
                break
    if last is None:
        if named:  # a client that keeps no history continues the turn its header names
            sid, seq, source = named[0]
            if store.turn_keys(sid, seq, seq):
                return _continue(store, sid, seq, 0, source)
        return Position(None, 0, 0, "forged" if offered and not named else "new")
    new_from = turns[last + 1] if last + 1 < len(turns) else len(messages)
    candidates: list[tuple[str, int, str]] = []
    for sid, _, source in named:
        candidates += [
            (s, q, source) for s, q in store.turns_with_key(principal, keys[last], session_id=sid)
        ]
    candidates += [(s, q, "history") for s, q in store.turns_with_key(principal, keys[last])]
    best: tuple[int, str, int, str, int] | None = None  # (agreeing, session, fork seq, source, new)
    seen: set[tuple[str, int]] = set()
    for sid, seq, source in candidates:
        if (sid, seq) in seen:
            continue
        seen.add((sid, seq))
        depth = min(last, seq - 1)  # how far back both the request and the branch go
        stored = store.turn_keys(sid, seq - depth, seq)
        agree = 0
        for j in range(depth + 1):
            if stored.get(seq - depth + j) != keys[last - depth + j]:
                break
            agree += 1
        if agree == depth + 1:
            return _continue(store, sid, seq, new_from, source)
        if agree and (best is None or agree > best[0]):
            best = (agree, sid, seq - depth + agree - 1, source, turns[last - depth + agree])
    held = _reordered(store, candidates, keys[: last + 1], [messages[i] for i in turns[: last + 1]])
    if held is not None:
        sid, seq, source = held
        return _continue(store, sid, seq, new_from, source)
    if best is not None:
        _, sid, seq, source, first_new = best
        return Position(sid, seq, first_new, source, fork=(sid, seq))
    for sid, seq, source in named:
        # A verified token whose reply the client rewrote: continue after the named turn when
        # the message before the reply is the one stored before it.
        before = store.turn_keys(sid, seq - 1, seq - 1).get(seq - 1)
        if last == 0 or before == keys[last - 1]:
            return _continue(store, sid, seq, new_from, source)
    earlier = _earlier_reply(store, principal, messages, turns, keys, last)
    if earlier is not None:
        return earlier
    return Position(None, 0, 0, "forged" if offered and not named else "new")


def _earlier_reply(
    store: MemoryStorage,
    principal: str,
    messages: Sequence[Message],
    turns: Sequence[int],
    keys: Sequence[str],
    last: int,
) -> Position | None:
    """No stored branch holds the request's latest reply: the client rewrote it (it drops
    or re-renders what the model said), or what was stored of it differs (a reply cut off).
    One of its earlier replies (the newest ``_EARLIER_REPLIES``) still names the branch: when
    the request agrees with the branch up to that reply, it continues from there, on a new
    branch, and only what follows that reply is new — not the whole history again."""
    earlier = [k for k in range(last - 1, -1, -1) if messages[turns[k]].role == "assistant"]
    for k in earlier[:_EARLIER_REPLIES]:
        for sid, seq in store.turns_with_key(principal, keys[k]):
            depth = min(k, seq - 1)
            stored = store.turn_keys(sid, seq - depth, seq)
            if all(stored.get(seq - depth + j) == keys[k - depth + j] for j in range(depth + 1)):
                return _continue(store, sid, seq, turns[k + 1], "rewritten")
    return None


def locate(
    store: MemoryStorage,
    principal: str,
    messages: Sequence[Message],
    tokens: Sequence[str],
    header: str | None,
    secret: bytes,
    *,
    scope: str = "conversation",
) -> tuple[Position, tuple[str, int] | None]:
    """``resolve``, then fork the branch it asks for: (the position, with ``fork`` done and
    ``None``; the (session, seq) forked from, or ``None``). Writes only when it forks.

    ``scope="principal"`` (``proxy.recall_scope``): a request that starts a new conversation
    continues, on a new branch, after the last turn of the caller's conversation that stored
    a turn last, so it recalls what the credential's earlier conversations held (a coding
    agent's next session remembers the last one). Its messages are all new. So is, under that
    scope, a request found by its history that would fork its branch short of a reply
    (``_agrees_short_of_a_reply``): it shares only messages its client wrote itself, like the
    fixed example exchanges that open every aider session, and a fork there would cut it off
    from what the credential's conversations said. A fork after a reply (an edit) stays a
    fork, under either scope."""
    position = resolve(store, principal, messages, tokens, header, secret)
    if scope == "principal" and _agrees_short_of_a_reply(store, position):
        # It shares only what its client wrote (the opening it sends every conversation),
        # not a reply: a new conversation, not a fork of that one.
        position = Position(None, 0, 0, "new")
    if position.fork is None and position.source == "new" and scope == "principal":
        latest = store.latest_session(principal)
        if latest is not None:
            position = Position(None, latest[1], 0, "latest", fork=latest)
    if position.fork is None:
        return position, None
    parent, seq = position.fork
    branch = store.fork(parent, seq)
    return Position(branch, seq, position.new_from, position.source, expect_last=seq), (
        parent,
        seq,
    )


def side_call(messages: Sequence[Message], body: Mapping[str, object]) -> str | None:
    """Why a request looks like an agent's helper call beside its conversation (a title or
    topic, a warm-up, a quota probe, a commit message), or None. Only a one-shot request (no
    reply in its history) can be one, and then when it offers no tools (an agent's main loop
    always does; aider's main conversation is no one-shot: it opens with example exchanges),
    asks for at most one token, or says one word ("Warmup"). Used with
    ``proxy.recall_scope: principal``, where a new conversation would otherwise continue the
    credential's latest one."""
    if any(m.role == "assistant" for m in messages):
        return None
    if not body.get("tools"):
        return "a one-shot request without tools"
    limit = body.get("max_tokens", body.get("max_output_tokens"))
    if isinstance(limit, int) and limit <= 1:
        return "a one-shot request for one token"
    users = [m.text().strip() for m in messages if m.role == "user"]
    if len(users) == 1 and users[0] and len(users[0].split()) == 1 and len(users[0]) <= 32:
        return f"a one-shot request saying {users[0]!r}"
    return None


def _continue(store: MemoryStorage, sid: str, seq: int, new_from: int, source: str) -> Position:
    last = store.last_seq(sid)
    if last == seq:
        return Position(sid, seq, new_from, source, expect_last=seq)
    return Position(sid, seq, new_from, source, fork=(sid, seq))


#: How many replies before the latest ``resolve`` looks up when no branch holds the latest.
_EARLIER_REPLIES = 4
#: How many of a branch's closest windows ``_reordered`` compares by content (``_versions``).
_VERSION_WINDOWS = 2


def _reordered(
    store: MemoryStorage,
    candidates: Sequence[tuple[str, int, str]],
    keys: Sequence[str],
    history: Sequence[Message],
) -> tuple[str, int, str] | None:
    """Where the request's ``history`` (its messages up to its last reply; ``keys``, their
    match keys) is held in another order: (session, seq, source) of the deepest turn ``seq``
    of the first of the ``candidates``' branches (the turns stored like that reply: named
    ones first, then the newest) whose last ``len(keys)`` turns up to ``seq`` are those
    messages, or None. A turn and a message are the same when their match keys are; at most
    a quarter of them may instead be versions of each other (``_versions``: a file listing
    re-sent with the file's new contents). A client that rebuilds the history it resends
    (aider puts its file listing after the chat, and restores the chat from its Markdown
    transcript) is recognised by what it holds, not by where."""
    size = len(keys)
    if size < 2:
        return None
    want = Counter(keys)
    branches: dict[str, tuple[int, int, str]] = {}  # sid -> (lowest seq, highest, source)
    for sid, seq, source in candidates:
        low, high, first = branches.get(sid, (seq, seq, source))
        branches[sid] = (min(low, seq), max(high, seq), first)
    for sid, (first_seq, last_seq, source) in branches.items():
        # the windows that hold one of the candidate turns
        low, high = max(first_seq, size), min(last_seq + size - 1, store.last_seq(sid))
        if low > high:  # the branch is shorter than the history
            continue
        stored = store.turn_keys(sid, low - size + 1, high)
        # diff: how many more times the history holds a key than the window of turns
        # ending at ``end`` does; slid one turn down at a time
        diff: dict[str | None, int] = {}
        diff.update(want)
        for q in range(high - size + 1, high + 1):
            diff[stored.get(q)] = diff.get(stored.get(q), 0) - 1
        apart = sum(abs(v) for v in diff.values())
        near: list[tuple[int, int]] = []  # (apart, -end) of windows versions might explain
        for end in range(high, low - 1, -1):
            if apart == 0:
                return sid, end, source
            if 2 * apart <= size:
                near.append((apart, -end))
            if end == low:
                break
            for key, step in ((stored.get(end), 1), (stored.get(end - size), -1)):
                before = diff.get(key, 0)
                diff[key] = before + step
                apart += abs(before + step) - abs(before)
        # Comparing versions reads the texts: only the closest windows are worth it (a long
        # history slid by a few turns is near by count alone, and comparing every such window
        # cost seconds on a megabyte of history).
        for _, end in sorted(near)[:_VERSION_WINDOWS]:
            window: dict[str | None, int] = {}
            window.update(want)
            for q in range(-end - size + 1, -end + 1):
                window[stored.get(q)] = window.get(stored.get(q), 0) - 1
            if _versions(store, sid, -end, window, stored, keys, history):
                return sid, -end, source
    return None


def _versions(
    store: MemoryStorage,
    sid: str,
    end: int,
    diff: Mapping[str | None, int],
    stored: Mapping[int, str],
    keys: Sequence[str],
    history: Sequence[Message],
) -> bool:
    """Whether the window's turns the history lacks and the history's messages the window
    lacks pair up, each turn with a message of its role that is a version of it: at least
    3 lines of 8 or more characters, half of them in the other (``assemble.Held``, the rule
    that leaves an older version of what a request holds out of its recall)."""
    left = dict(diff)  # > 0: messages of that key the window lacks; < 0: turns
    missing: list[Message] = []
    for key, m in zip(keys, history, strict=True):
        if left.get(key, 0) > 0:
            left[key] -= 1
            missing.append(m)
    extra: list[int] = []
    for q in range(end - len(keys) + 1, end + 1):
        turn_key = stored.get(q)
        if left.get(turn_key, 0) < 0:
            left[turn_key] += 1
            extra.append(q)
    rows = store.turn_rows(sid, extra)
    free = list(missing)
    for q in extra:
        row = rows.get(q)
        if row is None:
            return False
        pair = next(
            (
                m
                for m in free
                if m.role == row.role
                and (Held([m.text()]).holds(row.text) or Held([row.text]).holds(m.text()))
            ),
            None,
        )
        if pair is None:
            return False
        free.remove(pair)
    return not free


def _agrees_short_of_a_reply(store: MemoryStorage, position: Position) -> bool:
    """Whether a request found by its history forks its branch after a turn that is no
    reply: that turn and the next were stored by one exchange (they share its time; a reply
    is the last turn its exchange stored). The request then agrees with the branch only as
    far as messages a client wrote into one request itself — the opening every conversation
    of that client begins with (aider's example exchanges) — and diverges before the model
    answered them."""
    if position.fork is None or position.source != "history":
        return False
    sid, seq = position.fork
    times = store.turn_times(sid, [seq, seq + 1])
    return len(times) == 2 and times[seq] == times[seq + 1]
