"""Full-text filters (``$text``): what they cost, and the engine chosen against tantivy with positions.

On a shared collection (default the 30,005-passage MS MARCO DL19 pool, ``../shared/data``;
``--smoke``: the bundled 1,000-passage sample) indexed for BM25 only (no encoder: the text
filter's cost does not depend on the vectors), in ``--segments`` segments:

* **engine** (the one shipped, :mod:`hybridret.index.textmatch`): words from the BM25 part's
  postings, phrases from the postings of their terms intersected and each candidate's stored text
  analysed again. Its mask time per filter is measured *cold* (a fresh matcher: nothing cached)
  and *warm* (the phrase result cached per segment);
* **alternative**: a tantivy index with positions over the same texts, the same analyzer
  registered as its tokenizer and a fast ``row`` field, answering the same filters with term /
  boolean / phrase queries (``search(limit=n)`` + ``fast_field_values``). Its build time and disk
  are what a per-segment tantivy part would add; its phrase semantics differ where stop words sat
  between two words (tantivy keeps their positions), so the agreement with the reference is shown;
* **reference**: every text analysed in Python and scanned (the tests' brute force): each engine's
  masks are checked against it (``exact``);
* **ms/query added** to a BM25 top-10 search (the DL19 queries, one per call) by each filter
  kind, cold and warm, against the same searches without a filter.

Filters are drawn with a fixed seed from the corpus: single words by document frequency (rare
10-100, common 1,000-5,000), ``all`` of two mid words, ``none`` of one common word, and phrases of
2 and 3 consecutive words taken from a document (so most match something).

Run pinned to one core: ``taskset -c 1 python benchmarks/text_filter.py`` (3 repeats: median and
spread). Prints tables and writes ``benchmarks/results/text_filter.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import RESULTS, SHARED, table, write_json  # noqa: E402

import numpy as np  # noqa: E402

from hybridret import IndexWriter, Searcher  # noqa: E402
from hybridret.encoders.base import EncodedBatch, Encoder  # noqa: E402
from hybridret.filters import parse_filter  # noqa: E402
from hybridret.index._once import Once  # noqa: E402
from hybridret.index.analysis import bm25_analyzer  # noqa: E402
from hybridret.index.textmatch import TextMatcher, full_text, holds_sequence  # noqa: E402

SAMPLE = Path(__file__).resolve().parents[1] / "hybridret" / "resources" / "sample"
KINDS = ("word rare", "word common", "all 2 words", "none 1 word", "phrase 2", "phrase 3")


class TextOnly(Encoder):
    """No vectors: the index holds texts and BM25 only."""

    def encode_queries(self, texts: Any, *, batch_size: Any = None, show_progress: Any = None) -> EncodedBatch:
        return EncodedBatch()

    def encode_documents(self, texts: Any, *, batch_size: Any = None, show_progress: Any = None) -> EncodedBatch:
        return EncodedBatch()

    def config(self) -> dict[str, Any]:
        return {"type": "text-only"}


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def draw_filters(docs: list[dict[str, Any]], tokens: list[list[str]], per_kind: int, seed: int
                 ) -> dict[str, list[dict[str, Any]]]:
    rng = random.Random(seed)
    an = bm25_analyzer()
    df: dict[str, int] = {}
    for toks in tokens:
        for t in set(toks):
            df[t] = df.get(t, 0) + 1
    words = sorted(df)
    n = len(docs)

    def band(lo: int, hi: int) -> list[str]:
        return [w for w in words if lo <= df[w] <= hi and w.isalpha() and list(an.analyze(w)) == [w]]

    scale = n / 30_000
    rare = band(max(2, int(10 * scale)), max(3, int(100 * scale)))
    mid = band(max(2, int(100 * scale)), max(3, int(1000 * scale)))
    common = band(max(2, int(1000 * scale)), max(3, int(5000 * scale))) or mid

    def phrase(m: int) -> str:
        while True:
            raw = docs[rng.randrange(n)]["text"].split()
            if len(raw) < m + 2:
                continue
            i = rng.randrange(len(raw) - m)
            cand = " ".join(raw[i:i + m])
            if len(list(an.analyze(cand))) == m:
                return cand

    return {
        "word rare": [{"$text": {"all": [rng.choice(rare)]}} for _ in range(per_kind)],
        "word common": [{"$text": {"all": [rng.choice(common)]}} for _ in range(per_kind)],
        "all 2 words": [{"$text": {"all": rng.sample(mid, 2)}} for _ in range(per_kind)],
        "none 1 word": [{"$text": {"none": [rng.choice(common)]}} for _ in range(per_kind)],
        "phrase 2": [{"$text": {"phrase": phrase(2)}} for _ in range(per_kind)],
        "phrase 3": [{"$text": {"phrase": phrase(3)}} for _ in range(per_kind)],
    }


def reference_mask(tokens: list[list[str]], spec: dict[str, Any], an: Any) -> np.ndarray:
    def terms(entries: list[str]) -> list[list[str]]:
        return [list(an.analyze(e)) for e in entries]

    must = terms(([spec["phrase"]] if "phrase" in spec else []) + spec.get("all", []))
    must_not = terms(spec.get("none", []))
    return np.array([all(holds_sequence(t, m) for m in must) and not any(holds_sequence(t, m) for m in must_not)
                     for t in tokens], dtype=bool)


# -- the alternative: tantivy with positions ----------------------------------------------------------------
def build_tantivy(folder: Path, texts: list[str]) -> tuple[Any, float]:
    import tantivy

    start = time.perf_counter()
    sb = tantivy.SchemaBuilder()
    sb.add_text_field("text", stored=False, tokenizer_name="hybridret_en", index_option="position")
    sb.add_unsigned_field("row", stored=False, indexed=False, fast=True)
    schema = sb.build()
    folder.mkdir(parents=True)
    index = tantivy.Index(schema, path=str(folder))
    index.register_tokenizer("hybridret_en", bm25_analyzer())
    writer = index.writer(heap_size=128_000_000, num_threads=1)
    for row, text in enumerate(texts):
        doc = tantivy.Document()
        doc.add_text("text", text)
        doc.add_unsigned("row", row)
        writer.add_document(doc)
    writer.commit()
    writer.wait_merging_threads()
    index.reload()
    return index, time.perf_counter() - start


def tantivy_mask(index: Any, spec: dict[str, Any], n: int, an: Any) -> np.ndarray:
    import tantivy

    schema = index.schema

    def entry_query(entry: str) -> Any:
        toks = list(an.analyze(entry))
        if len(toks) == 1:
            return tantivy.Query.term_query(schema, "text", toks[0])
        return tantivy.Query.phrase_query(schema, "text", toks)

    must = [(tantivy.Occur.Must, entry_query(e)) for e in ([spec["phrase"]] if "phrase" in spec else []) + spec.get("all", [])]
    must_not = [(tantivy.Occur.MustNot, entry_query(e)) for e in spec.get("none", [])]
    if not must:
        must = [(tantivy.Occur.Must, tantivy.Query.all_query())]
    query = tantivy.Query.boolean_query(must + must_not)
    searcher = index.searcher()
    hits = searcher.search(query, limit=max(1, n), count=False).hits
    out = np.zeros(n, dtype=bool)
    if hits:
        rows = searcher.fast_field_values("row", [addr for _, addr in hits])
        out[np.asarray(rows, dtype=np.int64)] = True
    return out


def ours_mask(snap: Any, filt: Any, *, cold: bool) -> np.ndarray:
    parts = []
    for seg in snap.segments:
        if cold:
            seg._text = Once()  # benchmark only: forget the cached phrase results
        parts.append(filt.segment_mask(seg))
    return np.concatenate(parts)


def median_spread(values: list[float]) -> tuple[float, float]:
    return statistics.median(values), (max(values) - min(values))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", type=Path, default=SHARED / "msmarco-dl19-pool")
    ap.add_argument("--limit", type=int, default=None, help="first N passages only")
    ap.add_argument("--segments", type=int, default=4)
    ap.add_argument("--per-kind", type=int, default=20, help="filters drawn per kind")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--smoke", action="store_true", help="the bundled sample, 5 filters per kind, 1 repeat")
    ap.add_argument("--out", type=Path, default=RESULTS / "text_filter.json")
    args = ap.parse_args(argv)
    corpus = SAMPLE if args.smoke else args.corpus
    if not (corpus / "corpus.jsonl").is_file():
        print(f"skipped: no collection at {corpus} (the shared data is absent)")
        return 0
    if args.smoke:
        args.per_kind, args.repeats, args.segments = 5, 1, 2
    docs = [json.loads(line) for line in (corpus / "corpus.jsonl").open(encoding="utf-8")]
    docs = [d for d in docs if (d.get("title", "") + d.get("text", "")).strip()][:args.limit]
    docs = [{"id": str(d["_id"]), "title": d.get("title", ""), "text": d["text"]} for d in docs]
    queries = [json.loads(line)["text"] for line in (corpus / "queries.jsonl").open(encoding="utf-8")][:43]
    n = len(docs)
    an = bm25_analyzer()
    texts = [full_text(d["title"], d["text"]) for d in docs]
    t0 = time.perf_counter()
    tokens = [list(an.analyze(t)) if t else [] for t in texts]
    analyse_s = time.perf_counter() - t0
    filters = draw_filters(docs, tokens, args.per_kind, args.seed)
    work = Path(tempfile.mkdtemp(prefix="hybridret-textfilter-"))
    try:
        cuts = np.linspace(0, n, args.segments + 1).astype(int)
        t0 = time.perf_counter()
        for j in range(args.segments):
            with IndexWriter(work / "ix", encoder=TextOnly(), settings={"max_segments": 0}) as w:
                w.write(docs[cuts[j]:cuts[j + 1]], mode="build" if j == 0 else "add", show_progress=False)
        index_s = time.perf_counter() - t0
        searcher = Searcher(work / "ix")
        snap = searcher.snapshot
        bm25_bytes = sum(folder_bytes(seg.root / "bm25") for seg in snap.segments)
        text_bytes = sum((seg.root / "texts.bin").stat().st_size + (seg.root / "texts.offsets.npy").stat().st_size
                         for seg in snap.segments)
        tv_builds = []
        for r in range(args.repeats):
            shutil.rmtree(work / "tantivy", ignore_errors=True)
            tv_index, secs = build_tantivy(work / "tantivy", texts)
            tv_builds.append(secs)
        tv_bytes = folder_bytes(work / "tantivy")

        rows: list[dict[str, Any]] = []
        result: dict[str, Any] = {}
        for kind in KINDS:
            specs = filters[kind]
            parsed = [parse_filter(f) for f in specs]
            refs = [reference_mask(tokens, f["$text"], an) for f in specs]
            ours_exact = all(np.array_equal(ours_mask(snap, p, cold=True), ref) for p, ref in zip(parsed, refs))
            tv_agree = [np.array_equal(tantivy_mask(tv_index, f["$text"], n, an), ref) for f, ref in zip(specs, refs)]
            timing: dict[str, list[float]] = {"cold": [], "warm": [], "tantivy": [], "search_none": [],
                                              "search_cold": [], "search_warm": []}
            for _ in range(args.repeats):
                t = time.perf_counter()
                for p in parsed:
                    ours_mask(snap, p, cold=True)
                timing["cold"].append((time.perf_counter() - t) * 1000 / len(parsed))
                t = time.perf_counter()
                for p in parsed:
                    ours_mask(snap, p, cold=False)
                timing["warm"].append((time.perf_counter() - t) * 1000 / len(parsed))
                t = time.perf_counter()
                for f in specs:
                    tantivy_mask(tv_index, f["$text"], n, an)
                timing["tantivy"].append((time.perf_counter() - t) * 1000 / len(specs))
                pairs = [(queries[i % len(queries)], parsed[i % len(parsed)]) for i in range(max(len(queries), len(parsed)))]
                for label, cold, use in (("search_none", False, False), ("search_cold", True, True),
                                         ("search_warm", False, True)):
                    t = time.perf_counter()
                    for q, p in pairs:
                        if cold:
                            for seg in snap.segments:
                                seg._text = Once()
                        searcher.search(q, k=10, method="bm25", filter=p if use else None)
                    timing[label].append((time.perf_counter() - t) * 1000 / len(pairs))
            med = {k: median_spread(v) for k, v in timing.items()}
            matched = float(np.mean([ref.mean() for ref in refs]))
            row = {"filter": kind, "matching share": matched, "ours exact": ours_exact,
                   "tantivy agrees": f"{sum(tv_agree)}/{len(tv_agree)}",
                   "mask cold ms": med["cold"][0], "mask warm ms": med["warm"][0], "tantivy ms": med["tantivy"][0],
                   "bm25 ms": med["search_none"][0],
                   "+ms cold": med["search_cold"][0] - med["search_none"][0],
                   "+ms warm": med["search_warm"][0] - med["search_none"][0]}
            rows.append(row)
            result[kind] = {"filters": specs, "matching_share": matched, "ours_exact": ours_exact,
                            "tantivy_agrees": int(sum(tv_agree)), "count": len(specs),
                            **{f"{k}_ms_median": v[0] for k, v in med.items()},
                            **{f"{k}_ms_spread": v[1] for k, v in med.items()}}
        print(f"{n:,} passages in {args.segments} segments ({corpus.name}); {len(queries)} queries; "
              f"{args.repeats} repeats, medians (spread in the JSON)")
        print(table(rows, ["filter", "matching share", "ours exact", "tantivy agrees", "mask cold ms", "mask warm ms",
                           "tantivy ms", "bm25 ms", "+ms cold", "+ms warm"]))
        build = {"index_build_s (texts + bm25, for scale)": index_s, "python_analysis_of_all_texts_s": analyse_s,
                 "bm25_part_bytes": bm25_bytes, "stored_text_bytes": text_bytes,
                 "tantivy_positions_build_s_median": statistics.median(tv_builds),
                 "tantivy_positions_build_s_spread": max(tv_builds) - min(tv_builds),
                 "tantivy_positions_bytes": tv_bytes,
                 "shipped_engine_extra_bytes": 0}
        print(table([{"what": k, "value": v} for k, v in build.items()], ["what", "value"]))
        write_json(args.out, {"corpus": corpus.name, "passages": n, "segments": args.segments,
                              "queries": len(queries), "repeats": args.repeats, "per_kind": args.per_kind,
                              "build": build, "kinds": result})
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
