"""``hybridret info DIR``: describe an index (``--check``: verify every file)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from typing import Any

__all__ = ["add_parser", "component_line", "run"]

_WIDTH = 12  # the label column: "documents:  "
_MAX_VALUE = 60  # characters of one meta value shown (a long list is cut)


def add_parser(sub: Any) -> None:
    p = sub.add_parser("info", help="describe an index (--check: verify every file)")
    p.add_argument("index", metavar="DIR")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--check", action="store_true",
                   help="verify every file against the checksums written with it, and the values inside "
                        "(reads the whole index; exit 1 when anything is wrong)")
    p.set_defaults(run=run)


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
    if args.json:
        print(json.dumps(info, indent=2, sort_keys=True))
        return 1 if args.check and info["check"]["problems"] else 0
    print(f"index:      {args.index}")
    print(f"documents:  {info.get('num_docs')} (skipped empty: {info.get('skipped_empty', 0)})")
    print(f"encoder:    {json.dumps(info.get('encoder'))}")
    for name, meta in (info.get("components") or {}).items():
        print(component_line(name, meta))
    segs = info.get("segments", [])
    print(f"segments:   {len(segs)} ({info.get('num_deleted', 0)} deleted documents not yet compacted)")
    print(f"on disk:    {info.get('bytes_on_disk', 0) / 1e6:.1f} MB")
    print(f"format:     {info.get('format_version')} (saved {info.get('saved_at')}, hybridret "
          f"{info.get('libraries', {}).get('hybridret')})")
    return 0
