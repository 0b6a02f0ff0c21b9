"""Being written: ``PostgresMemoryStore``."""

from __future__ import annotations

from typing import Any


class PostgresMemoryStore:
    def __init__(self, url: str, *, counter: Any = None) -> None:
        raise NotImplementedError("the PostgreSQL memory store is being written")
