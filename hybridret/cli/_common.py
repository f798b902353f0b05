"""What the commands share: common arguments, logging, building a retriever from the arguments,
output folders and corpus counts, printing hits and write results, and the CLI's error lines.

Imports here are cheap (the standard library, :mod:`hybridret.errors`, :mod:`hybridret.methods`);
everything that loads the engine is imported inside the function that needs it, so that building
the parser (``hybridret --help``) loads no torch, FAISS or tantivy.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import HybridRetError

if TYPE_CHECKING:  # pragma: no cover
    from ..retriever import HybridRetriever
    from ..types import SearchResults

__all__ = ["NamingPath", "add_corpus_args", "add_encoder_args", "add_eval_args", "add_method_arg", "add_ray_args",
           "build_retriever", "check_output", "check_text_args", "corpus_reader", "corpus_total", "count_records",
           "error_line", "judged", "logger", "print_hits", "print_result", "setup_logging", "stderr", "stdout_gone"]

logger = logging.getLogger("hybridret")


# -- arguments ---------------------------------------------------------------------------------------
def add_method_arg(p: argparse.ArgumentParser, help: str | None = None, *, calibration: bool = False) -> None:
    """``--method``, its choices read from the retriever and fusion registries now
    (:mod:`hybridret.methods`), so a retriever or fusion method registered before the parser is built is a choice. ``calibration``: only the
    methods a relevance calibration can be fitted on (:func:`hybridret.search.calibrate.calibration_methods`)."""
    from ..fusion import FUSERS
    from ..methods import method_names
    from ..retrievers import REGISTRY  # the registries' modules load no model or native library

    if calibration:
        from ..search.calibrate import calibration_methods

        choices = list(calibration_methods(REGISTRY))
    else:
        choices = list(method_names(REGISTRY, FUSERS))
    p.add_argument("--method", default="hybrid", choices=choices, help=help)


CORPUS_HELP = "corpus.jsonl, a BEIR folder, collection.tsv (.gz accepted), corpus.parquet or a folder of Parquet files"


def add_corpus_args(p: argparse.ArgumentParser) -> None:
    """The corpus positional, ``--format`` and the Parquet column mapping."""
    p.add_argument("corpus", help=CORPUS_HELP + " (- = standard input)")
    p.add_argument("--format", choices=("jsonl", "beir", "tsv", "parquet"), default=None, help="default: from the path")
    g = p.add_argument_group("Parquet columns (default: _id or id, text or contents, title, every other column as "
                             "metadata, a metadata struct / JSON column merged in)")
    g.add_argument("--id-column", metavar="COL", default=None)
    g.add_argument("--text-column", metavar="COL", default=None)
    g.add_argument("--title-column", metavar="COL", default=None)
    g.add_argument("--metadata-columns", metavar="COL,COL", default=None,
                   help="the columns that become metadata ('' for none)")


def corpus_reader(args: argparse.Namespace, **kw: Any) -> Any:
    """The :class:`~hybridret.data.CorpusReader` of ``args.corpus`` with ``--format`` and the
    column mapping (given only for Parquet: elsewhere it is an error)."""
    from ..data import CorpusReader

    cols: dict[str, Any] = {k: getattr(args, f"{k}_column") for k in ("id", "text", "title")
                            if getattr(args, f"{k}_column", None) is not None}
    if getattr(args, "metadata_columns", None) is not None:
        cols["metadata"] = [c.strip() for c in args.metadata_columns.split(",") if c.strip()]
    return CorpusReader(args.corpus, format=args.format, columns=cols or None, **kw)


def corpus_total(reader: Any) -> int | None:
    """The documents a reader will give, for the progress bar: Parquet's footers, else
    :func:`count_records`."""
    if reader.num_rows is not None:
        return int(reader.num_rows)
    return count_records(reader.file)


def add_encoder_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("encoders")
    g.add_argument("--dense-model", default=None, metavar="NAME",
                   help="dense model: packaged alias, local folder or Hub id (default: all-MiniLM-L6-v2)")
    g.add_argument("--sparse-model", default=None, metavar="NAME",
                   help="SPLADE model: packaged alias, local folder or Hub id (default: splade-tiny)")
    g.add_argument("--joint-model", default=None, metavar="NAME",
                   help="one *ForMaskedLM checkpoint for both heads, instead of --dense-model/--sparse-model")
    g.add_argument("--max-length", type=int, default=256, help="max tokens per text (default: 256)")
    g.add_argument("--device", default=None, help="cpu, cuda, cuda:1 (default: CUDA when available)")


def add_ray_args(p: argparse.ArgumentParser, *, build: bool) -> None:
    g = p.add_argument_group("cluster (needs the ray extra: pip install 'hybridret[ray]'; see docs/cluster.md)")
    if build:
        g.add_argument("--ray", action="store_true", help="build a sharded index on Ray (encoding on an actor pool)")
        g.add_argument("--shards", type=int, default=2, help="with --ray: number of shards (default: 2)")
        g.add_argument("--ray-workers", type=int, default=None,
                       help="with --ray: encoding actors (default: one per GPU, else one per free CPU)")
    else:
        g.add_argument("--ray", action="store_true",
                       help="search a sharded index through Ray shard actors (implied by a sharded DIR)")
    g.add_argument("--ray-address", default=None, metavar="ADDR",
                   help="an existing Ray cluster (e.g. ray://head:10001 or auto; default: start a local one)")


def add_eval_args(p: argparse.ArgumentParser, *, stored_run: bool = False) -> None:
    """DIR, --queries, --qrels, ...; ``stored_run``: DIR and --queries may be left out (``eval --run``)."""
    p.add_argument("index", metavar="DIR", nargs="?" if stored_run else None,
                   help="the index (left out with --run)" if stored_run else None)
    p.add_argument("--queries", required=not stored_run,
                   help="BEIR queries.jsonl or a TSV of qid<TAB>text (MS MARCO)")
    p.add_argument("--qrels", required=True, help="BEIR qrels TSV or TREC qrels (qid 0 docid grade)")
    p.add_argument("--relevance-level", type=int, default=1,
                   help="smallest grade counted relevant by binary metrics (TREC DL: 2; default: 1)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--device", default=None)


def setup_logging(args: argparse.Namespace) -> None:
    """hybridret's log lines on stderr at the level of ``-v``/``-q``; hybridret's own warnings
    (:class:`~hybridret.errors.HybridRetWarning`, given through :mod:`warnings` for library users)
    as log lines too; with ``-q`` other libraries' warnings and log chatter are silenced."""
    level = logging.DEBUG if args.verbose else logging.WARNING if args.quiet else logging.INFO
    _route_warnings(quiet=bool(args.quiet))
    if not any(getattr(h, "_hybridret_cli", False) for h in logger.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s" if args.verbose else "%(message)s"))
        handler._hybridret_cli = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
    logger.setLevel(level)
    # the library's one-line summaries of writes: the commands print their own
    logging.getLogger("hybridret.summary").setLevel(logging.DEBUG if args.verbose else logging.WARNING)


_CLI_STATE = {"quiet": False}  # this CLI run's -q, read by the warnings hook below


def _route_warnings(*, quiet: bool) -> None:
    import warnings

    _CLI_STATE["quiet"] = quiet
    if not getattr(warnings.showwarning, "_hybridret_cli", False):
        original = warnings.showwarning

        def show(message: Any, category: type[Warning], filename: str, lineno: int, file: Any = None,
                 line: str | None = None) -> None:
            from ..errors import HybridRetWarning

            if issubclass(category, HybridRetWarning):
                logger.warning("warning: %s", message)
            elif not _CLI_STATE["quiet"]:
                original(message, category, filename, lineno, file, line)

        show._hybridret_cli = True  # type: ignore[attr-defined]
        warnings.showwarning = show
    if quiet:  # read when transformers first loads (later, lazily): its warnings and info lines stay quiet
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")


# -- building and loading --------------------------------------------------------------------------
def build_retriever(args: argparse.Namespace, **settings: Any) -> HybridRetriever:
    """A new :class:`~hybridret.retriever.HybridRetriever` with the models of ``--dense-model`` /
    ``--sparse-model`` / ``--joint-model`` (and ``--max-length``, ``--device``, ``--encoder-backend``)."""
    from ..encoders import JointEncoder
    from ..retriever import HybridRetriever

    if args.joint_model and (args.dense_model or args.sparse_model):
        raise HybridRetError("--joint-model cannot be combined with --dense-model/--sparse-model")
    backend = getattr(args, "encoder_backend", "auto")  # only `index` has --encoder-backend
    if args.joint_model:
        enc = JointEncoder(args.joint_model, max_length=args.max_length, device=args.device, backend=backend)
        return HybridRetriever(enc, device=args.device, **settings)
    return HybridRetriever.from_models(args.dense_model, args.sparse_model, device=args.device,
                                       max_length=args.max_length, backend=backend, **settings)


def judged(args: argparse.Namespace) -> tuple[HybridRetriever, dict[str, str], dict[str, dict[str, int]]]:
    """The index of ``args.index``, and the queries of ``--queries`` that have judgments in ``--qrels``."""
    from ..data import load_qrels, load_queries
    from ..eval import judgment_coverage, warn_coverage
    from ..retriever import HybridRetriever

    retriever = HybridRetriever.load(args.index, device=args.device)
    queries = load_queries(args.queries)
    qrels = load_qrels(args.qrels)
    found = {q: t for q, t in queries.items() if qrels.get(q)}
    if not found:
        raise HybridRetError(f"none of the {len(queries)} queries in {args.queries} has judgments in {args.qrels}")
    snap = retriever.searcher.snapshot
    cov = judgment_coverage(qrels, queries, snap.__contains__, relevance_level=getattr(args, "relevance_level", 1))
    warn_coverage(cov, queries=str(args.queries), qrels=str(args.qrels), index=f"the index at {args.index}")
    return retriever, found, qrels


def count_records(path: Path) -> int | None:
    """Non-blank lines of a corpus file, for the progress bar's total and ETA (a quick pre-pass).

    Only for regular files: a pipe or standard input can be read once (``None``, no total). The
    pass uses the readers' line splitting, so an over-long line, invalid UTF-8 or a truncated gzip
    file raises :class:`CorpusFormatError` here, before any model is loaded.
    """
    import stat

    from ..data import _iter_lines, is_stream

    if is_stream(path):
        return None
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None
    except OSError:
        return None
    return sum(1 for _, text in _iter_lines(path) if text.strip())


def check_output(out: Path, overwrite: bool) -> None:
    """Fail before any model loads when ``out`` cannot become an index folder."""
    import errno

    from ..errors import IndexExistsError
    from ..index.manifest import MANIFEST

    if out.exists() and not out.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, "exists and is not a directory (the index output must be a folder)",
                                 str(out))
    if (out / MANIFEST).exists() and not overwrite:
        raise IndexExistsError(f"an index already exists at {out}; pass --overwrite to replace it")
    existing = out.absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, "is not a directory, so the index folder cannot be made in it",
                                 str(existing))
    if not os.access(existing, os.W_OK | os.X_OK):
        raise PermissionError(errno.EACCES, "no permission to write here", str(existing))


