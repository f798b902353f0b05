"""Command line: ``hybridret index | search | serve | add | delete | purge | compact | get | eval | tune | calibrate | info |
demo | train | mine-negatives`` (also ``python -m hybridret``).

One module per command group, each with the arguments of its commands (``add_parser`` /
``add_parsers``, which set ``run`` on the parsed arguments) and their run functions:
:mod:`~hybridret.cli.index`, :mod:`~hybridret.cli.search`, :mod:`~hybridret.cli.serve`,
:mod:`~hybridret.cli.write` (add, delete, purge, compact), :mod:`~hybridret.cli.get`,
:mod:`~hybridret.cli.evaluate` (eval, tune, calibrate),
:mod:`~hybridret.cli.info`, :mod:`~hybridret.cli.demo`, :mod:`~hybridret.cli.train` (train,
mine-negatives); the ``--ray`` paths are in :mod:`~hybridret.cli.sharded` and what they all share in
:mod:`~hybridret.cli._common`. Building the parser loads no model, torch, FAISS or tantivy.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from .._version import __version__
from ..errors import HybridRetError
from . import demo, evaluate, get, index, info, search, serve, train, write
from ._common import check_text_args, error_line, setup_logging, stderr, stdout_gone

__all__ = ["build_parser", "main"]


class IntermixedParser(argparse.ArgumentParser):
    """A command's parser that takes its options anywhere among its positionals
    (``hybridret delete DIR --ignore-missing ID ...``), as :meth:`parse_intermixed_args` does."""

    _inside = False

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:  # type: ignore[override]
        if self._inside:  # parse_known_intermixed_args calls back here for its two passes
            return super().parse_known_args(args, namespace)
        self._inside = True
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._inside = False


def build_parser() -> argparse.ArgumentParser:
    """The whole ``hybridret`` parser, subcommands in ``--help`` order (``main`` adds ``--debug``).
    ``--method`` choices are the search methods at the time of the call (registered retrievers included)."""
    parser = argparse.ArgumentParser(prog="hybridret", description="Hybrid dense + learned-sparse retrieval.")
    parser.add_argument("--version", action="version", version=f"hybridret {__version__}")
    verbosity = parser.add_mutually_exclusive_group()
    verbosity.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    verbosity.add_argument("-q", "--quiet", action="store_true", help="warnings and errors only (no progress bars)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=IntermixedParser)
    index.add_parser(sub)
    search.add_parser(sub)
    serve.add_parser(sub)
    write.add_parsers(sub)  # add, delete, purge, compact
    get.add_parser(sub)
    evaluate.add_parsers(sub)  # eval, tune, calibrate
    info.add_parser(sub)
    demo.add_parser(sub)
    train.add_parsers(sub)  # train, mine-negatives
    return parser


# Commands that encode only queries: their encoders prefer the numpy backend (the same vectors; see
# hybridret.encoders.backends.prefer_numpy_for_queries)
QUERY_SIDE = frozenset({"search", "eval", "tune", "calibrate"})


def query_side(command: str) -> AbstractContextManager[None]:
    """numpy's start-up, not torch's, for a command that encodes only queries."""
    if command not in QUERY_SIDE:
        return nullcontext()
    from ..encoders.backends import prefer_numpy_for_queries

    return prefer_numpy_for_queries()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (0 ok, 1 error, 2 usage, 130 interrupted, 141 output pipe
    closed). Expected failures (bad input, missing or unwritable files, a full disk, text that is
    not valid Unicode) print one ``hybridret: error: ...`` line; ``--debug`` shows the traceback."""
    # torch and FAISS each bring an OpenMP runtime; with spinning idle threads (the default) one
    # starves the other, and query encoding after a FAISS search ran ~15x slower on 2 cores.
    # This must be set before either library loads, which the CLI does lazily, below.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    parser = build_parser()
    parser.add_argument("--debug", action="store_true", help="show the full traceback of any error")
    args = parser.parse_args(argv)
    setup_logging(args)
    try:
        check_text_args(args)
        with query_side(args.command):
            code: int = args.run(args)
        sys.stdout.flush()  # here, so that a closed pipe is seen now and not at interpreter exit
        return code
    except BrokenPipeError:
        return stdout_gone()
    except (HybridRetError, OSError, UnicodeError) as exc:
        if args.debug:
            raise
        stderr(f"hybridret: error: {error_line(exc)}")
        return 1
    except MemoryError as exc:  # an environment fault, not a bug: say so in one line
        if args.debug:
            raise
        stderr(f"hybridret: error: out of memory ({error_line(exc) or 'an allocation failed'}); ask for less "
               "(-k, --batch-size, --chunk-size) or free memory")
        return 1
    except KeyboardInterrupt:
        stderr("hybridret: interrupted")
        return 130
    except Exception:
        if not args.debug:
            stderr("hybridret: internal error, please report it with the traceback below:")
        raise
