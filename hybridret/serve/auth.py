"""API-key checks for the server: ``Authorization: Bearer KEY``, compared in constant time.

The key is read from a file (never from the command line, where ``ps`` shows it to every user) and
is never logged or echoed in an error.
"""

from __future__ import annotations

import hmac
import os
from pathlib import Path

from ..errors import ConfigError

__all__ = ["key_matches", "read_api_key"]

MIN_KEY_LENGTH = 16


def read_api_key(path: str | os.PathLike[str]) -> str:
    """The key in ``path`` (surrounding whitespace removed). Raises :class:`ConfigError` for a
    missing, empty, multi-line or short (< 16 characters) key file."""
    p = Path(path)
    try:
        raw = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read the API key file {p}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"the API key file {p} is not UTF-8 text") from None
    key = raw.strip()
    if not key:
        raise ConfigError(f"the API key file {p} is empty")
    if any(c.isspace() for c in key):
        raise ConfigError(f"the API key in {p} must be one line without spaces")
    if len(key) < MIN_KEY_LENGTH:
        raise ConfigError(f"the API key in {p} is shorter than {MIN_KEY_LENGTH} characters")
    return key


def key_matches(authorization: str | None, key: str) -> bool:
    """Whether an ``Authorization`` header carries ``Bearer <key>``. The comparison takes the same
    time wherever the first differing character is (:func:`hmac.compare_digest`)."""
    if not authorization:
        return False
    scheme, _, given = authorization.partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(given.strip().encode("utf-8", "surrogatepass"), key.encode("utf-8"))
