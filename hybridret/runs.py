"""TREC run files: read and write ``qid Q0 docid rank score tag`` (and MS MARCO ``qid<TAB>pid<TAB>rank``).

Runs are plain ``{qid: {docid: score}}`` dicts, the shape :mod:`hybridret.eval`, ``pytrec_eval``
and ``ranx`` use, so a run written here can be scored by ``trec_eval`` and read back by any of them.

Ids with inner whitespace (BEIR's LIMIT uses people's names as ids) cannot be written in the usual
space-separated columns. :func:`write_run` then writes *every* line of that file with tab-separated
columns instead (and logs a warning, since whitespace-splitting tools such as ``trec_eval`` will
misread those ids, as they misread such qrels); :func:`load_run` splits a line that contains a tab
on tabs, so the run reads back identically. Ids that no line format can hold (empty, containing a
tab, newline or carriage return, with leading/trailing whitespace, or starting with U+FEFF, which
readers drop as a byte-order mark) are refused with
:class:`~hybridret.errors.ConfigError` naming the id.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping
from pathlib import Path

from .data import _display, _iter_lines, _require_file
from .errors import ConfigError, CorpusFormatError

__all__ = ["load_run", "write_run"]

logger = logging.getLogger(__name__)

Run = dict[str, dict[str, float]]

_VALID_COLS = (3, 6)
_UNWRITABLE = ("\t", "\n", "\r")


def _split(text: str, ncols: int | None) -> list[str]:
    """Tab-separated columns when the line has tabs and that gives a valid column count, else
    whitespace-separated columns (TREC runs from other tools mix both)."""
    if "\t" in text:
        cols = [c.strip() for c in text.split("\t")]
        if (len(cols) == ncols) if ncols is not None else (len(cols) in _VALID_COLS):
            return cols
    return text.split()


def load_run(path: str | os.PathLike[str], *, max_line_bytes: int | None = None) -> Run:
    """Read a TREC run (6 columns) or an MS MARCO run (``qid pid rank``, score = -rank).

    Columns are whitespace-separated, or tab-separated on lines that contain a tab (so ids may
    hold spaces; see the module docstring). ``"-"`` reads standard input.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        CorpusFormatError: wrong column count, an empty id, a non-numeric or NaN score or rank, or a
            document listed twice for one query (naming the file and line).
    """
    p = _require_file(path, "run")
    name = _display(p)
    run: Run = {}
    ncols: int | None = None
    for lineno, text in _iter_lines(p, max_line_bytes=max_line_bytes):
        cols = _split(text, ncols)
        if not cols:
            continue
        if ncols is None:
            if len(cols) not in _VALID_COLS:
                raise CorpusFormatError(f"expected 6 columns (qid Q0 docid rank score tag) or 3 (qid docid rank), "
                                        f"got {len(cols)}", path=name, line=lineno)
            ncols = len(cols)
        elif len(cols) != ncols:
            raise CorpusFormatError(f"expected {ncols} columns like the first line, got {len(cols)}",
                                    path=name, line=lineno)
        qid, docid = cols[0], cols[2] if ncols == 6 else cols[1]
        for value, field in ((qid, "qid"), (docid, "docid")):
            if not value:
                raise CorpusFormatError(f"empty {field}", path=name, line=lineno, field=field)
        field, value = ("score", cols[4]) if ncols == 6 else ("rank", cols[2])
        try:
            score = float(value) if ncols == 6 else -float(int(value))
        except ValueError:
            raise CorpusFormatError(f"{field} must be a number, got {value!r}", path=name, line=lineno,
                                    field=field) from None
        if math.isnan(score):
            raise CorpusFormatError(f"{field} is NaN", path=name, line=lineno, field=field)
        docs = run.setdefault(qid, {})
        if docid in docs:
            raise CorpusFormatError(f"document {docid!r} is listed twice for query {qid!r}", path=name,
                                    line=lineno, field="docid")
        docs[docid] = score
    logger.debug("read a run of %d queries from %s", len(run), name)
    return run


def _check_id(value: object, what: str) -> bool:
    """Validate one id for writing; True when it holds inner whitespace (needs tab-separated columns)."""
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{what} id {value!r} cannot be written to a run file (ids must be non-empty strings)")
    if any(c in value for c in _UNWRITABLE) or value != value.strip() or value.startswith("\ufeff"):
        raise ConfigError(f"{what} id {value!r} cannot be written to a run file: it contains a tab, newline or "
                          "carriage return, or starts or ends with whitespace or a byte-order mark")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigError(f"{what} id {value!r} cannot be written to a run file: it holds a lone UTF-16 surrogate "
                          "(not valid Unicode text)") from None
    return any(c.isspace() for c in value)


def _format_score(score: float) -> str:
    """Six decimals (the usual TREC look) when that is exact, else the shortest exact repr."""
    fixed = f"{score:.6f}"
    return fixed if float(fixed) == score else repr(score)


def write_run(run: Mapping[str, Mapping[str, float]], path: str | os.PathLike[str], *, tag: str = "hybridret",
              format: str = "trec") -> Path:
    """Write ``run`` best-first per query, as a TREC run (default) or, with ``format="msmarco"``,
    as ``qid<TAB>pid<TAB>rank``. The file is written to a temporary name and renamed.

    Scores are written exactly (six decimals when that is exact, else ``repr``), so
    :func:`load_run` returns the same dict for a TREC run (less queries with no documents, which
    a run file cannot list). When an id holds inner whitespace, the
    TREC columns of the whole file are tab-separated (see the module docstring).

    Raises:
        ConfigError: an unknown ``format``, a ``tag`` that is not one word, an id that no run file can
            hold (naming it), or a NaN score.
        OSError: the file cannot be written.
    """
    if format not in ("trec", "msmarco"):
        raise ConfigError(f"format must be 'trec' or 'msmarco', got {format!r}")
    if format == "trec" and (not tag or any(c.isspace() for c in tag)):
        raise ConfigError(f"run tag must be one word, got {tag!r}")
    spaced = False
    rows: list[tuple[str, list[tuple[str, float]]]] = []
    for qid, docs in run.items():
        spaced |= _check_id(qid, "query")
        for docid, score in docs.items():
            spaced |= _check_id(docid, "document")
            if isinstance(score, bool) or not isinstance(score, (int, float)) or math.isnan(score):
                raise ConfigError(f"score of document {docid!r} for query {qid!r} must be a number other than "
                                  f"NaN, got {score!r}")
        rows.append((qid, sorted(((d, float(s)) for d, s in docs.items()), key=lambda kv: (-kv[1], kv[0]))))
    sep = "\t" if spaced or format == "msmarco" else " "
    if spaced and format == "trec":
        logger.warning("%s: some ids contain spaces, so the run's columns are tab-separated; hybridret reads it back, "
                       "but whitespace-splitting tools (trec_eval) will not", path)
    out = Path(path)
    tmp = out.with_name(out.name + ".tmp")
    try:
        with open(tmp, "w", encoding="utf-8", newline="\n") as f:
            for qid, ranked in rows:
                for rank, (docid, score) in enumerate(ranked, 1):
                    cols = (qid, "Q0", docid, str(rank), _format_score(score), tag) if format == "trec" else \
                        (qid, docid, str(rank))
                    f.write(sep.join(cols) + "\n")
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return out
