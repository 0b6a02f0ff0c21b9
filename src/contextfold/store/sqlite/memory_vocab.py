"""``MemoryStore``'s vocabulary state: tag aliases (store-wide, or scoped to one session), the
tags the splitter has examined with the sub-tags it made, and the session's related-tag counts.

``SqliteVocab`` holds these methods: ``MemoryStore.vocab`` (``memory.py``), made with the
store's connections (``memory_db.MemoryDb``).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence

from contextfold.errors import ConfigError
from contextfold.store.models import _iso, _now
from contextfold.store.sqlite.connection import pairs
from contextfold.store.sqlite.memory_db import MemoryDb

__all__ = ["SqliteVocab"]


class SqliteVocab:
    """``store.vocab``: aliases, tag splits and related-tag counts, over the store's
    ``MemoryDb``."""

    def __init__(self, db: MemoryDb) -> None:
        self._db = db

    # -- aliases --------------------------------------------------------------------------------

    def set_alias(self, alias: str, canonical: str, *, session_id: str | None = None) -> None:
        """Make ``alias`` resolve to ``canonical``: in every session, or only in
        ``session_id`` (``ConfigError`` when there is no such session)."""
        try:
            with self._db.tx() as conn:
                if session_id is None:
                    conn.execute(
                        "INSERT INTO aliases (alias, canonical) VALUES (?, ?)"
                        " ON CONFLICT (alias) DO UPDATE SET canonical = excluded.canonical",
                        (alias, canonical),
                    )
                else:
                    conn.execute(
                        "INSERT INTO session_aliases (session_id, alias, canonical)"
                        " VALUES (?, ?, ?) ON CONFLICT (session_id, alias)"
                        " DO UPDATE SET canonical = excluded.canonical",
                        (session_id, alias, canonical),
                    )
        except sqlite3.IntegrityError:
            raise ConfigError(f"no session {session_id!r}") from None

    def aliases(self, session_id: str | None = None) -> dict[str, str]:
        """The store-wide aliases, or (``session_id``) the ones scoped to that session only."""
        if session_id is None:
            rows = self._db.conn.execute("SELECT alias, canonical FROM aliases ORDER BY alias")
        else:
            rows = self._db.conn.execute(
                "SELECT alias, canonical FROM session_aliases WHERE session_id = ? ORDER BY alias",
                (session_id,),
            )
        return {r[0]: r[1] for r in rows}

    def remove_alias(self, alias: str, *, session_id: str | None = None) -> bool:
        """Remove a store-wide alias (or one scoped to ``session_id``); whether it existed."""
        with self._db.tx() as conn:
            if session_id is None:
                cur = conn.execute("DELETE FROM aliases WHERE alias = ?", (alias,))
            else:
                cur = conn.execute(
                    "DELETE FROM session_aliases WHERE session_id = ? AND alias = ?",
                    (session_id, alias),
                )
            return cur.rowcount > 0

    # -- tag splits -----------------------------------------------------------------------------

    def record_split(self, session_id: str, tag: str, sub_tags: Sequence[str]) -> bool:
        """Record that ``tag`` was examined by the splitter and split into ``sub_tags`` (none:
        judged uniform). Once per tag: ``False`` (nothing written) when it was recorded
        already."""
        try:
            with self._db.tx() as conn:
                cur = conn.execute(
                    "INSERT INTO tag_splits (session_id, tag, sub_tags, created_at)"
                    " VALUES (?, ?, ?, ?) ON CONFLICT (session_id, tag) DO NOTHING",
                    (session_id, tag, json.dumps(list(sub_tags)), _iso(_now())),
                )
                return cur.rowcount > 0
        except sqlite3.IntegrityError:
            raise ConfigError(f"no session {session_id!r}") from None

    def tag_splits(self, session_id: str) -> dict[str, tuple[str, ...]]:
        """Every tag the splitter examined in the session, with its sub-tags (``()``: kept)."""
        rows = self._db.conn.execute(
            "SELECT tag, sub_tags FROM tag_splits WHERE session_id = ? ORDER BY tag",
            (session_id,),
        )
        return {r[0]: tuple(json.loads(r[1])) for r in rows}

    # -- related tags ---------------------------------------------------------------------------

    def related_tag_counts(self, session_id: str) -> dict[str, int]:
        """How many turns carry each related tag (and not the same tag as a tag): the counts
        kept on write (``related_tag_stats``), one row per tag."""
        return pairs(
            self._db.conn,
            "SELECT tag, turns FROM related_tag_stats WHERE session_id = ? AND turns > 0"
            " ORDER BY tag",
            (session_id,),
        )
