"""The engine's CUDA C sources (`*.cu`, `*.cuh`), shipped as package data of `amp_shim`.

They are compiled at run time (CuPy `RawModule` / NVRTC) rather than at install time, so the
wheel stays pure Python and installs where no CUDA toolchain exists. In the source tree they
live in the top-level `kernels/` folder, which `pyproject.toml` maps to the import package
`amp_shim.kernels`; locating them through `importlib.resources` finds them the same way in an
editable install, in an installed wheel and in a zip import.
"""

from __future__ import annotations

import re
from importlib.resources import files

try:
    from importlib.resources.abc import Traversable
except ImportError:  # Python < 3.11
    from importlib.abc import Traversable

__all__ = ["KERNEL_SOURCES", "assemble_source", "read_source", "source_dir"]

# The translation units (each one CuPy RawModule / one NVRTC program) and the kernels each
# defines (all `extern "C"`, so their names are not mangled).
KERNEL_SOURCES = {
    "unscale.cu": ("amp_mt_unscale", "amp_mt_unscale_add"),
    "master.cu": ("amp_mt_unscale_to_fp32", "amp_mt_copy"),
    "norm.cu": ("amp_mt_unscale_norm", "amp_mt_scaled_norm", "amp_norm_finalize", "amp_mt_clip_scale"),
    "scale_update.cu": ("amp_update_scale",),
}

_LOCAL_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]+"([^"]+)"[ \t]*$')
_PRAGMA_ONCE = re.compile(r"^[ \t]*#[ \t]*pragma[ \t]+once\b")


def source_dir() -> Traversable:
    """The folder holding the CUDA sources (a `Traversable`; not necessarily a real path)."""
    return files(__name__)


def read_source(name: str) -> str:
    """The text of one source, e.g. ``read_source("unscale.cu")``.

    Raises FileNotFoundError, naming the sources that do exist, if there is no such file.
    """
    source = source_dir().joinpath(name)
    if not source.is_file():
        available = sorted(
            entry.name for entry in source_dir().iterdir() if entry.name.endswith((".cu", ".cuh"))
        )
        raise FileNotFoundError(
            "no CUDA source %r in amp_shim.kernels (available: %s)" % (name, ", ".join(available) or "none")
        )
    return source.read_text(encoding="utf-8")


def assemble_source(name: str) -> str:
    """One self-contained translation unit: `name` with its local ``#include "..."`` headers
    (from this folder) inlined, each once (they all use ``#pragma once``), with ``#line``
    directives so that compiler messages name the original file and line.

    System headers (``#include <cuda_fp16.h>``) are left for the compiler's include path. The
    result needs no file system, so it compiles the same from an installed wheel or a zip.
    """
    seen: set[str] = set()

    def expand(current: str) -> list[str]:
        seen.add(current)
        out = ['#line 1 "%s"' % current]
        for number, line in enumerate(read_source(current).splitlines(), start=1):
            if _PRAGMA_ONCE.match(line):
                out.append("")
                continue
            match = _LOCAL_INCLUDE.match(line)
            if match is None:
                out.append(line)
                continue
            header = match.group(1)
            if header not in seen:
                out.extend(expand(header))
            out.append('#line %d "%s"' % (number + 1, current))
        return out

    return "\n".join(expand(name)) + "\n"
