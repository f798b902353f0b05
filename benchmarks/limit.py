"""Generate a LIMIT-style collection ("Who likes X?") offline, seeded, in BEIR layout.

Written for this project from the description in Weller et al., "On the Theoretical Limitations
of Embedding-Based Retrieval" (2025): every document reads "<Name> likes A, B, ... and Z." with a
fixed number of attributes; every query asks "Who likes X?" and has exactly two relevant documents;
the relevant pairs are drawn from a small core of people (46), one distinct pair per query, so a
single-vector embedding must represent many pair combinations. Other documents are distractors
whose attributes never appear in a query.

    python benchmarks/limit.py -o /tmp/limit-full                  # 50,000 documents, 1,000 queries
    python benchmarks/limit.py -o /tmp/limit-small --docs 46       # the core only

The released LIMIT data gives each person 44 attributes (the default here). Names come from small
word lists in this file and each attribute is a unique made-up word plus a common noun, so the text
differs from the released set while keeping its structure: one distinct term per attribute.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import numpy as np

FIRST = ("Ada Alma Arlo Bea Cato Cleo Dara Eli Ezra Fay Gus Hana Ines Ivo Jude Kai Lena Lior Mae Milo Nia Noor Oren "
         "Pia Quin Rae Remy Sana Saul Tess Theo Uma Vera Wade Xena Yara Yuri Zane Zoe Abel Bram Cora Dion Edda Finn "
         "Greta Hugo Iris Joss Kira Lars Maya Nico Opal Pax Rosa Seth Tova Ugo Vito").split()
LAST = ("Abbot Bakker Castell Dunmore Eckert Falk Garrow Hale Ingram Jessup Kovacs Lindqvist Marsh Novak Okafor "
        "Pryce Quayle Rourke Sato Thorne Ulrich Vance Whitlock Xu Yates Zeller Amari Brandt Cole Dorsey Ellery Frost "
        "Grieve Holm Ivers Jansen Keane Lowe Mercer Nash Orwell Pike Rook Stroud Tate Upton Voss Wilde York Zorn").split()
NOUN = ("Kites Lanterns Otters Tapirs Pangolins Quokkas Herons Ferns Orchids Tulips Cacti Maples Canoes Bicycles "
        "Trams Gliders Violins Cellos Drums Harps Puzzles Riddles Sonnets Operas Murals Mosaics Pottery Quilts "
        "Lemons Figs Dumplings Pretzels Noodles Tacos Waffles Cheeses Teapots Clocks Compasses Telescopes Maps "
        "Stamps Coins Marbles Chess Sets Board Games Crosswords Sculptures Fountains Lighthouses Bridges Castles "
        "Gardens Caves Glaciers Volcanoes Comets Nebulas").split()


def people(n: int, rng: np.random.Generator) -> list[str]:
    names = [f"{a} {b}" for a, b in itertools.product(FIRST, LAST)]
    if n > len(names):
        names += [f"{a} {b}-{c}" for c in LAST for a, b in itertools.product(FIRST, LAST)]
    if n > len(names):
        raise SystemExit(f"at most {len(names)} documents")
    return [names[i] for i in rng.choice(len(names), size=n, replace=False)]


def attributes(n: int, rng: np.random.Generator) -> list[str]:
    """``n`` distinct attributes, each a unique made-up word plus a common noun ("Torvamin Kites").

    In LIMIT every attribute is its own term, which is what lets lexical matching solve it; plain
    adjective + noun phrases would share their words across many attributes and blur that."""
    syllables = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]
    words: set[str] = set()
    while len(words) < n:
        parts = rng.choice(len(syllables), size=3)
        words.add("".join(syllables[i] for i in parts).capitalize() + "n")
    ordered = sorted(words)
    return [f"{ordered[i]} {NOUN[rng.integers(len(NOUN))]}" for i in rng.permutation(n)]


def core_pairs(core: int, queries: int, per_doc: int, rng: np.random.Generator) -> list[tuple[int, int]]:
    """``queries`` distinct pairs of core people, nobody in more than ``per_doc`` of them."""
    pairs = list(itertools.combinations(range(core), 2))
    if queries > len(pairs):
        raise SystemExit(f"{core} core people give only {len(pairs)} pairs; asked for {queries} queries")
    order = [pairs[i] for i in rng.permutation(len(pairs))]
    degree = np.full(core, core - 1)
    keep = []
    drop = len(pairs) - queries
    for i, j in order:  # drop first the pairs whose people are over the per-document budget
        if drop and degree[i] > per_doc and degree[j] > per_doc:
            degree[i] -= 1
            degree[j] -= 1
            drop -= 1
        else:
            keep.append((i, j))
    keep = keep[: queries]
    if np.bincount(np.array(keep).ravel(), minlength=core).max() > per_doc:
        raise SystemExit("cannot fit the pairs into the attribute budget; raise --attributes or --core")
    return keep


def generate(out: Path, *, docs: int = 50_000, queries: int = 1000, core: int = 46, per_doc: int = 44,
             seed: int = 0) -> dict[str, int]:
    if docs < core:
        raise SystemExit(f"--docs must be at least --core ({core})")
    rng = np.random.default_rng(seed)
    names = people(docs, rng)
    attrs = attributes(queries + max(2000, 4 * per_doc), rng)
    pairs = core_pairs(core, queries, per_doc, rng)
    query_attrs, filler = attrs[:queries], attrs[queries:]
    if len(filler) < per_doc:
        raise SystemExit("not enough attribute names for the distractors")
    liked: list[list[str]] = [[] for _ in range(docs)]
    for q, (i, j) in enumerate(pairs):
        liked[i].append(query_attrs[q])
        liked[j].append(query_attrs[q])
    for d in range(docs):  # pad everyone with attributes no query asks about
        need = per_doc - len(liked[d])
        liked[d] += [filler[k] for k in rng.choice(len(filler), size=need, replace=False)]
        rng.shuffle(liked[d])
    out.mkdir(parents=True, exist_ok=True)
    (out / "qrels").mkdir(exist_ok=True)
    with open(out / "corpus.jsonl", "w", encoding="utf-8") as fh:
        for d in range(docs):
            text = f"{names[d]} likes {', '.join(liked[d][:-1])} and {liked[d][-1]}."
            fh.write(json.dumps({"_id": names[d], "title": "", "text": text}) + "\n")
    with open(out / "queries.jsonl", "w", encoding="utf-8") as fh:
        for q in range(len(pairs)):
            fh.write(json.dumps({"_id": f"query_{q}", "text": f"Who likes {query_attrs[q]}?"}) + "\n")
    with open(out / "qrels" / "test.tsv", "w", encoding="utf-8") as fh:
        fh.write("query-id\tcorpus-id\tscore\n")
        for q, (i, j) in enumerate(pairs):
            fh.write(f"query_{q}\t{names[i]}\t1\nquery_{q}\t{names[j]}\t1\n")
    return {"docs": docs, "queries": len(pairs), "core": core, "attributes_per_doc": per_doc, "seed": seed}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--output", type=Path, required=True)
    ap.add_argument("--docs", type=int, default=50_000)
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--core", type=int, default=46)
    ap.add_argument("--attributes", type=int, default=44)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    stats = generate(args.output, docs=args.docs, queries=args.queries, core=args.core, per_doc=args.attributes,
                     seed=args.seed)
    print(json.dumps(stats))
    return 0


if __name__ == "__main__":
    sys.exit(main())
