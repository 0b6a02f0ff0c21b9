"""``BodyCapture``: the raw request bodies the proxy sent upstream, for the dashboard.

Opt-in (``dashboard.capture: true``, ``--capture-bodies``): bodies hold whole conversations.
A ring keeps the last ``keep`` (default 50); each entry is what went upstream — the client's
body with memory injected and compacted history left out, exactly the bytes forwarded —
parsed as JSON, with credentials redacted: values under keys that name a credential
(``api_key``, ``authorization``, ``token``, ``secret``, ``password`` …) anywhere in the body,
and the ``key=`` of a forwarded query string. Headers are not kept (the credentials are
there). The ring lives in the process (a restart empties it) and is bounded by bytes too.

>>> capture = BodyCapture(keep=2)
>>> for n in range(3):
...     capture.add(f"r{n}", "s", "openai", "/v1/chat/completions", b'{"api_key": "sk-1"}')
>>> [c["id"] for c in capture.entries()], capture.get("r2")["body"]
(['r2', 'r1'], {'api_key': '[redacted]'})
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from datetime import UTC, datetime
from typing import Any

__all__ = ["REDACTED", "BodyCapture", "redact"]

REDACTED = "[redacted]"

#: A key whose value is a credential (matched case-insensitively, ``-`` and ``_`` alike).
_SECRET_KEY = re.compile(
    r"(api[-_]?key|apikey|authorization|auth[-_]?token|access[-_]?token|refresh[-_]?token"
    r"|bearer|secret|password|passwd|credential|private[-_]?key|^token$|^key$)",
    re.IGNORECASE,
)
#: A string that is a credential wherever it appears (provider key shapes, bearer tokens).
_SECRET_VALUE = re.compile(
    r"\b(sk-[A-Za-z0-9_\-]{8,}|sk-ant-[A-Za-z0-9_\-]{8,}|AIza[0-9A-Za-z_\-]{20,}"
    r"|Bearer\s+[A-Za-z0-9._\-]{8,})"
)


def redact(value: Any) -> Any:
    """``value`` (decoded JSON) with every credential replaced by ``[redacted]``: values
    under credential keys, and key-shaped strings anywhere."""
    if isinstance(value, dict):
        return {
            k: REDACTED if isinstance(k, str) and _SECRET_KEY.search(k) else redact(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [redact(v) for v in value]
    if isinstance(value, str):
        return _SECRET_VALUE.sub(REDACTED, value)
    return value


def _redact_query(path: str) -> str:
    base, _, query = path.partition("?")
    if not query:
        return path
    parts = []
    for part in query.split("&"):
        name, eq, _ = part.partition("=")
        parts.append(f"{name}={REDACTED}" if eq and _SECRET_KEY.search(name) else part)
    return base + "?" + "&".join(parts)


class BodyCapture:
    """The last ``keep`` bodies (at most ``max_bytes`` of them), newest first when listed;
    ``enabled`` off: ``add`` keeps nothing. Thread-safe."""

    def __init__(self, keep: int = 50, *, enabled: bool = True, max_bytes: int = 64 << 20) -> None:
        self.keep = keep
        self.enabled = enabled
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, tuple[dict[str, Any], bytes]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def add(
        self, record_id: str, session_id: str, fmt: str, path: str, body: bytes, **info: Any
    ) -> None:
        """Keep ``body`` (the bytes sent upstream) under ``record_id``, the request's id."""
        if not self.enabled:
            return
        meta = {
            "id": record_id,
            "session_id": session_id,
            "format": fmt,
            "path": _redact_query(path),
            "captured_at": datetime.now(UTC).isoformat(),
            "bytes": len(body),
            **info,
        }
        with self._lock:
            old = self._entries.pop(record_id, None)
            if old is not None:
                self._bytes -= len(old[1])
            self._entries[record_id] = (meta, body)
            self._bytes += len(body)
            while len(self._entries) > self.keep or (
                self._bytes > self.max_bytes and len(self._entries) > 1
            ):
                _, (_, dropped) = self._entries.popitem(last=False)
                self._bytes -= len(dropped)

    def entries(self) -> list[dict[str, Any]]:
        """What is kept, newest first, without the bodies."""
        with self._lock:
            return [dict(meta) for meta, _ in reversed(self._entries.values())]

    def get(self, record_id: str) -> dict[str, Any] | None:
        """One capture with its body: the JSON sent upstream, credentials redacted (a body
        that is not JSON comes as text, redacted the same way)."""
        with self._lock:
            found = self._entries.get(record_id)
        if found is None:
            return None
        meta, raw = found
        try:
            body: Any = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
            body = raw.decode("utf-8", "replace")
        return {**meta, "body": redact(body)}

    def export(self) -> list[dict[str, Any]]:
        """Every capture with its body, newest first."""
        return [c for c in (self.get(m["id"]) for m in self.entries()) if c is not None]
