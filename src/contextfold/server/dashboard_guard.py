"""Who may see the dashboard: loopback only by default, a bearer token otherwise.

The dashboard shows every proxied request's messages, so it is never open to the network by
accident. The rules, checked on every dashboard route:

- A token is configured (the variable ``DashboardSettings.token_env`` names, by default
  ``CONTEXTFOLD_DASHBOARD_TOKEN``, is set): every request must carry it, as
  ``Authorization: Bearer TOKEN`` or ``?token=TOKEN`` (the page keeps it for its own API and
  SSE calls). Missing or wrong: 401. A token shorter than 16 characters is refused (403).
- No token, the server bound to loopback (``127.0.0.1``, ``::1``, ``localhost``): the client
  must be on loopback and the ``Host`` header must name a loopback host, so a web page that
  re-binds its own domain name to 127.0.0.1 cannot read the dashboard (403 otherwise; the
  check is ``contextfold.server.hosts``, shared with the open context API).
- No token, the server bound to any other address (``0.0.0.0``, a LAN address): the dashboard
  is refused outright (403) with a message that says how to set the token.

``/dashboard/static/*`` (the package's own JS and CSS) needs no token; see ``static_guard``.

>>> DashboardGuard(bound_host="127.0.0.1", token=None).refusal is None
True
>>> print(DashboardGuard(bound_host="0.0.0.0", token=None).refusal)  # doctest: +ELLIPSIS
the dashboard is disabled: this server listens on 0.0.0.0, ...
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Callable
from dataclasses import dataclass

from fastapi import HTTPException, Request

from contextfold.server.config import ServerConfig
from contextfold.server.hosts import foreign_host, host_of, is_loopback

__all__ = ["MIN_TOKEN_LENGTH", "DashboardGuard", "host_of", "is_loopback", "static_guard"]

MIN_TOKEN_LENGTH = 16


@dataclass(frozen=True)
class DashboardGuard:
    """The access rules of the module docstring for a server bound to ``bound_host``;
    ``token`` is the configured token (``None``: none). Call it as a FastAPI dependency."""

    bound_host: str
    token: str | None
    token_env: str | None = "CONTEXTFOLD_DASHBOARD_TOKEN"

    @classmethod
    def from_config(cls, config: ServerConfig) -> DashboardGuard:
        """The guard for ``config``, reading the token from the environment now."""
        env = config.dashboard.token_env
        token = (os.environ.get(env) or "").strip() if env else ""
        return cls(bound_host=config.host, token=token or None, token_env=env)

    @property
    def refusal(self) -> str | None:
        """Why the dashboard may not be served at all with this configuration, or ``None``."""
        where = f"set {self.token_env}" if self.token_env else "set dashboard.token_env"
        if self.token is not None and len(self.token) < MIN_TOKEN_LENGTH:
            return (
                f"the dashboard is disabled: its token is {len(self.token)} characters long, "
                f"shorter than {MIN_TOKEN_LENGTH}; {where} to a long random string "
                '(e.g. python -c "import secrets; print(secrets.token_urlsafe(32))")'
            )
        if self.token is None and not is_loopback(self.bound_host):
            return (
                f"the dashboard is disabled: this server listens on {self.bound_host}, which "
                f"is not loopback, and no dashboard token is configured; {where} to a long "
                "random string and open /dashboard?token=…, or bind to 127.0.0.1"
            )
        return None

    def __call__(self, request: Request) -> None:
        """Let ``request`` through or raise the ``HTTPException`` that says why not."""
        refusal = self.refusal
        if refusal is not None:
            raise HTTPException(403, refusal)
        if self.token is not None:
            offered = _offered_token(request)
            if offered is None:
                raise HTTPException(
                    401,
                    "the dashboard needs its token: send Authorization: Bearer TOKEN or open "
                    "/dashboard?token=TOKEN",
                    headers={"WWW-Authenticate": 'Bearer realm="contextfold dashboard"'},
                )
            if not hmac.compare_digest(offered.encode(), self.token.encode()):
                raise HTTPException(
                    401,
                    "wrong dashboard token",
                    headers={"WWW-Authenticate": 'Bearer realm="contextfold dashboard"'},
                )
            return
        client = request.client.host if request.client else None
        if client is not None and not is_loopback(client):
            raise HTTPException(
                403,
                f"the dashboard answers loopback clients only without a token (you are "
                f"{client}); configure {self.token_env or 'a token'} to open it to others",
            )
        host = foreign_host(request.headers.get("host"))
        if host is not None:
            raise HTTPException(
                403,
                f"Host {host!r} is not a loopback name; open the dashboard as "
                "http://127.0.0.1:PORT/dashboard (or configure a token)",
            )


def static_guard(guard: DashboardGuard) -> Callable[[Request], None]:
    """The check for ``/dashboard/static/*``: the package's own JS and CSS, public files with
    no data in them, so a page can load them without putting its token in every URL. They are
    still refused when the dashboard is, and kept to loopback when no token is configured."""

    def check(request: Request) -> None:
        if guard.token is None or guard.refusal is not None:
            guard(request)

    return check


def _offered_token(request: Request) -> str | None:
    authorization = request.headers.get("authorization", "")
    scheme, _, value = authorization.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return request.query_params.get("token") or None
