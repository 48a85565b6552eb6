"""The OpenAPI document of a FastAPI app, built once and amended by the app that serves it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def install_openapi(app: Any, amend: Callable[[dict[str, Any]], None]) -> None:
    """Make ``app.openapi()`` FastAPI's document of its routes, passed once through ``amend``.

    ``amend`` edits the document in place (extra component schemas, security schemes, ...);
    the result is cached on the app as FastAPI does.
    """
    from fastapi.openapi.utils import get_openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = get_openapi(
            title=app.title, version=app.version, description=app.description, routes=app.routes
        )
        amend(schema)
        app.openapi_schema = schema
        return schema

    app.openapi = openapi


__all__ = ["install_openapi"]
