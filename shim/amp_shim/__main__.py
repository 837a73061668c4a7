"""`python -m amp_shim [--force] script.py args...`: run a legacy Apex script unchanged.

See `amp_shim.launch` for the forms (script, `-m module`, any command) and how child
processes get the alias.
"""

import sys

from amp_shim.launch import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