class NamingPath:
    """Around a write into ``path``: give an ``OSError`` raised without a file name (a failed
    ``write()``: disk full, file too large) the index folder, so that the error names it. (The
    library removes its unfinished segment itself; the previous index stays as it was.)"""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type | None, exc: BaseException | None, tb: Any) -> bool:
        import errno

        from ..errors import HybridRetError

        if not isinstance(exc, OSError) or isinstance(exc, (BrokenPipeError, HybridRetError)) or \
                exc.filename is not None:
            return False  # the library's own errors (an existing id, ...) and errors naming their file stay as they are
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise OSError(exc.errno, f"{exc.strerror or exc} (while writing the index: the disk is full)",
                          str(self.path)) from exc
        if exc.errno == errno.EFBIG:
            raise OSError(exc.errno, f"{exc.strerror or exc} (while writing the index: a file size limit, "
                          "ulimit -f?)", str(self.path)) from exc
        if exc.errno is not None:
            raise OSError(exc.errno, f"{exc.strerror or exc} (while writing the index)", str(self.path)) from exc
        text = str(exc)
        if "requested and" in text and "written" in text:  # numpy's tofile: a short write, without an errno
            raise OSError(f"{self.path}: {exc} (while writing the index: a short write, as when the disk is full "
                          "or a file size limit is reached)") from exc
        raise OSError(f"{self.path}: {exc} (while writing the index)") from exc


