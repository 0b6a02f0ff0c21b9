"""``GET /docs``: Swagger UI over ``/openapi.json``, from files the server ships.

FastAPI's own ``/docs`` loads Swagger UI's script and styles from a CDN, so the page is blank
offline or behind a firewall. This one serves them from ``swagger_ui/`` (Swagger UI
5.35.0, Apache-2.0; see the README there) under ``/docs/static/``, with the online validator
badge off: the page loads nothing from anywhere else.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fastapi import APIRouter

__all__ = ["ASSETS", "router"]

#: The files ``/docs/static/`` serves, with their media types; nothing else is served.
ASSETS = {
    "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
    "swagger-ui.css": "text/css; charset=utf-8",
    "favicon-32x32.png": "image/png",
}
_PREFIX = "/docs/static"


def router(openapi_url: str, title: str) -> APIRouter:
    """``/docs`` (the page) and ``/docs/static/{name}`` (its script, styles and icon)."""
    from fastapi import APIRouter, HTTPException
    from fastapi.openapi.docs import get_swagger_ui_html
    from fastapi.responses import FileResponse, HTMLResponse

    api = APIRouter(include_in_schema=False)
    folder = Path(str(resources.files("contextfold.server") / "swagger_ui"))

    @api.get("/docs", response_class=HTMLResponse)
    def docs_page() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=openapi_url,
            title=f"{title} - API docs",
            swagger_js_url=f"{_PREFIX}/swagger-ui-bundle.js",
            swagger_css_url=f"{_PREFIX}/swagger-ui.css",
            swagger_favicon_url=f"{_PREFIX}/favicon-32x32.png",
            swagger_ui_parameters={"validatorUrl": None},  # no badge fetched from the web
        )

    @api.get(f"{_PREFIX}/{{name}}")
    def asset(name: str) -> FileResponse:
        if name not in ASSETS:
            raise HTTPException(404, f"no docs asset {name!r}")
        return FileResponse(
            folder / name,
            media_type=ASSETS[name],
            headers={"Cache-Control": "public, max-age=86400", "X-Content-Type-Options": "nosniff"},
        )

    return api
