"""``ServerState``: what every route of one server shares — its config, the one memory
engine (and store) all proxy instances use, the dashboard's event bus and the secret that
signs session tokens and keys principals.

The secret is ``$CONTEXTFOLD_SECRET`` (``config.secret_env``) when set; otherwise it is read
from ``<CONTEXTFOLD_HOME>/secret``, created once (32 random bytes, mode 0600), so a restart
keeps every conversation reachable.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from contextfold.errors import ConfigError
from contextfold.server.capture import BodyCapture
from contextfold.server.config import ServerConfig
from contextfold.server.event_log import EventLog
from contextfold.server.events import EventBus, PassThroughCounts
from contextfold.store.sqlite import home_dir

if TYPE_CHECKING:
    from contextfold.memory.engine import MemoryEngine

__all__ = ["ServerState", "load_secret"]


def load_secret(path: Path) -> bytes:
    """The secret in ``path``, created there (mode 0600) when missing."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        value = path.read_bytes().strip()
        if len(value) < 32:
            raise ConfigError(
                f"{path} holds {len(value)} bytes, too short for a secret (64 hex digits are"
                " written there when it is missing): delete it or set CONTEXTFOLD_SECRET"
            ) from None
        return value
    value = secrets.token_hex(32).encode()
    with os.fdopen(fd, "wb") as out:
        out.write(value + b"\n")
    return value


@dataclass
class ServerState:
    config: ServerConfig
    memory: MemoryEngine
    events: EventBus = field(default_factory=EventBus)
    # Requests forwarded without memory because of their route (``PassThroughCounts``).
    passed: PassThroughCounts = field(default_factory=PassThroughCounts)
    secret: bytes = b""
    memory_error: str | None = None  # why memory is down (the proxy forwards without it)
    # Freeze what start-up loaded out of the garbage collector once the models are warm, before
    # the server answers (``contextfold serve`` / ``proxy`` set it: it is process-wide).
    freeze_gc: bool = False
    # The terminal event log (``config.event_log``), and the raw bodies sent upstream
    # (``config.dashboard.capture``).
    log: EventLog = field(default_factory=lambda: EventLog(enabled=False))
    captures: BodyCapture = field(default_factory=BodyCapture)

    def __post_init__(self) -> None:
        settings = self.config.event_log
        self.log = EventLog(enabled=bool(settings.enabled), content=settings.content)
        self.captures = BodyCapture(
            keep=self.config.dashboard.capture_keep, enabled=self.config.dashboard.capture
        )
        if not self.secret:
            value = os.environ.get(self.config.secret_env)
            self.secret = value.encode() if value else load_secret(home_dir() / "secret")
