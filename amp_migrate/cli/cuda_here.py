"""Whether code written for device "cuda" would get CUDA on this machine, told without
importing torch where possible.

Importing torch costs a second or two, more than a whole `amp-migrate --check` of a small
tree, so the build and the devices are read from files: torch's own `version.py` says whether
the installed build has CUDA (or ROCm's HIP, which torch also calls "cuda"), and on Linux the
driver lists its GPUs under /proc and /dev. Only a CUDA build on another system is asked
through torch itself.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import re
import sys
from pathlib import Path
from typing import Optional

_BUILD = re.compile(r"^(cuda|hip)\s*(?::[^=\n]*)?=\s*(.+?)\s*$", re.M)


def cuda_available() -> Optional[bool]:
    """What `torch.cuda.is_available()` would say; None where torch is not installed (the
    migrated code cannot run here at all)."""
    if _devices_hidden(os.environ.get("CUDA_VISIBLE_DEVICES")):
        return False
    build = _torch_build()
    if build is None:
        return None
    cuda, hip = build
    if not cuda and not hip:
        return False
    if sys.platform.startswith("linux"):
        if cuda:
            return bool(glob.glob("/proc/driver/nvidia/gpus/*") or glob.glob("/dev/nvidia[0-9]*"))
        return os.path.exists("/dev/kfd")
    import torch

    return bool(torch.cuda.is_available())


def _devices_hidden(visible: Optional[str]) -> bool:
    """CUDA_VISIBLE_DEVICES read as torch reads it: the list ends at the first entry that is
    neither a number nor a GPU or MIG id, so "" and "-1" hide every device."""
    if visible is None:
        return False
    first = visible.split(",")[0].strip()
    return not (first[:1].isdigit() or first.startswith(("GPU-", "MIG-")))


def _torch_build() -> Optional[tuple[bool, bool]]:
    """(has CUDA, has HIP) of the installed torch, from its version.py; None without torch."""
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "version"):
        return bool(torch.version.cuda), bool(getattr(torch.version, "hip", None))
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    try:
        text = (Path(list(spec.submodule_search_locations)[0]) / "version.py").read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    found = {name: value for name, value in _BUILD.findall(text)}
    return found.get("cuda", "None") != "None", found.get("hip", "None") != "None"
