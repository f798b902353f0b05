"""Training data for the hybrid trainer: (query, positive, hard negatives) examples.

Three sources: a JSONL file of triples (:func:`read_triples`), the judged queries of a BEIR folder
(:func:`examples_from_beir`), and hard negatives mined from an existing index
(:func:`mine_negatives`). :func:`write_triples` writes the JSONL format that :func:`read_triples`
reads::

    {"query": "...", "positive": "...", "negatives": ["...", "..."]}

Optional keys ``query_id``, ``positive_id`` and ``negative_ids`` carry ids, needed only when a run
file of teacher scores is used for distillation.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..data import CorpusReader, Document, _iter_lines, _parse_json_object, _require_file, load_beir, load_qrels, load_queries
from ..errors import ConfigError, CorpusFormatError

__all__ = ["TrainExample", "examples_from_beir", "mine_negatives", "read_triples", "write_triples"]

logger = logging.getLogger("hybridret.train")

PathLike = str | Path


@dataclass
class TrainExample:
    """One query with one relevant passage and zero or more (hard) non-relevant passages."""

    query: str
    positive: str
    negatives: list[str] = field(default_factory=list)
    query_id: str | None = None
    positive_id: str | None = None
    negative_ids: list[str] | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"query": self.query, "positive": self.positive, "negatives": list(self.negatives)}
        if self.query_id is not None:
            out["query_id"] = self.query_id
        if self.positive_id is not None:
            out["positive_id"] = self.positive_id
        if self.negative_ids is not None:
            out["negative_ids"] = list(self.negative_ids)
        return out


def _text_field(obj: dict[str, Any], key: str, path: Path, line: int) -> str:
    if key not in obj:
        raise CorpusFormatError(f"missing field {key!r}", path=str(path), line=line, field=key)
    value = obj[key]
    if not isinstance(value, str):
        raise CorpusFormatError(f"field {key!r} must be a string, got {type(value).__name__}",
                                path=str(path), line=line, field=key)
    if not value.strip():
        raise CorpusFormatError(f"field {key!r} is empty", path=str(path), line=line, field=key)
    return value


def _str_list(obj: dict[str, Any], key: str, path: Path, line: int) -> list[str] | None:
    value = obj.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise CorpusFormatError(f"field {key!r} must be a list of strings", path=str(path), line=line, field=key)
    return list(value)


def _opt_id(obj: dict[str, Any], key: str, path: Path, line: int) -> str | None:
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise CorpusFormatError(f"field {key!r} must be a string or integer", path=str(path), line=line, field=key)
    return str(value)


def read_triples(path: PathLike) -> list[TrainExample]:
    """Read a JSONL file of ``{"query", "positive", "negatives": [...]}`` objects (``.gz`` accepted).

    ``negatives`` may be absent (in-batch negatives only). Blank lines are skipped. Raises
    :class:`CorpusFormatError` naming the file and line of the first malformed record.
    """
    p = _require_file(path, "training triples")
    out: list[TrainExample] = []
    for lineno, text in _iter_lines(p):
        if not text.strip():
            continue
        obj = _parse_json_object(text, p, lineno)
        negatives = _str_list(obj, "negatives", p, lineno) or []
        neg_ids = _str_list(obj, "negative_ids", p, lineno)
        if neg_ids is not None and len(neg_ids) != len(negatives):
            raise CorpusFormatError(f"{len(neg_ids)} negative_ids for {len(negatives)} negatives",
                                    path=str(p), line=lineno, field="negative_ids")
        out.append(TrainExample(
            query=_text_field(obj, "query", p, lineno), positive=_text_field(obj, "positive", p, lineno),
            negatives=negatives, query_id=_opt_id(obj, "query_id", p, lineno),
            positive_id=_opt_id(obj, "positive_id", p, lineno), negative_ids=neg_ids,
        ))
    if not out:
        raise CorpusFormatError("no training examples in the file", path=str(p))
    logger.info("read %d training examples from %s", len(out), p)
    return out


def write_triples(examples: Iterable[TrainExample], path: PathLike) -> int:
    """Write examples as JSONL (the format :func:`read_triples` reads); returns the count."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    tmp = p.with_name(p.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        for ex in examples:
            fh.write(json.dumps(ex.to_dict(), ensure_ascii=False) + "\n")
            n += 1
    tmp.replace(p)
    return n


def _doc_text(title: str, text: str) -> str:
    return Document(id="_", text=text, title=title).full_text


