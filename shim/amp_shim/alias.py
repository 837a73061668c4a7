"""The `apex` import alias: legacy `import apex` / `from apex import amp` resolve to amp_shim.

Installed only on request (`python -m amp_shim script.py`), and only when no real Apex with
`apex.amp` is importable, unless forced: a machine that still has Apex keeps using it.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType

ALIASED = "apex"
TARGET = "amp_shim"


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, target: ModuleType) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return self.target

    def exec_module(self, module: ModuleType) -> None:
        pass


class ApexAliasFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname != ALIASED and not fullname.startswith(ALIASED + "."):
            return None
        real_name = TARGET + fullname[len(ALIASED):]
        try:
            module = importlib.import_module(real_name)
        except ModuleNotFoundError as exc:
            if exc.name == real_name:
                return None
            raise
        return importlib.machinery.ModuleSpec(
            fullname, _AliasLoader(module), is_package=hasattr(module, "__path__")
        )


def real_apex_available() -> bool:
    if any(isinstance(f, ApexAliasFinder) for f in sys.meta_path):
        return False
    try:
        return importlib.util.find_spec("apex.amp") is not None
    except (ImportError, ValueError):
        return False


def install(force: bool = False) -> bool:
    """Put the alias first on sys.meta_path; returns whether it is active."""
    if any(isinstance(f, ApexAliasFinder) for f in sys.meta_path):
        return True
    if not force and real_apex_available():
        return False
    for name in [n for n in sys.modules if n == ALIASED or n.startswith(ALIASED + ".")]:
        del sys.modules[name]
    sys.meta_path.insert(0, ApexAliasFinder())
    return True
