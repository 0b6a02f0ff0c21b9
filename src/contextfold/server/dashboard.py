"""(being built: see issue 5)"""

from __future__ import annotations

from fastapi import APIRouter

from contextfold.server.state import ServerState


def router(state: ServerState) -> APIRouter:
    del state
    return APIRouter()
