"""The package's import structure, computed with ``ast`` over hybridret/'s source (nothing is imported):
no import cycle among hybridret modules, and no module importing from a layer above its own.

What counts as an import of module A by module B: **every** ``import`` / ``from ... import`` statement
in B that names a hybridret module, wherever it stands:

* at module level, **inside functions and methods** (a deferred import is still a dependency: it only
  runs later) and **under ``if TYPE_CHECKING:``** (an annotation is a dependency of the reader, and a
  type-only circle is a file boundary in the wrong place all the same);
* ``from pkg import name`` counts ``pkg.name`` when that is a module, else ``pkg`` (the name is defined
  in its ``__init__``);
* the package ``__init__`` modules that importing ``a.b.c`` runs (``a.b``) are checked separately
  (:func:`test_importing_a_module_runs_no_package_init_above_it`);
* not ``importlib.import_module("...")`` with a string (the adapters' lazy framework and client loads).

Both the cycle check and the layer check read every kind, and both allow no exception.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "hybridret"

#: bottom first; a module belongs to the layer of the longest prefix that matches its name. A module may
#: import from its own layer and those below, never from a layer above.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("hybridret._version", "hybridret.errors", "hybridret._runtime", "hybridret.methods",
              "hybridret.types", "hybridret.models")),
    # index/metadata.py is the metadata schema and its columns (numpy + errors): data and filters read it
    # index/analysis.py is the text analyzer (tantivy only): filters.py analyses $text words with it
    # arrow.py reads Parquet / Arrow rows as documents for data.py's CorpusReader and the writers
    ("data", ("hybridret.data", "hybridret.arrow", "hybridret.filters", "hybridret.eval",
              "hybridret.runs", "hybridret.irds", "hybridret.index.metadata", "hybridret.index.analysis")),
    ("encoders", ("hybridret.encoders",)),
    # chunking cuts documents into the rows segments hold (data + index.metadata, the encoder duck-typed)
    ("index", ("hybridret.index", "hybridret.chunking")),
    ("retrievers", ("hybridret.retrievers",)),
    # fusion/: settings, the method table, scores, candidate gathering, GQR (over the retrievers)
    ("fusion", ("hybridret.fusion",)),
    # search/: the read side: request, plan, sources, the executor and its stages, what the stages read
    # (grouping, rerank, snippets, relevance), listing, the Searcher, calibration
    ("search", ("hybridret.search",)),
    # group_commit: several writes of one IndexWriter in one commit (over the indexer, under the retriever)
    ("write", ("hybridret.indexer", "hybridret.group_commit")),
    ("facade", ("hybridret.retriever", "hybridret.tune", "hybridret.train")),
    ("services", ("hybridret.client", "hybridret.serve", "hybridret.integrations", "hybridret.distributed")),
    ("cli", ("hybridret.cli", "hybridret.__main__")),
    ("package", ("hybridret",)),  # hybridret/__init__.py: the public API, re-exported from everything below
]


#: package __init__s that run when a module below them is imported, with the reason and the owner of the fix.
INIT_EXCEPTIONS: dict[tuple[str, str], str] = {
    ("hybridret.data", "hybridret.index"): (
        "importing hybridret.index.metadata runs index/__init__.py, which imports DenseIndex and SparseIndex "
        "(index layer) for data.py and filters.py; the fix is in index/ (move metadata.py out of the index "
        "package, or make index/__init__ import lazily), another engineer's files in issue #19"),
    ("hybridret.filters", "hybridret.index"): "the same as hybridret.data -> hybridret.index (index.metadata)",
    ("hybridret.arrow", "hybridret.index"): "the same as hybridret.data -> hybridret.index (index.metadata)",
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PKG.rglob("*.py")}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST, typing_only: bool = False):
    """(node, under TYPE_CHECKING) for every import statement, at any depth."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, typing_only
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                yield from _imports(ast.Module(body=[child], type_ignores=[]), True)
            for child in node.orelse:
                yield from _imports(ast.Module(body=[child], type_ignores=[]), typing_only)
        else:
            yield from _imports(node, typing_only)


def _targets(name: str, node: ast.Import | ast.ImportFrom) -> set[str]:
    mods = modules()
    if isinstance(node, ast.Import):
        found = {a.name for a in node.names}
    else:
        if node.level:
            base = name.split(".")
            if not modules()[name].name == "__init__.py":
                base = base[:-1]
            base = base[:len(base) - (node.level - 1)]
            pkg = ".".join(base + ([node.module] if node.module else []))
        else:
            pkg = node.module or ""
        subs = {f"{pkg}.{a.name}" for a in node.names if f"{pkg}.{a.name}" in mods}
        # ``from pkg import sub`` imports the submodule; ``pkg`` itself counts for the names it defines
        found = subs | ({pkg} if len(subs) < len(node.names) else set())
    return {t for t in found if t in mods and t != name}


@cache
def edges(typing: bool) -> frozenset[tuple[str, str]]:
    """(importer, imported) pairs; ``typing``: include the TYPE_CHECKING-only imports."""
    out = set()
    for name, path in modules().items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node, typing_only in _imports(tree):
            if typing_only and not typing:
                continue
            out |= {(name, t) for t in _targets(name, node)}
    return frozenset(out)


def layer_of(name: str) -> int:
    best, depth = None, -1
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (name == p or name.startswith(p + ".")) and len(p) > depth:
                best, depth = i, len(p)
    assert best is not None, f"{name} is in no layer: add it to LAYERS"
    return best


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_analysis_sees_the_package():
    mods = modules()
    assert {"hybridret", "hybridret.cli", "hybridret.cli.search", "hybridret.methods", "hybridret.search.searcher"} <= set(mods)
    e = edges(False)
    assert ("hybridret.search.searcher", "hybridret.methods") in e  # module level
    assert ("hybridret.cli.search", "hybridret.retriever") in e  # inside a function
    assert ("hybridret.cli", "hybridret.cli.search") in e  # from . import search
    typing_only = ("hybridret.search.plan", "hybridret.search.rerank")  # under `if TYPE_CHECKING:` only
    assert typing_only in edges(True) and typing_only not in e


def test_every_module_is_in_a_layer():
    for name in modules():
        layer_of(name)


def test_no_import_cycle():
    """Every import kind counted (module level, in functions, under TYPE_CHECKING): no circle at all."""
    graph: dict[str, set[str]] = {}
    for a, b in edges(True):
        graph.setdefault(a, set()).add(b)
    assert _cycles(graph) == []


def test_no_upward_import():
    upward = sorted((a, LAYERS[layer_of(a)][0], b, LAYERS[layer_of(b)][0]) for a, b in edges(True)
                    if layer_of(b) > layer_of(a))
    assert upward == [], "\n".join(f"{a} ({la}) imports {b} ({lb})" for a, la, b, lb in upward)


def test_importing_a_module_runs_no_package_init_above_it():
    mods = modules()
    found = set()
    for a, b in edges(False):
        parts = b.split(".")
        for i in range(1, len(parts)):
            pkg = ".".join(parts[:i])
            if pkg in mods and pkg != a and not a.startswith(pkg + ".") and layer_of(pkg) > layer_of(a):
                found.add((a, pkg))
    unexplained = sorted(found - set(INIT_EXCEPTIONS))
    assert unexplained == [], unexplained
    assert set(INIT_EXCEPTIONS) <= found, "an exception no longer needed: remove it"
