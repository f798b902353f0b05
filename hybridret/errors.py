"""One exception hierarchy for everything hybridret raises on purpose.

Catch :class:`HybridRetError` to handle any of them; the subclasses say what went wrong.
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "HybridRetWarning",
    "PerformanceWarning",
    "StaleSnapshotWarning",
    "TruncationWarning",
    "DocumentNotFoundError",
    "CorpusFormatError",
    "EncoderError",
    "FilterError",
    "HybridRetError",
    "IndexExistsError",
    "IndexFormatError",
    "IndexLockedError",
    "IndexNotFoundError",
    "IndexReadOnlyError",
    "MissingDependencyError",
    "ModelNotFoundError",
    "TextUnavailable",
    "WorkLimitError",
    "WriteCancelledError",
]


def check_fields(cls: type, data: object, what: str) -> None:
    """Raise :class:`ConfigError` when a settings mapping has keys the dataclass ``cls`` lacks."""
    from dataclasses import fields

    unknown = set(data) - {f.name for f in fields(cls)}  # type: ignore[call-overload]
    if unknown:
        raise ConfigError(f"unknown {what} settings: {sorted(unknown)}")


class HybridRetError(Exception):
    """Base class of every error hybridret raises deliberately."""


class ConfigError(HybridRetError, ValueError):
    """An argument or configuration value is invalid."""


class FilterError(ConfigError):
    """A filter is malformed; the message says where (``filter.$and[1].year.$gte``) and why."""


class TextUnavailable(FilterError):
    """A segment cannot answer a ``$text`` condition (no stored text, no BM25 part); raised by
    :mod:`hybridret.index.textmatch`, re-raised by :mod:`hybridret.filters` with the filter's field
    in front."""


class CorpusFormatError(HybridRetError, ValueError):
    """Input data (corpus, queries, qrels) is malformed.

    The message names the file, the line number and the field where known; the same facts are
    available as the attributes ``path``, ``line`` and ``field``.
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        line: int | None = None,
        field: str | None = None,
    ) -> None:
        where = ""
        if path is not None:
            where = f"{path}"
            if line is not None:
                where += f":{line}"
            where += ": "
        super().__init__(f"{where}{message}")
        self.path = path
        self.line = line
        self.field = field


class ModelNotFoundError(HybridRetError, FileNotFoundError):
    """A model name could not be resolved to packaged weights, a local folder or a Hub id."""


class EncoderError(HybridRetError):
    """An encoder could not be built or used (wrong architecture, bad checkpoint, ...)."""


class MissingDependencyError(HybridRetError, ImportError):
    """An optional dependency a feature needs is not installed; the message names the pip extra
    that installs it (e.g. ``pip install 'hybridret[torch]'``)."""


class IndexNotFoundError(HybridRetError, FileNotFoundError):
    """No index exists at the given directory."""


class IndexFormatError(HybridRetError):
    """An index directory exists but is corrupt, inconsistent, or of a newer format."""


class IndexExistsError(HybridRetError, FileExistsError):
    """Refused to write over an existing index without ``overwrite=True``."""


class IndexLockedError(HybridRetError):
    """Another writer holds the index directory's lock (one writer at a time per index)."""


class IndexReadOnlyError(HybridRetError, PermissionError):
    """A write was asked of an index directory that cannot be written."""


class WorkLimitError(HybridRetError):
    """A request would take more work than a limit allows (chunks, tokens, bytes); refused before any
    of it is done. The message names the limit and how to raise it (HTTP: 413)."""


class WriteCancelledError(HybridRetError):
    """A write was stopped before its commit (e.g. the server is shutting down): nothing of it was
    committed, and it may be sent again (HTTP: 503)."""


class DocumentNotFoundError(HybridRetError, KeyError):
    """Ids given to ``delete`` (or ``get``) are not in the index; ``ids`` lists them."""

    def __init__(self, message: str, ids: list[str]) -> None:
        super().__init__(message)
        self.ids = ids

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class HybridRetWarning(UserWarning):
    """Base class of the warnings hybridret gives through :mod:`warnings`, so that a library user
    sees them without configuring logging (filter them with ``warnings.filterwarnings``)."""


class PerformanceWarning(HybridRetWarning):
    """Something in the environment will make searches much slower than they should be (e.g. torch
    or FAISS imported before hybridret could set ``OMP_WAIT_POLICY``)."""


class TruncationWarning(HybridRetWarning):
    """Documents were longer than the encoder's ``max_length`` and were cut (only their beginning
    is searchable); given once per write call, with the count."""


class StaleSnapshotWarning(HybridRetWarning):
    """A searcher could not pick up newer commits of its index and still serves an older one."""
