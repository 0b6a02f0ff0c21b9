"""Session continuity for the proxy: a marker that carries a session id and its HMAC.

The proxy appends ``MARKER_PREFIX + "<!-- contextfold:session=<id>.<mac> -->"`` to every
assistant reply it returns; clients keep the reply in their history and send it back with the
next request, so the proxy finds the session again. ``<mac>`` is the first 32 hex digits of
HMAC-SHA256(server secret, id): a marker whose MAC does not verify (forged, edited, or made by a
server with another secret) opens no session — the request starts a new one. Every marker,
valid or not, is removed from the messages before they go upstream, so the model never sees
one and the history bytes stay what the model produced (prompt caches keep hitting).

A client that rewrites assistant text can send the same token (``<id>.<mac>``) in the
``x-contextfold-session`` header instead; the proxy returns it in that header on every reply.

>>> token = make_token("abc", b"secret")
>>> verify_token(token, b"secret"), verify_token(token, b"other")
('abc', None)
>>> text = "Hello." + marker_text(token)
>>> find_tokens(text) == [token], strip_markers(text)
(True, 'Hello.')
"""

from __future__ import annotations

import hashlib
import hmac
import re
import uuid

__all__ = [
    "SESSION_HEADER",
    "find_tokens",
    "make_token",
    "marker_text",
    "new_session_id",
    "strip_markers",
    "verify_token",
]

SESSION_HEADER = "x-contextfold-session"
MARKER_PREFIX = "\n\n"
_MAC_HEX = 32
_ID = r"[A-Za-z0-9_-]{1,64}"
_MARKER = re.compile(
    r"(?:\n\n)?<!-- contextfold:session=(?P<token>" + _ID + r"\.[0-9a-fA-F]{1,64}) -->"
)
_TOKEN = re.compile(r"(?P<sid>" + _ID + r")\.(?P<mac>[0-9a-f]{" + str(_MAC_HEX) + r"})")


def new_session_id() -> str:
    return uuid.uuid4().hex


def _mac(session_id: str, secret: bytes) -> str:
    return hmac.new(secret, session_id.encode(), hashlib.sha256).hexdigest()[:_MAC_HEX]


def make_token(session_id: str, secret: bytes) -> str:
    """``<id>.<mac>``: what the marker and the session header carry."""
    return f"{session_id}.{_mac(session_id, secret)}"


def verify_token(token: str, secret: bytes) -> str | None:
    """The session id of a token whose MAC verifies, else None (compared in constant time)."""
    match = _TOKEN.fullmatch(token.strip())
    if match is None:
        return None
    sid = match.group("sid")
    return sid if hmac.compare_digest(match.group("mac"), _mac(sid, secret)) else None


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