def examples_from_beir(
    folder_or_corpus: PathLike | CorpusReader | Iterable[Document] | Mapping[str, str],
    queries: Mapping[str, str] | PathLike | None = None,
    qrels: Mapping[str, Mapping[str, int]] | PathLike | None = None,
    *,
    split: str = "train",
    negatives: Mapping[str, Sequence[str]] | None = None,
) -> list[TrainExample]:
    """One example per (query, relevant document) of a judged split.

    ``folder_or_corpus`` is a BEIR folder (its ``queries.jsonl`` and ``qrels/<split>.tsv`` are used
    unless ``queries`` / ``qrels`` are given), a corpus file or reader, documents, or a mapping
    ``doc id -> text``. Positives are the documents with grade > 0. ``negatives`` optionally maps a
    query id to hard-negative document ids (judged-relevant ones are dropped). Only the texts of
    the documents needed are kept in memory.
    """
    if isinstance(folder_or_corpus, (str, Path)) and Path(folder_or_corpus).is_dir() and (queries is None or qrels is None):
        corpus, q_all, r_all = load_beir(folder_or_corpus, split)
        queries = q_all if queries is None else queries
        qrels = r_all if qrels is None else qrels
        source: Any = corpus
    else:
        source = folder_or_corpus
    if queries is None or qrels is None:
        raise ConfigError("queries and qrels are needed unless a BEIR folder is given")
    if isinstance(source, (str, Path)):
        source = CorpusReader(source)
    q_map = load_queries(queries) if isinstance(queries, (str, Path)) else dict(queries)
    r_map = load_qrels(qrels) if isinstance(qrels, (str, Path)) else {q: dict(d) for q, d in qrels.items()}
    negatives = negatives or {}
    needed: set[str] = set()
    for qid, judged in r_map.items():
        if qid in q_map:
            needed.update(d for d, g in judged.items() if g > 0)
            needed.update(negatives.get(qid, ()))
    if isinstance(source, Mapping):
        texts = {d: str(source[d]) for d in needed if d in source}
    else:
        texts = {doc.id: doc.full_text for doc in source if doc.id in needed}
    out: list[TrainExample] = []
    missing = 0
    for qid in sorted(r_map):
        if qid not in q_map:
            continue
        judged = r_map[qid]
        negs = [d for d in negatives.get(qid, ()) if judged.get(d, 0) <= 0 and d in texts]
        for docid in sorted(d for d, g in judged.items() if g > 0):
            if docid not in texts:
                missing += 1
                continue
            out.append(TrainExample(q_map[qid], texts[docid], [texts[d] for d in negs], query_id=qid,
                                    positive_id=docid, negative_ids=list(negs)))
    if missing:
        logger.warning("%d judged-relevant documents are not in the corpus and were skipped", missing)
    if not out:
        raise ConfigError("no training examples: no query has a relevant document in the corpus")
    logger.info("built %d training examples from %d judged queries", len(out), len({e.query_id for e in out}))
    return out


def mine_negatives(
    retriever: Any,
    queries: Mapping[str, str],
    qrels: Mapping[str, Mapping[str, int]],
    *,
    k: int = 30,
    n: int = 4,
    method: str = "hybrid",
    skip_top: int = 0,
    seed: int = 0,
    batch_size: int = 64,
) -> list[TrainExample]:
    """Hard negatives from an index: for every judged query, search the ``k`` best documents with
    ``method``, drop the judged-relevant ones and the ``skip_top`` best of the rest (which are often
    unjudged positives), and sample ``n`` of the remainder (seeded). One example per relevant
    document that is in the index; all of a query's examples share its negatives. Texts come from
    ``retriever.docs`` (the index must store texts)."""
    if k < 1 or n < 0 or skip_top < 0:
        raise ConfigError(f"need k >= 1, n >= 0, skip_top >= 0; got k={k}, n={n}, skip_top={skip_top}")
    docs = retriever.docs
    if docs is None:
        raise ConfigError("the retriever has no index: load() or index() it first")
    if not docs.has_text:
        raise ConfigError("the index stores no document texts (built with --no-text); cannot mine negatives")
    qids = [q for q in sorted(queries) if any(g > 0 for g in qrels.get(q, {}).values())]
    if not qids:
        raise ConfigError("none of the queries has a relevant judgment")
    rng = np.random.default_rng(seed)
    out: list[TrainExample] = []
    missing = 0
    for start in range(0, len(qids), batch_size):
        chunk = qids[start:start + batch_size]
        hits = retriever.search([queries[q] for q in chunk], k=k + skip_top, method=method)
        for i, qid in enumerate(chunk):
            judged = qrels[qid]
            cands = [int(r) for r in hits.rows[i] if r >= 0 and judged.get(str(docs.ids[r]), 0) <= 0]
            cands = cands[skip_top:skip_top + k]
            take = sorted(rng.choice(len(cands), size=min(n, len(cands)), replace=False).tolist()) if cands else []
            neg_rows = [cands[j] for j in take]
            neg_texts = [_doc_text(*docs.get(r)) for r in neg_rows]
            neg_ids = [str(docs.ids[r]) for r in neg_rows]
            for docid in sorted(d for d, g in judged.items() if g > 0):
                try:
                    row = docs.row_of(docid)
                except KeyError:
                    missing += 1
                    continue
                out.append(TrainExample(queries[qid], _doc_text(*docs.get(row)), list(neg_texts), query_id=qid,
                                        positive_id=docid, negative_ids=list(neg_ids)))
    if missing:
        logger.warning("%d judged-relevant documents are not in the index and were skipped", missing)
    logger.info("mined negatives for %d queries: %d examples", len(qids), len(out))
    return out
