"""A value that a read-only part computes on first use, once, and never changes afterwards."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["Once"]

T = TypeVar("T")


class Once(Generic[T]):
    """Holds one value, made by the first :meth:`get` (under a lock, so however many threads ask
    at once it is made once) and then read without a lock. Not a cache: nothing replaces or evicts
    it, so whoever reads it reads the same object. A failed ``make`` stores nothing."""

    __slots__ = ("_lock", "_value", "_set")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._value: T | None = None
        self._set = False

    def get(self, make: Callable[[], T]) -> T:
        if not self._set:
            with self._lock:
                if not self._set:
                    self._value = make()
                    self._set = True
        return self._value  # type: ignore[return-value]

    @property
    def ready(self) -> bool:
        """Whether the value has been made."""
        return self._set
