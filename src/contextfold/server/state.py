"""``ServerState``: what every route of one server shares — its config, the one memory
engine (and store) all proxy instances use, the dashboard's event bus and the session-marker
secret."""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from contextfold.server.config import ServerConfig
from contextfold.server.events import EventBus

if TYPE_CHECKING:
    from contextfold.memory.engine import MemoryEngine

__all__ = ["ServerState"]


@dataclass
class ServerState:
    config: ServerConfig
    memory: MemoryEngine
    events: EventBus = field(default_factory=EventBus)
    secret: bytes = b""

    def __post_init__(self) -> None:
        if not self.secret:
            value = os.environ.get(self.config.secret_env)
            # Without a configured secret, markers are valid for this process's lifetime only.
            self.secret = value.encode() if value else secrets.token_bytes(32)
