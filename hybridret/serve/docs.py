"""The API docs at ``/docs`` without a network: Swagger UI 5 (which reads the OpenAPI 3.1 schema that
FastAPI writes) served by this server from the files of the ``swagger-ui-py`` distribution (the serve
extra; Swagger UI's own files, Apache-2.0; its ``swagger_ui/static`` folder is read as data, the
package is never imported), instead of FastAPI's default, which loads them from a CDN and shows a blank
page offline. Swagger UI 4 (the ``swagger-ui-bundle`` distribution, 4.15.5) cannot read OpenAPI 3.1
("Unable to render this definition"), so it is not used. Without the files ``/docs`` says so and
points to the schema at ``/openapi.json``. ReDoc (``/redoc``), which has no packaged copy, is not served."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

__all__ = ["ASSETS", "install_docs", "swagger_ui_folder", "swagger_ui_version"]

ASSETS = "/docs-assets"
MIN_MAJOR = 5  # the first Swagger UI that reads OpenAPI 3.1


def swagger_ui_version(folder: Path) -> str | None:
    """The Swagger UI version of a ``swagger-ui-bundle.js`` folder (its build info's ``PACKAGE_VERSION``)."""
    try:
        head = (folder / "swagger-ui-bundle.js").read_bytes()
    except OSError:
        return None
    found = re.search(rb'PACKAGE_VERSION:"(\d+\.\d+\.\d+)"', head)
    return found.group(1).decode() if found else None


def swagger_ui_folder() -> Path | None:
    """The folder of a Swagger UI >= 5 ``swagger-ui-bundle.js`` and ``swagger-ui.css`` (``None`` when
    not installed)."""
    spec = importlib.util.find_spec("swagger_ui")  # located, not imported
    if spec is None or spec.origin is None:
        return None
    folder = Path(spec.origin).parent / "static"
    if not ((folder / "swagger-ui-bundle.js").is_file() and (folder / "swagger-ui.css").is_file()):
        return None
    version = swagger_ui_version(folder)
    if version is None or int(version.split(".")[0]) < MIN_MAJOR:
        return None
    return folder


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
                "the <code>swagger-ui-py</code> package (Swagger UI 5; <code>pip install 'hybridret[serve]'</code>). "
                f'The OpenAPI schema is at <a href="{openapi}">{openapi}</a>.</p>')
        return get_swagger_ui_html(openapi_url=openapi, title=f"{title} - API docs",
                                   swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js",
                                   swagger_css_url=f"{ASSETS}/swagger-ui.css",
                                   swagger_favicon_url=f"{ASSETS}/favicon-32x32.png")
