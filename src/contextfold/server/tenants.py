"""API keys → tenants: who may read and write which tenants' knowledge.

``ContextApiSettings.api_keys`` names environment variables; each variable holds one key, and
the key owns the tenants listed for it (reads and writes). A caller sends its key as
``Authorization: Bearer KEY`` or ``X-API-Key: KEY``. Three modes:

- **keys configured**: a request without a key, or with a key no variable holds, is answered
  401; a known key sees exactly its tenants.
- **no keys, loopback** (``host`` is 127.0.0.1, ::1 or localhost): open — every caller sees
  every tenant, as befits a server only this machine can reach. Only requests whose ``Host``
  header names a loopback host are answered (403 otherwise), so a web page that re-binds its
  own domain name to 127.0.0.1 (DNS rebinding) cannot read or write it
  (``contextfold.server.hosts``). With keys, the key protects the API and ``Host`` is not
  checked (a reverse proxy may forward its public name).
- **no keys, any other host**: closed — every request is answered 401 with a message saying
  how to configure keys. (The rest of the server, the proxy included, keeps working.)

Keys are compared in constant time and never logged; a caller is named by its variable.

>>> auth = TenantAuth({"SUPPORT_KEY": ["support"]}, host="0.0.0.0",
...                   environ={"SUPPORT_KEY": "s3cret"})
>>> auth.authenticate("Bearer s3cret", None).tenants
frozenset({'support'})
>>> TenantAuth({}, host="127.0.0.1").authenticate(None, None).tenants is None
True
"""

from __future__ import annotations

import hmac
import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from contextfold.errors import ConfigError
from contextfold.server.guards import ApiError
from contextfold.server.hosts import foreign_host, is_loopback

__all__ = ["Caller", "TenantAuth", "is_loopback"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Caller:
    """Who is asking: ``tenants`` it owns (None: every tenant, the open loopback mode) and
    ``name``, the variable its key came from (``"open"`` without a key)."""

    tenants: frozenset[str] | None
    name: str

    def owns(self, tenant_id: str) -> bool:
        return self.tenants is None or tenant_id in self.tenants

    def visible(self, requested: Iterable[str]) -> list[str]:
        """The requested tenants this caller may see, in request order, without repeats."""
        return [t for t in dict.fromkeys(requested) if self.owns(t)]

    def require(self, tenant_id: str) -> None:
        """403 unless the caller owns ``tenant_id``."""
        if not self.owns(tenant_id):
            raise ApiError(
                403,
                "forbidden",
                f"this API key ({self.name}) does not own tenant {tenant_id!r}; "
                f"it owns {sorted(self.tenants or ())}",
            )


_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="contextfold"'}


class TenantAuth:
    """Resolves the configured key variables once and authenticates requests against them.

    A variable named in the config but unset (or empty) is a ``ConfigError`` at start-up: a
    key that silently fails to load would lock its tenants' agents out.
    """

    def __init__(
        self,
        api_keys: Mapping[str, list[str]],
        *,
        host: str,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        env = os.environ if environ is None else environ
        missing = sorted(name for name in api_keys if not env.get(name))
        if missing:
            raise ConfigError(
                f"context_api.api_keys names environment variables that are not set: "
                f"{', '.join(missing)}; export each with its API key, or remove it from "
                "the config"
            )
        self._keys: list[tuple[bytes, str, frozenset[str]]] = [
            (os.fsencode(env[name]), name, frozenset(tenants)) for name, tenants in api_keys.items()
        ]
        self.host = host
        self.open = not self._keys and is_loopback(host)
        self.closed = not self._keys and not self.open
        if self.closed:
            logger.warning(
                "the context API answers 401 to every request: the server binds to %s and "
                "no API keys are configured (context_api.api_keys)",
                host,
            )

    def admit_host(self, host_header: str | None) -> None:
        """403 when the API is open and ``host_header`` names no loopback host (see the
        module docs); nothing to check otherwise."""
        if not self.open:
            return
        host = foreign_host(host_header)
        if host is not None:
            raise ApiError(
                403,
                "forbidden",
                f"Host {host!r} is not a loopback name; this server binds to {self.host} with "
                "the context API open (no API keys), so it answers requests addressed to "
                "127.0.0.1, ::1 or localhost only (a guard against DNS rebinding); call it as "
                "http://127.0.0.1:PORT/api/..., or configure context_api.api_keys",
            )

    def authenticate(self, authorization: str | None, x_api_key: str | None) -> Caller:
        """The caller behind a request's ``Authorization`` / ``X-API-Key`` headers, or a 401."""
        if self.open:
            return Caller(tenants=None, name="open")
        if self.closed:
            raise ApiError(
                401,
                "unauthorized",
                f"the context API is closed: this server binds to {self.host} and no API "
                "keys are configured; list key variables under context_api.api_keys (or bind "
                "to 127.0.0.1 for open local access)",
                headers=_CHALLENGE,
            )
        key = _bearer(authorization) or (x_api_key or "").strip()
        if not key:
            raise ApiError(
                401,
                "unauthorized",
                "missing API key: send 'Authorization: Bearer <key>' or 'X-API-Key: <key>'",
                headers=_CHALLENGE,
            )
        given = key.encode("latin-1", "replace")  # the header bytes as sent
        names: list[str] = []
        tenants: set[str] = set()
        for secret, name, owned in self._keys:  # every key is compared: constant time
            if hmac.compare_digest(given, secret):
                names.append(name)
                tenants |= owned
        if not names:
            raise ApiError(401, "unauthorized", "unknown API key", headers=_CHALLENGE)
        return Caller(tenants=frozenset(tenants), name="+".join(names))


def _bearer(authorization: str | None) -> str:
    if not authorization:
        return ""
    scheme, _, value = authorization.strip().partition(" ")
    return value.strip() if scheme.lower() == "bearer" else ""
