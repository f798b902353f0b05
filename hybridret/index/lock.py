"""One writer per index directory: an advisory ``flock`` on ``DIR/write.lock``.

The kernel releases the lock when the holding process dies (``kill -9`` included), so a lock left
behind by a dead writer is recovered by the next writer without any clean-up step. The file
itself stays and holds the pid of the last writer, for the error message. (``flock`` is not
reliable on some network filesystems; keep one writer per index there by other means.)
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from ..errors import IndexLockedError, IndexReadOnlyError

__all__ = ["LOCK_FILE", "WriterLock"]

LOCK_FILE = "write.lock"


class WriterLock:
    """Hold the writer lock of ``root`` (created if needed) until :meth:`release`.

    Raises:
        IndexLockedError: another process (or another writer in this one) holds it.
        IndexReadOnlyError: the directory cannot be written.
    """

    def __init__(self, root: str | Path) -> None:
        import fcntl

        self._fd: int | None = None
        self.path = Path(root) / LOCK_FILE
        try:
            Path(root).mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
                raise IndexReadOnlyError(f"cannot write to the index at {root}: {exc.strerror}") from None
            raise
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = os.pread(self._fd, 64, 0).decode("ascii", "replace").strip() or "unknown"
            os.close(self._fd)
            self._fd = None
            if exc.errno in (errno.EWOULDBLOCK, errno.EACCES, errno.EAGAIN):
                raise IndexLockedError(f"the index at {root} is being written by another writer (process {holder}); "
                                       f"wait for it to finish (lock: {self.path})") from None
            raise
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, str(os.getpid()).encode(), 0)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None

    def __enter__(self) -> WriterLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __del__(self) -> None:
        self.release()
