"""HTTP serving of an index: ``hybridret serve DIR`` (FastAPI + uvicorn; see :mod:`hybridret.serve.app`).

Needs the ``serve`` extra: ``pip install 'hybridret[serve]'``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ServeConfig", "create_app", "serve"]


def __getattr__(name: str) -> Any:  # FastAPI is imported only when the server is used
    if name in __all__:
        try:
            from . import app
        except ImportError as exc:  # pragma: no cover - depends on the environment
            from ..errors import ConfigError

            raise ConfigError(f"serving needs FastAPI and uvicorn: pip install 'hybridret[serve]' ({exc})") from None
        return getattr(app, name)
    raise AttributeError(name)
