"""`python -m amp_shim [--force] script.py args...`: run a legacy Apex script unchanged."""
from __future__ import annotations

import os
import runpy
import sys

from .alias import install


def main(argv: list[str]) -> int:
    force = False
    if argv and argv[0] == "--force":
        force, argv = True, argv[1:]
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m amp_shim [--force] script.py [args...]", file=sys.stderr)
        return 0 if argv else 2
    if install(force=force):
        print("amp_shim: running with the Apex-compatible shim (import apex -> amp_shim)", file=sys.stderr)
    else:
        print("amp_shim: a real Apex is installed; using it (pass --force to use the shim)", file=sys.stderr)
    sys.argv = list(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
    runpy.run_path(argv[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
