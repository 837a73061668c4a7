"""The engine's CUDA C sources (`*.cu`, `*.cuh`), shipped as package data of `amp_shim`.

They are compiled at run time (CuPy `RawModule` / NVRTC) rather than at install time, so the
wheel stays pure Python and installs where no CUDA toolchain exists. In the source tree they
live in the top-level `kernels/` folder, which `pyproject.toml` maps to the import package
`amp_shim.kernels`; locating them through `importlib.resources` finds them the same way in an
editable install, in an installed wheel and in a zip import.
"""
from __future__ import annotations

from importlib.resources import files

try:
    from importlib.resources.abc import Traversable
except ImportError:  # Python < 3.11
    from importlib.abc import Traversable

__all__ = ["read_source", "source_dir"]


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
