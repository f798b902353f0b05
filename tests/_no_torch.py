"""Run hybridret as if torch and transformers were not installed: ``python tests/_no_torch.py ARGS...``
runs the CLI (``hybridret ARGS...``); ``python tests/_no_torch.py --code CODE`` runs Python code.

``sys.modules[name] = None`` makes every later ``import name`` raise ImportError (a
ModuleNotFoundError, as for a missing package) and ``importlib.util.find_spec(name)`` return ``None``.
At the end a line ``NO_TORCH {"loaded": [...]}`` names the blocked modules that were imported anyway
(always none: they cannot be)."""

from __future__ import annotations

import json
import sys

BLOCKED = ("torch", "transformers")
for name in BLOCKED:
    sys.modules[name] = None  # type: ignore[assignment]


def main(argv: list[str]) -> int:
    if argv[:1] == ["--code"]:
        exec(compile(argv[1], "<no-torch>", "exec"), {"__name__": "__no_torch__"})
        code = 0
    else:
        from hybridret.cli import main as cli

        code = cli(argv)
    sys.stdout.flush()
    print("\nNO_TORCH " + json.dumps({"loaded": sorted(m for m in BLOCKED if sys.modules.get(m) is not None)}))
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
