"""The documentation runs: README.md's Python snippets execute, every ``hybridret`` line of its
CLI block parses with the real parser (and covers every subcommand), the cheap ones run on a
small corpus, and the Python snippets of docs/filters.md execute."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from hybridret.cli import build_parser, main

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
SAMPLE = REPO / "hybridret" / "resources" / "sample" / "corpus.jsonl"


def _blocks(path: Path, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", path.read_text(encoding="utf-8"), flags=re.S | re.M)


def _section(text: str, heading: str) -> str:
    start = text.index(heading)
    nxt = text.find("\n## ", start + len(heading))
    return text[start:] if nxt < 0 else text[start:nxt]


def _cli_lines() -> list[list[str]]:
    """Every ``hybridret ...`` command of the README's CLI section, as argv lists (continuations
    joined, comments dropped, the part after a pipe taken)."""
    section = _section(README.read_text(encoding="utf-8"), "## CLI")
    out = []
    for block in re.findall(r"^```bash\n(.*?)^```", section, flags=re.S | re.M):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if "|" in words:
                words = words[words.index("|") + 1:]
            if words and words[0] == "hybridret":
                out.append(words[1:])
    return out


def _full_parser():
    parser = build_parser()
    parser.add_argument("--debug", action="store_true")  # added by main(), as there
    return parser


def _subcommands(parser) -> set[str]:
    action = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    return set(action.choices)


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_readme_python_snippets_run(workdir, capsys):
    blocks = _blocks(README, "python")
    assert len(blocks) >= 3
    namespace: dict = {"__name__": "readme"}
    for i, code in enumerate(blocks):  # in order, sharing names, as a reader would type them
        exec(compile(code, f"README.md python block {i + 1}", "exec"), namespace)
    printed = capsys.readouterr().out
    assert "d1" in printed and "d3" in printed  # the hit loop and the Searcher's threaded results


def test_filters_md_snippets_run(workdir):
    blocks = _blocks(REPO / "docs" / "filters.md", "python")
    assert blocks
    for i, code in enumerate(blocks):
        exec(compile(code, f"docs/filters.md python block {i + 1}", "exec"), {"__name__": "filters_md"})


def test_readme_cli_lines_are_real_commands_covering_every_subcommand():
    lines = _cli_lines()
    parser = _full_parser()
    for argv in lines:
        try:
            parser.parse_args(argv)
        except SystemExit as exc:  # argparse: unknown command, flag or value
            pytest.fail(f"README CLI line does not parse ({exc}): hybridret {shlex.join(argv)}")
    shown = {parser.parse_args(argv).command for argv in lines}
    assert shown == _subcommands(parser), f"subcommands missing from the README: {_subcommands(parser) - shown}"


def _write_corpora(root: Path) -> None:
    docs = [json.loads(line) for line in SAMPLE.open(encoding="utf-8")][:20]
    rows = [{"_id": f"doc{i + 1}", "title": d["title"], "text": d["text"],
             "source": "wiki" if i % 2 else "news", "year": 2016 + i % 8} for i, d in enumerate(docs)]
    (root / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:15]))
    (root / "more.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[15:]))
    changed = dict(rows[0], text="The Louvre museum in Paris holds the Mona Lisa.", source="wiki", year=2024)
    (root / "changed.jsonl").write_text(json.dumps(changed) + "\n")
    (root / "stale.txt").write_text("doc3\nnot-an-id\n")
    (root / "questions.txt").write_text("museum in paris\nsourdough bread\n")
    (root / "runs").mkdir(exist_ok=True)


def test_readme_cli_cheap_commands_run(workdir, capsys):
    """The README's commands on ``indexes/c`` run, in README order, on a 20-document slice of the
    sample corpus (the ones reading ../shared, training or piping are parsed above only)."""
    _write_corpora(workdir)
    ran = []
    for argv in _cli_lines():
        cmd = argv[argv.index("--debug") + 1] if "--debug" in argv else argv[0]
        targets_c = "indexes/c" in argv
        if cmd == "index" and (argv[1] != "corpus.jsonl" or not targets_c):
            continue  # ../shared, stdin, or a trained model
        if not targets_c or cmd not in ("index", "add", "delete", "compact", "search", "info"):
            continue
        code = main(["-q", *argv])
        out = capsys.readouterr()
        assert code == 0, f"hybridret {shlex.join(argv)} -> {code}: {out.err}"
        ran.append((argv, out.out))
    commands = {a[a.index("--debug") + 1] if "--debug" in a else a[0] for a, _ in ran}
    assert commands == {"index", "add", "delete", "compact", "search", "info"}
    filtered = next(out for a, out in ran if "--filter" in a)
    assert re.search(r"\bdoc1\b", filtered)  # the upserted Louvre document: wiki, 2024
    assert main(["-q", "info", "indexes/c", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    # 15 indexed + 5 added, doc1 replaced, doc7 doc9 doc3 deleted, then compacted
    assert info["num_docs"] == 17 and len(info["segments"]) == 1


def test_readme_states_the_rrf_and_linear_defaults():
    """The README says which retrievers `rrf` and `linear` fuse when no fusion= is given: the defaults."""
    from hybridret.search.plan import default_fusion

    text = " ".join(README.read_text(encoding="utf-8").split())
    assert "Without `fusion=`, `rrf` and `linear` fuse **dense + learned sparse** only (linear: min-max)" in text
    every = {"dense": True, "sparse": True, "bm25": True}
    for method in ("rrf", "linear"):
        cfg = default_fusion(method, available=every)
        assert cfg.retrievers == ("dense", "sparse"), cfg
    assert default_fusion("linear", available=every).normalisation == "minmax"
