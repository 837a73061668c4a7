"""Notebooks as equivalence programs: the code cells, in order, as one script.

IPython is not installed here, so the few IPython lines these notebooks use are run the way
IPython runs them: `%time STMT` runs STMT once in the user namespace, `%timeit -n N -r R STMT`
runs it N*R times, `!cmd` and `%matplotlib` do nothing a training run can see. Any other
IPython line is refused, so that a notebook program cannot silently mean something else here.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

_TIME = re.compile(r"^([ \t]*)%time[ \t]+(\S.*)$")
_TIMEIT = re.compile(r"^([ \t]*)%timeit[ \t]+-n[ \t]*(\d+)[ \t]+-r[ \t]*(\d+)[ \t]+(\S.*)$")
_INERT = re.compile(r"^([ \t]*)(?:!|%matplotlib\b|%pip\b)")


def cell_sources(data: bytes) -> list[str]:
    """The code cells' sources of a notebook file's bytes."""
    cells = json.loads(data.decode("utf-8"))["cells"]
    return [
        "".join(c["source"]) if isinstance(c["source"], list) else c["source"]
        for c in cells
        if c.get("cell_type") == "code"
    ]


def script(sources: list[str]) -> str:
    lines: list[str] = []
    for source in sources:
        for line in source.split("\n"):
            if m := _TIME.match(line):
                lines.append(m.group(1) + m.group(2))
            elif m := _TIMEIT.match(line):
                lines.append(
                    f"{m.group(1)}for _timeit_run in range({int(m.group(2)) * int(m.group(3))}): {m.group(4)}"
                )
            elif m := _INERT.match(line):
                lines.append(m.group(1) + "pass")
            elif re.match(r"^[ \t]*(?:[%!]|.*\?[ \t]*$)", line):
                raise ValueError(f"no stand-in for the IPython line {line!r}")
            else:
                lines.append(line)
        lines.append("")
    return "\n".join(lines)


def migrated(path: Path, target: str, device: str = "cpu", dtype: str = "float16"):
    """(the migrated notebook's cells as a script, the target used, its findings)."""
    from amp_migrate.io import notebook
    from amp_migrate.options import Options

    result = notebook.migrate(str(path), path.read_bytes(), Options(target, device, dtype), False)
    data = result.new_bytes if result.new_bytes is not None else path.read_bytes()
    return script(cell_sources(data)), result.target_used, result.findings
