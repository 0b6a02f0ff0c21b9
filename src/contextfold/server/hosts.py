"""Loopback names, and the ``Host`` check that keeps DNS rebinding out of a local server.

A server bound to 127.0.0.1 is out of the network's reach, but not out of a browser's: a web
page can re-bind its own domain name to 127.0.0.1 and then read the server's answers as
same-origin. Its requests still carry its own name in ``Host``, so a server only this machine
should reach answers only requests whose ``Host`` names a loopback host. The dashboard
(``dashboard_guard``) and the open context API (``context_api``) both check it this way.

>>> foreign_host("127.0.0.1:5757"), foreign_host("[::1]:80"), foreign_host("localhost")
(None, None, None)
>>> foreign_host("rebound.example:5757")
'rebound.example'
"""

from __future__ import annotations

import ipaddress

__all__ = ["foreign_host", "host_of", "is_loopback"]


def is_loopback(host: str | None) -> bool:
    """Whether ``host`` (an address or a host name, without a port) is this machine's
    loopback: ``localhost`` (or a name under ``.localhost``), ``127.0.0.0/8`` or ``::1``.
    Other names count as not loopback.

    >>> [is_loopback(h) for h in ("127.0.0.1", "::1", "localhost", "0.0.0.0", "10.0.0.2")]
    [True, True, True, False, False]
    """
    if not host:
        return False
    host = host.strip().strip("[]").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def host_of(header: str) -> str:
    """The host name of a ``Host`` header value (``[::1]:5757`` → ``::1``)."""
    header = header.strip()
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header[1:]
    if header.count(":") == 1:  # name:port (a bare IPv6 address has several colons)
        return header.rpartition(":")[0]
    return header


def foreign_host(header: str | None) -> str | None:
    """The host a ``Host`` header names when that is not a loopback name (``""`` when the
    header is missing or empty), or ``None`` when it is one."""
    host = host_of(header or "")
    return None if is_loopback(host) else host
