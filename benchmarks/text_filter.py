"""Full-text filters (``$text``): what they cost, per engine, against a brute-force reference.

On a shared collection (default the 30,005-passage MS MARCO DL19 pool, ``../shared/data``;
``--smoke``: the bundled sample) indexed for BM25 only (no encoder: a text filter's cost does not
depend on the vectors), in ``--segments`` segments, twice: with the ``phrases`` part (the default)
and without it (``phrase_index=False``, the layout of an index written before the part existed).
Engines compared on the same filters:

* **shipped** (:mod:`hybridret.index.textmatch`): words from the BM25 part's postings, phrases
  from one tantivy phrase query to the ``phrases`` part (:mod:`hybridret.index.phrases`);
* **no part** (the fallback for older segments): phrases from the postings of their words
  intersected and each candidate's stored text analysed again and scanned;
* **tantivy for words too**: every entry (words as term queries, phrases as phrase queries, ``none``
  as MustNot) as one boolean query to the ``phrases`` part, hits mapped to rows by its fast field.

Mask times per filter are *cold* (a fresh matcher: nothing cached) and *warm* (phrase results are
kept per segment). **Reference**: every text analysed in Python and scanned (the tests' brute
force); each engine's masks are checked against it (``exact``). **ms/query added** to a BM25 top-10
search (the collection's queries, one per call) by each filter kind, against the same searches
without a filter. **Build and disk**: the ``phrases`` part built over all texts (``--repeats``
times), its bytes next to the BM25 part's and the stored texts'.

Filters are drawn with a fixed seed from the corpus: single words by document frequency (rare
10-100, common 1,000-5,000 per 30k), ``all`` of two mid words, ``none`` of one common word, and
phrases of 2 and 3 consecutive words taken from a document (so most match something).

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
from hybridret.index.phrases import FIELD, PhraseIndexBuilder  # noqa: E402
from hybridret.index.textmatch import full_text, holds_sequence  # noqa: E402

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


# -- tantivy for words too: one boolean query per segment to its phrases part ---------------------------------
def tantivy_all_mask(snap: Any, spec: dict[str, Any], an: Any) -> np.ndarray:
    import tantivy

    out = []
    for seg in snap.segments:
        part = seg.part("phrases")
        schema, searcher, n = part.schema, part.searcher, part.num_docs

        def entry_query(entry: str) -> Any:
            toks = list(an.analyze(entry))
            if len(toks) == 1:
                return tantivy.Query.term_query(schema, FIELD, toks[0])
            return tantivy.Query.phrase_query(schema, FIELD, toks)

        entries = ([spec["phrase"]] if "phrase" in spec else []) + spec.get("all", [])
        clauses = [(tantivy.Occur.Must, entry_query(e)) for e in entries] or [(tantivy.Occur.Must, tantivy.Query.all_query())]
        clauses += [(tantivy.Occur.MustNot, entry_query(e)) for e in spec.get("none", [])]
        hits = searcher.search(tantivy.Query.boolean_query(clauses), limit=max(1, n), count=False).hits
        mask = np.zeros(n, dtype=bool)
        if hits:
            mask[np.asarray(searcher.fast_field_values("row", [addr for _, addr in hits]), dtype=np.int64)] = True
        out.append(mask)
    return np.concatenate(out)


def part_build_seconds(folder: Path, texts: list[str]) -> float:
    shutil.rmtree(folder, ignore_errors=True)
    t = time.perf_counter()
    builder = PhraseIndexBuilder(folder)
    for i in range(0, len(texts), 4096):
        builder.add(texts[i:i + 4096])
    builder.close()
    return time.perf_counter() - t


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
        snaps, searchers, build_s = {}, {}, {}
        for name, on in (("shipped", True), ("no part", False)):
            t0 = time.perf_counter()
            for j in range(args.segments):
                with IndexWriter(work / name, encoder=TextOnly(), settings={"max_segments": 0, "phrase_index": on}) as w:
                    w.write(docs[cuts[j]:cuts[j + 1]], mode="build" if j == 0 else "add", show_progress=False)
            build_s[name] = time.perf_counter() - t0
            searchers[name] = Searcher(work / name)
            snaps[name] = searchers[name].snapshot
        snap = snaps["shipped"]
        assert all(seg.part("phrases") is not None for seg in snap.segments)
        assert all(seg.part("phrases") is None for seg in snaps["no part"].segments)
        bm25_bytes = sum(folder_bytes(seg.root / "bm25") for seg in snap.segments)
        phrase_bytes = sum(folder_bytes(seg.root / "phrases") for seg in snap.segments)
        text_bytes = sum((seg.root / "texts.bin").stat().st_size + (seg.root / "texts.offsets.npy").stat().st_size
                         for seg in snap.segments)
        part_builds = [part_build_seconds(work / "part", texts) for _ in range(args.repeats)]

        rows: list[dict[str, Any]] = []
        result: dict[str, Any] = {}
        for kind in KINDS:
            specs = filters[kind]
            parsed = [parse_filter(f) for f in specs]
            refs = [reference_mask(tokens, f["$text"], an) for f in specs]
            exact = {name: all(np.array_equal(ours_mask(snaps[name], p, cold=True), ref) for p, ref in zip(parsed, refs))
                     for name in snaps}
            exact["tantivy all"] = all(np.array_equal(tantivy_all_mask(snap, f["$text"], an), ref)
                                       for f, ref in zip(specs, refs))
            timing: dict[str, list[float]] = {}

            def timed(label: str, fn: Any, items: list[Any]) -> None:
                t = time.perf_counter()
                for item in items:
                    fn(item)
                timing.setdefault(label, []).append((time.perf_counter() - t) * 1000 / len(items))

            pairs = [(queries[i % len(queries)], parsed[i % len(parsed)]) for i in range(max(len(queries), len(parsed)))]

            def search(name: str, use: bool, cold: bool) -> Any:
                def run(pair: tuple[str, Any]) -> None:
                    if cold:
                        for seg in snaps[name].segments:
                            seg._text = Once()
                    searchers[name].search(pair[0], k=10, method="bm25", filter=pair[1] if use else None)
                return run

            for _ in range(args.repeats):
                timed("shipped cold", lambda p: ours_mask(snap, p, cold=True), parsed)
                for p in parsed:  # fill the per-segment phrase results, then time reading them
                    ours_mask(snap, p, cold=False)
                timed("shipped warm", lambda p: ours_mask(snap, p, cold=False), parsed)
                timed("no part cold", lambda p: ours_mask(snaps["no part"], p, cold=True), parsed)
                timed("tantivy all", lambda f: tantivy_all_mask(snap, f["$text"], an), specs)
                timed("search none", search("shipped", False, False), pairs)
                timed("search shipped cold", search("shipped", True, True), pairs)
                timed("search shipped warm", search("shipped", True, False), pairs)
                timed("search no part cold", search("no part", True, True), pairs)
            med = {k: median_spread(v) for k, v in timing.items()}
            matched = float(np.mean([ref.mean() for ref in refs]))
            base = med["search none"][0]
            rows.append({"filter": kind, "matching share": matched,
                         "exact (shipped/no part/tantivy all)": "/".join(str(exact[k]) for k in
                                                                         ("shipped", "no part", "tantivy all")),
                         "shipped cold ms": med["shipped cold"][0], "shipped warm ms": med["shipped warm"][0],
                         "no part cold ms": med["no part cold"][0], "tantivy all ms": med["tantivy all"][0],
                         "bm25 ms": base, "+ms shipped cold": med["search shipped cold"][0] - base,
                         "+ms shipped warm": med["search shipped warm"][0] - base,
                         "+ms no part cold": med["search no part cold"][0] - base})
            result[kind] = {"filters": specs, "matching_share": matched, "exact": exact, "count": len(specs),
                            **{f"{k}_ms_median": v[0] for k, v in med.items()},
                            **{f"{k}_ms_spread": v[1] for k, v in med.items()}}
        print(f"{n:,} passages in {args.segments} segments ({corpus.name}); {len(queries)} queries; "
              f"{args.repeats} repeats, medians of per-filter means (spread in the JSON)")
        print(table(rows, list(rows[0])))
        build = {"index_build_s_with_part": build_s["shipped"], "index_build_s_without_part": build_s["no part"],
                 "phrases_part_build_s_median": statistics.median(part_builds),
                 "phrases_part_build_s_spread": max(part_builds) - min(part_builds),
                 "phrases_part_bytes": phrase_bytes, "bm25_part_bytes": bm25_bytes, "stored_text_bytes": text_bytes,
                 "python_analysis_of_all_texts_s": analyse_s}
        print(table([{"what": k, "value": v} for k, v in build.items()], ["what", "value"]))
        write_json(args.out, {"corpus": corpus.name, "passages": n, "segments": args.segments,
                              "queries": len(queries), "repeats": args.repeats, "per_kind": args.per_kind,
                              "build": build, "kinds": result})
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