# -- printing --------------------------------------------------------------------------------------
def print_hits(hits: SearchResults, i: int, *, width: int = 100) -> None:
    """Query ``i``'s hits as text: rank, id, score and each retriever's, the passage, matched terms
    (by contribution; expansion terms under :data:`~hybridret.search.snippets.EXPANSION_FLOOR` of
    the hit's learned-sparse score are counted, not listed)."""
    from ..search.snippets import EXPANSION_FLOOR, shown_expansions

    print(f"\nquery: {hits.queries[i]}   [{hits.method}]")
    answer = getattr(hits, "answerability", None)
    if answer is not None and answer[i] == answer[i]:  # searched with relevance: the query's answerability
        print(f"  answerability {answer[i]:.2f}" + ("  (likely nothing relevant in the index)" if answer[i] < 0.5
                                                    else ""))
    view = hits[i]
    if not view:
        print("  (no hits)")
    group = object()
    for hit in view:
        if hit.group is not None and hit.group != group:
            group = hit.group
            print(f"{hit.rank:>3}. group {group!r}  score {hit.score:.4f}")
        parts = " ".join(f"{name} {value:.3f}" for name, value in hit.scores.items() if value == value)
        lead = "   -" if hit.group is not None else f"{hit.rank:>3}."
        rel = getattr(hit, "relevance", None)
        rel = f"  relevance {rel:.2f}" if rel is not None else ""
        print(f"{lead} {hit.id}  score {hit.score:.4f}{rel}  ({parts})")
        snippets = getattr(hit, "snippets", None)
        if snippets:  # the best window, matched words in [brackets]
            s = snippets[0]
            body = ("... " if s.start else "") + s.marked("[", "]") + (" ..." if s.end < len(hit.text) else "")
            body = f"{hit.title}: {body}" if hit.title else body
            print(textwrap.indent(textwrap.fill(body, width=width), "     "))
        else:
            body = f"{hit.title}: {hit.text}" if hit.title else hit.text
            print(textwrap.indent(textwrap.shorten(body, width=width, placeholder=" ..."), "     "))
        if hit.matched_terms:  # by contribution; expansion terms under the floor counted, not listed
            shown, minor = shown_expansions(hit.matched_terms)
            keep = {id(m) for m in shown}
            listed = [m for m in hit.matched_terms if not m.expansion or id(m) in keep]
            listed.sort(key=lambda m: -m.contribution)
            terms = ", ".join(f"{m.term}{'*' if m.expansion else ''} {m.contribution:.2f}" for m in listed[:10])
            if minor:
                terms += (f"{'; ' if terms else ''}+{len(minor)} expansion term{'s' if len(minor) > 1 else ''} under "
                          f"{EXPANSION_FLOOR:.0%} of the sparse score")
            print(f"     matched: {terms}")
    if any(m.expansion for hit in view for m in hit.matched_terms):
        print("     (* = expansion term: matched through the sparse model, absent from the document text)")


