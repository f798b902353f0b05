"""Expansion terms beside a hit (the learned-sparse terms absent from its text): ordered by their
contribution to the score (query weight x document weight), and those under EXPANSION_FLOOR (5%) of
the hit's learned-sparse score counted instead of listed, in the CLI, the API (``share``) and the page."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hybridret import HybridRetriever
from hybridret.cli import main
from hybridret.search.snippets import EXPANSION_FLOOR, shown_expansions
from hybridret.types import MatchedTerm

REPO = Path(__file__).resolve().parents[1]
QUERIES = ["Why does a star like the Sun swell into a red giant?", "how do tides work", "who discovered insulin"]


def test_the_rule_by_hand():
    terms = [MatchedTerm("star", 2.0, 2.0, False),     # 4.0, literal: counts in the score, never an expansion
             MatchedTerm("sun", 1.0, 0.5, True),       # 0.5 = 10% of 5.0
             MatchedTerm("phone", 0.1, 1.0, True),     # 0.1 = 2%: under the floor
             MatchedTerm("giant", 0.5, 0.6, True),     # 0.3 = 6%
             MatchedTerm("mortal", 0.1, 1.0, True)]    # 0.1 = 2%
    shown, minor = shown_expansions(terms)
    assert [m.term for m in shown] == ["sun", "giant"] and [m.term for m in minor] == ["phone", "mortal"]
    assert shown_expansions(terms, floor=0.0)[1] == [] and shown_expansions([]) == ([], [])
    assert EXPANSION_FLOOR == 0.05


def test_the_page_uses_the_same_floor():
    js = (REPO / "hybridret" / "serve" / "static" / "app.js").read_text(encoding="utf-8")
    assert float(re.search(r"const EXPANSION_FLOOR = ([0-9.]+);", js).group(1)) == EXPANSION_FLOOR


@pytest.fixture(scope="module")
def kb(paired_encoder, small_corpus, tmp_path_factory):
    path = tmp_path_factory.mktemp("exp") / "idx"
    HybridRetriever(paired_encoder).index(small_corpus, workdir=path, show_progress=False)
    return path


def test_cli_lists_expansions_by_contribution_above_the_floor(kb, capsys):
    hits = HybridRetriever.load(kb).search(QUERIES, k=5, method="sparse")
    minor_seen = 0
    for i, q in enumerate(QUERIES):
        assert main(["-q", "search", str(kb), q, "-k", "5", "--method", "sparse"]) == 0
        lines = [x for x in capsys.readouterr().out.splitlines() if x.strip().startswith("matched:")]
        assert len(lines) == len(hits[i])
        for hit, line in zip(hits[i], lines):
            total = sum(m.contribution for m in hit.matched_terms)
            listed = re.findall(r"(\S+?)(\*?) (-?[0-9.]+)(?:,|;|$)", line.split("matched:", 1)[1])
            values = [float(v) for _, _, v in listed]
            assert values == sorted(values, reverse=True)  # by contribution
            for term, star, value in listed:
                if star:  # an expansion shown: at least 5% of the hit's sparse score
                    assert float(value) >= EXPANSION_FLOOR * total - 0.006, (term, value, total)
            shown, minor = shown_expansions(hit.matched_terms)
            assert sum(1 for _, s, _ in listed if s) == min(len(shown), 10)
            if minor:
                minor_seen += 1
                assert f"+{len(minor)} expansion term" in line and "under 5% of the sparse score" in line
            else:
                assert "under 5%" not in line
    assert minor_seen  # the floor did hide some terms here


def test_api_gives_each_terms_share(kb, start_server):
    httpx = pytest.importorskip("httpx")
    _, url = start_server(kb)
    res = httpx.post(f"{url}/search", json={"queries": QUERIES, "k": 3, "method": "sparse"}, timeout=120).json()
    for r in res["results"]:
        for h in r["hits"]:
            terms = h["matched_terms"]
            assert abs(sum(t["share"] for t in terms) - 1.0) < 1e-4
            assert [t["contribution"] for t in terms] == sorted((t["contribution"] for t in terms), reverse=True)
