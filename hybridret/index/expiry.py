"""Expiry: documents that stop existing at a given time, and the clock that decides it.

A document whose metadata holds the reserved field ``expires_at`` (seconds since the epoch, UTC, or
an ISO 8601 time: ``"2027-01-31T12:00:00Z"``; a time without a zone is UTC; ``null``: never) is
treated as deleted from that instant on by every search and :meth:`~hybridret.Searcher.get`: a
:class:`~hybridret.index.snapshot.Snapshot` seen at time ``now`` (:meth:`Snapshot.at`) masks
expired rows exactly as it masks tombstoned ones, so every retriever and fusion method honours it,
and BM25's statistics are those of the documents still alive. ``compact`` drops expired documents
for good, ``purge`` tombstones them (one commit each).

A segment reads its expiry times once, when opened, from its metadata columns
(:func:`read_expiry`), sorted, so the rows expired at ``now`` are a prefix found by one binary search.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from typing import Any

import numpy as np

from ..errors import ConfigError

__all__ = ["EXPIRES_AT", "Clock", "check_clock", "check_ttl", "expired_rows", "expiry_of", "parse_expiry", "read_expiry",
           "segment_expiry"]

logger = logging.getLogger(__name__)

EXPIRES_AT = "expires_at"
Clock = Callable[[], float]


class ExpiryError(ConfigError):
    """An ``expires_at`` value that is neither a number nor an ISO 8601 time."""


def parse_expiry(value: Any) -> float | None:
    """``expires_at`` as seconds since the epoch (``None``: the document never expires)."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ExpiryError(f"{EXPIRES_AT} must be seconds since the epoch or an ISO 8601 time, got {value!r}")
    if isinstance(value, (int, float)):
        if not math.isfinite(value):
            raise ExpiryError(f"{EXPIRES_AT} must be finite, got {value!r}")
        return float(value)
    if isinstance(value, str):
        try:
            when = datetime.fromisoformat(value.strip())
        except ValueError:
            raise ExpiryError(f"{EXPIRES_AT} {value!r} is not an ISO 8601 time (e.g. 2027-01-31T12:00:00Z)") from None
        if when.tzinfo is None:
            when = when.replace(tzinfo=timezone.utc)
        return when.timestamp()
    raise ExpiryError(f"{EXPIRES_AT} must be seconds since the epoch or an ISO 8601 time, got a "
                      f"{type(value).__name__}")


def expiry_of(metadata: Mapping[str, Any]) -> float | None:
    """The expiry time of a document's metadata (validated; ``None`` when it has none)."""
    return parse_expiry(metadata.get(EXPIRES_AT))


def check_clock(clock: Clock | None) -> Clock:
    """``clock`` (a callable returning seconds since the epoch), or :func:`time.time`."""
    if clock is None:
        return time.time
    if not callable(clock):
        raise ConfigError(f"clock must be a callable returning seconds since the epoch, got {clock!r}")
    return clock


def check_ttl(ttl: Any) -> float | None:
    """A write's ``ttl=`` (seconds) as a float, or ``None``: a finite number > 0, never a boolean or
    a string (``"5"``), so that the library, the :class:`~hybridret.client.Client` and the server
    accept exactly the same values."""
    if ttl is None:
        return None
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float, np.integer, np.floating)):
        raise ConfigError(f"ttl must be a positive number of seconds, got {type(ttl).__name__} {ttl!r}")
    if not math.isfinite(float(ttl)) or not ttl > 0:
        raise ConfigError(f"ttl must be a positive, finite number of seconds, got {ttl!r}")
    return float(ttl)


def read_expiry(columns: Any, where: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """``(times, rows)`` of the rows that have an expiry in a segment's metadata columns, sorted by
    time (a segment reads it once, when opened). A value that cannot be read as a time (written
    before the field was reserved) never expires, with a warning."""
    col = columns.get(EXPIRES_AT) if columns is not None else None
    if col is None:
        return _NONE
    rows: list[int] = []
    times: list[float] = []
    nums = np.flatnonzero(col.is_num)
    rows += nums.tolist()
    times += col.num[nums].tolist()
    bad = len(col.lists) + int(np.count_nonzero(col.is_bool))
    for r in np.flatnonzero(col.is_str).tolist():
        try:
            times.append(parse_expiry(col.str[r]))  # type: ignore[arg-type]
            rows.append(r)
        except ExpiryError:
            bad += 1
    if bad:
        logger.warning("%s: %d documents have an %s that is not a time; they never expire", where, bad, EXPIRES_AT)
    t = np.asarray(times, dtype=np.float64)
    r = np.asarray(rows, dtype=np.int64)
    order = np.argsort(t, kind="stable")
    return t[order], r[order]


_NONE = (np.zeros(0, dtype=np.float64), np.zeros(0, dtype=np.int64))


def segment_expiry(seg: Any) -> tuple[np.ndarray, np.ndarray]:
    """``(times, rows)`` of segment ``seg`` (:func:`read_expiry`; what it read when opened)."""
    found = getattr(seg, "expiry", None)
    if found is not None:
        return found
    return read_expiry(getattr(seg, "columns", None), getattr(seg, "root", None))


def expired_rows(seg: Any, now: float) -> np.ndarray:
    """Local rows of ``seg`` expired at ``now`` (``expires_at <= now``), sorted."""
    times, rows = segment_expiry(seg)
    return np.sort(rows[: int(np.searchsorted(times, now, side="right"))])
