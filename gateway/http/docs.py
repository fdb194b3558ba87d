"""/docs (Swagger UI) and /redoc with their assets served by the gateway itself.

FastAPI's defaults load both from a CDN and render blank offline. The assets come
from the ``fastapi-standalone-docs`` package's static files; the pages are FastAPI's
own HTML helpers pointed at them.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

from gateway.errors import ConfigurationError

ASSETS_URL = "/docs-assets"


def _assets_dir() -> Path:
    spec = importlib.util.find_spec("fastapi_standalone_docs")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigurationError("fastapi-standalone-docs is not installed; /docs needs its assets")
    return Path(next(iter(spec.submodule_search_locations))) / "static"


def install_docs(app: FastAPI, openapi_url: str) -> None:
    app.mount(ASSETS_URL, StaticFiles(directory=_assets_dir()), name="docs-assets")
    title = app.title

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=openapi_url,
            title=f"{title} - Swagger UI",
            swagger_js_url=f"{ASSETS_URL}/swagger/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS_URL}/swagger/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS_URL}/fastapi/favicon.png",
        )

    @app.get("/redoc", include_in_schema=False)
    async def redoc() -> HTMLResponse:
        return get_redoc_html(
            openapi_url=openapi_url,
            title=f"{title} - ReDoc",
            redoc_js_url=f"{ASSETS_URL}/redoc/redoc.standalone.js",
            redoc_favicon_url=f"{ASSETS_URL}/fastapi/favicon.png",
            with_google_fonts=False,
        )
