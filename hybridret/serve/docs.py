"""The API docs at ``/docs`` without a network: Swagger UI's script and stylesheet served by this
server, from the files of the ``swagger-ui-bundle`` distribution (the serve extra; Apache-2.0), instead
of FastAPI's default, which loads them from a CDN and shows a blank page offline. Without that
distribution ``/docs`` says so and points to the schema at ``/openapi.json``. ReDoc (``/redoc``),
which has no packaged copy, is not served."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

__all__ = ["ASSETS", "install_docs", "swagger_ui_folder"]

ASSETS = "/docs-assets"


def swagger_ui_folder() -> Path | None:
    """The folder of ``swagger-ui-bundle.js`` and ``swagger-ui.css`` (``None`` when not installed)."""
    spec = importlib.util.find_spec("swagger_ui_bundle")  # located, not imported
    if spec is None or spec.origin is None:
        return None
    found = sorted((Path(spec.origin).parent / "vendor").glob("swagger-ui-*/swagger-ui-bundle.js"))
    return found[-1].parent if found else None


def install_docs(app: FastAPI, *, title: str) -> None:
    """``/docs`` from local files (the app is created with ``docs_url=None, redoc_url=None``)."""
    folder = swagger_ui_folder()
    openapi = app.openapi_url or "/openapi.json"
    if folder is not None:
        app.mount(ASSETS, StaticFiles(directory=folder), name="docs-assets")

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        if folder is None:
            return HTMLResponse(
                "<!doctype html><title>hybridret API docs</title><h1>API docs</h1><p>The interactive page needs "
                "the <code>swagger-ui-bundle</code> package (<code>pip install 'hybridret[serve]'</code>). The "
                f'OpenAPI schema is at <a href="{openapi}">{openapi}</a>.</p>')
        return get_swagger_ui_html(openapi_url=openapi, title=f"{title} - API docs",
                                   swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js",
                                   swagger_css_url=f"{ASSETS}/swagger-ui.css",
                                   swagger_favicon_url=f"{ASSETS}/favicon-32x32.png")
