"""TREC run files: read and write ``qid Q0 docid rank score tag`` (and MS MARCO ``qid<TAB>pid<TAB>rank``).

Runs are plain ``{qid: {docid: score}}`` dicts, the shape :mod:`hybridret.eval`, ``pytrec_eval``
and ``ranx`` use, so a run written here can be scored by ``trec_eval`` and read back by any of them.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path

from .data import _iter_lines, _require_file
from .errors import CorpusFormatError

__all__ = ["load_run", "write_run"]

logger = logging.getLogger(__name__)

Run = dict[str, dict[str, float]]


def load_run(path: str | os.PathLike[str]) -> Run:
    """Read a TREC run (6 columns) or an MS MARCO run (``qid pid rank``, score = -rank).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        CorpusFormatError: wrong column count, a non-numeric score or rank, or a document listed
            twice for one query (naming the file and line).
    """
    p = _require_file(path, "run")
    run: Run = {}
    ncols: int | None = None
    for lineno, text in _iter_lines(p):
        cols = text.split()
        if not cols:
            continue
        if ncols is None:
            if len(cols) not in (3, 6):
                raise CorpusFormatError(f"expected 6 columns (qid Q0 docid rank score tag) or 3 (qid docid rank), "
                                        f"got {len(cols)}", path=str(p), line=lineno)
            ncols = len(cols)
        elif len(cols) != ncols:
            raise CorpusFormatError(f"expected {ncols} columns like the first line, got {len(cols)}",
                                    path=str(p), line=lineno)
        qid, docid = cols[0], cols[2] if ncols == 6 else cols[1]
        field, value = ("score", cols[4]) if ncols == 6 else ("rank", cols[2])
        try:
            score = float(value) if ncols == 6 else -float(int(value))
        except ValueError:
            raise CorpusFormatError(f"{field} must be a number, got {value!r}", path=str(p), line=lineno,
                                    field=field) from None
        docs = run.setdefault(qid, {})
        if docid in docs:
            raise CorpusFormatError(f"document {docid!r} is listed twice for query {qid!r}", path=str(p),
                                    line=lineno, field="docid")
        docs[docid] = score
    logger.debug("read a run of %d queries from %s", len(run), p)
    return run


def write_run(run: Mapping[str, Mapping[str, float]], path: str | os.PathLike[str], *, tag: str = "hybridret",
              format: str = "trec") -> Path:
    """Write ``run`` best-first per query, as a TREC run (default) or, with ``format="msmarco"``,
    as ``qid<TAB>pid<TAB>rank``. The file is written to a temporary name and renamed."""
    if format not in ("trec", "msmarco"):
        raise ValueError(f"format must be 'trec' or 'msmarco', got {format!r}")
    if format == "trec" and (not tag or any(c.isspace() for c in tag)):
        raise ValueError(f"run tag must be one word, got {tag!r}")
    out = Path(path)
    tmp = out.with_name(out.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for qid, docs in run.items():
            ranked = sorted(docs.items(), key=lambda kv: (-kv[1], kv[0]))
            for rank, (docid, score) in enumerate(ranked, 1):
                f.write(f"{qid} Q0 {docid} {rank} {score:.6f} {tag}\n" if format == "trec" else f"{qid}\t{docid}\t{rank}\n")
    os.replace(tmp, out)
    return out
