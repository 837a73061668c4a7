"""The `apex` import alias: legacy `import apex` / `from apex import amp` resolve to amp_shim.

Installed only on request, and only when no real Apex with `apex.amp` is importable, unless
forced: a machine that still has Apex keeps using it. Two ways to request it:

* `python -m amp_shim [--force] train.py ...` (see `amp_shim.launch`) installs it in its own
  process and sets `AMP_SHIM_ALIAS` for every process the script starts;
* `AMP_SHIM_ALIAS=1` (or `=force`) in the environment: the start-up hook `amp_shim_alias.pth`,
  installed into site-packages with the package, calls `activate_from_environment()` in every
  Python process that starts with the variable set (torchrun workers, multiprocessing spawn,
  `subprocess.run([sys.executable, ...])`). Without the variable the hook does nothing.

`apex.X` is the very module object `amp_shim.X` (not a copy), so state such as
`apex.amp._amp_state` is shared and `isinstance` checks agree under both names.

Apex's compiled extensions are top-level modules, `amp_C` (multi-tensor kernels) and `apex_C`
(flatten/unflatten), that code imports directly once `multi_tensor_applier.available` says the
fused path exists. While the alias is active they resolve to `amp_shim.amp_C` and
`amp_shim.apex_C`, unless a compiled module of that name is importable: as for `apex` itself,
a real build is not shadowed, except when the alias is forced.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import os
import sys
from types import ModuleType

ALIASED = "apex"
TARGET = "amp_shim"
#: Apex's compiled top-level extensions -> the shim's modules of the same job.
EXTENSIONS = {"amp_C": TARGET + ".amp_C", "apex_C": TARGET + ".apex_C"}

#: "1" (or any value but "", "0", "false", "no", "off"): alias unless a real Apex is importable;
#: "force": alias even then.
ENV_VAR = "AMP_SHIM_ALIAS"
#: Set once the process tree has printed its "shim in use" line, so children stay quiet.
ANNOUNCED_VAR = "AMP_SHIM_ALIAS_ANNOUNCED"
_OFF_VALUES = ("", "0", "false", "no", "off")

ANNOUNCEMENT = "amp_shim: running with the Apex-compatible shim (import apex -> amp_shim)"


class _AliasLoader(importlib.abc.Loader):
    """Hands out the already-imported amp_shim module under its `apex` name."""

    def __init__(self, target: ModuleType) -> None:
        self.target = target
        self._target_spec = getattr(target, "__spec__", None)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return self.target

    def exec_module(self, module: ModuleType) -> None:
        # importlib stamped the alias spec onto the shared module; give amp_shim its own back
        # (reload, pickle by reference and `python -m` need the real one).
        if self._target_spec is not None:
            module.__spec__ = self._target_spec
        _mirror_loaded_submodules()


def _mirror_loaded_submodules() -> None:
    """Register `apex.<x>` for every loaded `amp_shim.<x>`.

    Without this, a first `import apex.amp._amp_state` would make importlib set the attribute
    `_amp_state` of `apex.amp` (= `amp_shim.amp`) to the submodule, clobbering the `_amp_state`
    object that `amp_shim.amp` exports under the same name, as real Apex does.
    """
    prefix = TARGET + "."
    for name, module in list(sys.modules.items()):
        if name.startswith(prefix) and module is not None:
            sys.modules.setdefault(ALIASED + name[len(TARGET) :], module)


class ApexAliasFinder(importlib.abc.MetaPathFinder):
    def __init__(self, force: bool = False) -> None:
        self.force = force

    def find_spec(self, fullname, path=None, target=None):
        if fullname in EXTENSIONS:
            if not self.force and _find_spec_without_alias(fullname) is not None:
                return None  # a compiled amp_C / apex_C: let it load
            module = importlib.import_module(EXTENSIONS[fullname])
            return importlib.machinery.ModuleSpec(fullname, _AliasLoader(module))
        if fullname != ALIASED and not fullname.startswith(ALIASED + "."):
            return None
        real_name = TARGET + fullname[len(ALIASED) :]
        try:
            module = importlib.import_module(real_name)
        except ModuleNotFoundError as exc:
            if exc.name == real_name:
                return None  # `apex.contrib`, `apex.transformer`, ...: a plain ImportError
            raise
        return importlib.machinery.ModuleSpec(
            fullname, _AliasLoader(module), is_package=hasattr(module, "__path__")
        )


def is_installed() -> bool:
    return any(isinstance(f, ApexAliasFinder) for f in sys.meta_path)


def _find_spec_without_alias(name: str, path=None):
    for finder in sys.meta_path:
        if isinstance(finder, ApexAliasFinder) or not hasattr(finder, "find_spec"):
            continue
        try:
            spec = finder.find_spec(name, path)
        except (ImportError, ValueError):
            continue
        if spec is not None:
            return spec
    return None


def real_apex_available() -> bool:
    """Whether a real Apex with `apex.amp` is importable, decided without running its code.

    Only finders are asked (as `importlib.util.find_spec` would, minus importing the parent
    package): this runs at interpreter start-up in every child process, where importing Apex
    (and torch with it) would be both slow and a side effect.
    """
    loaded = sys.modules.get(ALIASED)
    if loaded is not None and getattr(loaded, "__name__", None) != TARGET:
        locations = getattr(loaded, "__path__", None)
    else:
        spec = _find_spec_without_alias(ALIASED)
        locations = spec.submodule_search_locations if spec is not None else None
    if locations is None:
        return False
    return _find_spec_without_alias(ALIASED + ".amp", list(locations)) is not None


def install(force: bool = False) -> bool:
    """Put the alias first on sys.meta_path; returns whether it is active."""
    if is_installed():
        return True
    if not force and real_apex_available():
        return False
    for name in [n for n in sys.modules if n == ALIASED or n.startswith(ALIASED + ".")]:
        del sys.modules[name]
    sys.meta_path.insert(0, ApexAliasFinder(force=force))
    return True


def uninstall() -> None:
    """Remove the alias and every `apex.*` module it handed out (tests, embedding)."""
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, ApexAliasFinder)]
    for name, module in list(sys.modules.items()):
        if (name == ALIASED or name.startswith(ALIASED + ".") or name in EXTENSIONS) and getattr(
            module, "__name__", ""
        ).startswith(TARGET):
            del sys.modules[name]


def env_setting(environ=None) -> str | None:
    """None (off), "auto" (alias unless a real Apex exists) or "force", from `AMP_SHIM_ALIAS`."""
    value = (os.environ if environ is None else environ).get(ENV_VAR, "").strip().lower()
    if value in _OFF_VALUES:
        return None
    return "force" if value == "force" else "auto"


def child_environment(force: bool, environ=None) -> dict[str, str]:
    """The environment that carries the alias into child processes (already announced)."""
    env = dict(os.environ if environ is None else environ)
    env[ENV_VAR] = "force" if force else "1"
    env[ANNOUNCED_VAR] = "1"
    return env


def announce() -> None:
    """Print the one "shim in use" line of this process tree (stderr), unless already done."""
    if os.environ.get(ANNOUNCED_VAR):
        return
    os.environ[ANNOUNCED_VAR] = "1"
    print(ANNOUNCEMENT, file=sys.stderr, flush=True)


def activate_from_environment() -> bool:
    """The start-up hook's entry point (`amp_shim_alias.pth`); never raises.

    With `AMP_SHIM_ALIAS` set, installs the alias (subject to the real-Apex rule) and, in the
    first process of a tree that did not come from the launcher, prints the announcement.
    """
    setting = env_setting()
    if setting is None:
        return False
    try:
        active = install(force=setting == "force")
        if active:
            announce()
        return active
    except Exception as exc:  # a start-up hook must not break the interpreter
        print("amp_shim: the apex alias could not be installed: %r" % (exc,), file=sys.stderr)
        return False