def print_result(result: Any, args: argparse.Namespace, what: str) -> None:
    """A :class:`~hybridret.indexer.WriteResult` as one line (or JSON with ``--json``)."""
    if args.json:
        print(json.dumps(result.to_dict()))
        return
    print(f"{what} {args.index}: {result.summary()}" + (f" (commit {result.commit})" if result.commit is not None
                                                         else ""))


# -- errors ----------------------------------------------------------------------------------------
def error_line(exc: BaseException) -> str:
    """One line for an expected failure; an ``OSError`` leads with the path(s) it concerns."""
    if isinstance(exc, OSError) and exc.strerror:
        paths = [str(f) for f in (exc.filename, exc.filename2) if f is not None]
        return f"{' -> '.join(paths)}: {exc.strerror}" if paths else str(exc.strerror)
    if isinstance(exc, UnicodeError):
        return f"text that is not valid Unicode (a lone surrogate, or bytes in another encoding?): {exc}"
    return str(exc).replace("\n", " ")


def check_text_args(args: argparse.Namespace) -> None:
    """Free text on the command line (a search query) must be valid Unicode. Bytes that are not
    UTF-8 reach Python as lone surrogates; paths may hold those, query text may not."""
    words = getattr(args, "query", None)
    for word in words if isinstance(words, list) else []:
        try:
            word.encode("utf-8")
        except UnicodeEncodeError:
            raise HybridRetError(f"the query {word!r} is not valid UTF-8 text (check the terminal's or "
                                 "script's encoding)") from None


def stderr(line: str) -> None:
    try:
        print(line, file=sys.stderr)
    except (OSError, ValueError):  # stderr itself is gone (closed pipe): nothing left to tell
        pass


def stdout_gone() -> int:
    """stdout's reader went away (``| head``): exit quietly, like other Unix tools. Later writes,
    including the interpreter's flush at exit, go to /dev/null (see the Python docs on SIGPIPE)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass
    return 141  # 128 + SIGPIPE, what a shell reports for a tool the broken pipe stopped
