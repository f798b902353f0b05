"""The maps of the package stay true: docs/architecture.md's module table names every module under
hybridret/ (and nothing that is gone), and the README's layout names every top-level module and
package. A module added, moved or deleted without its line fails here."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "hybridret"


def modules() -> set[Path]:
    """Every module of the package, relative to hybridret/ (package ``__init__`` / ``__main__`` aside
    where the folder stands for them)."""
    return {p.relative_to(PKG) for p in PKG.rglob("*.py") if p.name != "__init__.py"}


def table_rows() -> list[str]:
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = text.split("## Where each thing lives", 1)[1].split("\n## ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| layer")]


def covered(row: str) -> tuple[set[Path], list[str]]:
    """The modules a table row names, and the names in it that are no module. A row names a module
    by its path from hybridret/ (``index/manifest.py``), or by its file name when the row names a
    folder that holds it (``retrievers/`` ... ``dense.py``) or it stands at the top level."""
    tokens = re.findall(r"`([A-Za-z0-9_./]+)`", row)
    folders = {Path(t.rstrip("/")) for t in tokens if t.endswith("/") and (PKG / t).is_dir()}
    folders |= {Path(t).parent for t in tokens if t.endswith(".py") and "/" in t and (PKG / t).is_file()}
    found: set[Path] = set()
    stale: list[str] = []
    for t in tokens:
        if not t.endswith(".py"):
            continue
        hits = {Path(t)} if (PKG / t).is_file() else set()
        for folder in folders:
            hits |= {p.relative_to(PKG) for p in (PKG / folder).rglob(Path(t).name)}
        if not hits:
            stale.append(t)
        found |= hits
    return found, stale


def test_the_architecture_table_names_every_module():
    found: set[Path] = set()
    stale: list[str] = []
    for row in table_rows():
        f, s = covered(row)
        found |= f
        stale += s
    missing = sorted(str(m) for m in modules() - found)
    assert not missing, f"docs/architecture.md's module table misses {missing}: add each to the row of its layer"
    assert not stale, f"docs/architecture.md's module table names modules that do not exist: {stale}"


def test_the_readme_layout_names_every_top_level_module_and_package():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = text.split("## Layout", 1)[1].split("```", 2)[1]
    names = set(re.findall(r"(?<![\w/])([A-Za-z_][\w]*(?:\.py|/))", block))
    tops = {p.name for p in PKG.iterdir() if p.suffix == ".py" and p.name != "__init__.py"}
    tops |= {p.name + "/" for p in PKG.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    missing = sorted(tops - names)
    assert not missing, f"README's Layout misses {missing}"
    for folder in ("search", "fusion"):  # the read side and fusion: every module by name
        inner = {p.name for p in (PKG / folder).glob("*.py") if p.name != "__init__.py"}
        assert inner <= names, f"README's Layout misses {sorted(inner - names)} of {folder}/"
