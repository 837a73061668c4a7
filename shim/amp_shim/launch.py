"""Run legacy Apex code unchanged: `python -m amp_shim` and the launcher behind `amp-migrate run`.

    python -m amp_shim [--force] script.py [args...]     run a script as `python script.py` would
    python -m amp_shim [--force] -m module [args...]     run a module as `python -m module` would
    python -m amp_shim [--force] [--] command [args...]  run any command (torchrun, python, a shell
                                                         script) with the alias in its environment

The first two install the `apex` alias in this process and then run the code in it, so
`sys.argv`, `__name__ == "__main__"`, `sys.path[0]`, tracebacks and exit codes are those of a
direct run. All three set `AMP_SHIM_ALIAS` so that every Python process started below gets the
alias too, through the `amp_shim_alias.pth` start-up hook installed with the package. The shim
announces itself once per process tree, with one line on stderr.

`run_command(argv, force)` is the programmatic form of the third: `amp-migrate run -- ...` calls
it and exits with its return value.
"""

from __future__ import annotations

import os
import runpy
import shutil
import signal
import site
import subprocess
import sys
from types import TracebackType
from typing import Optional, Sequence

from . import alias
from ._pth_build import PTH_NAME

USAGE = """\
usage: python -m amp_shim [--force] script.py [args...]
       python -m amp_shim [--force] -m module [args...]
       python -m amp_shim [--force] [--] command [args...]

Run legacy code that imports `apex` (apex.amp, apex.fp16_utils, apex.optimizers, apex.parallel,
apex.normalization) on amp_shim, unchanged. Child processes (torchrun workers, multiprocessing
spawn, subprocesses) get the same alias through the AMP_SHIM_ALIAS environment variable.

  --force   use the shim even where a real Apex with apex.amp is installed
"""

REAL_APEX_NOTICE = "amp_shim: a real Apex is installed; using it (pass --force to use the shim)"


# -- the alias in this process and its children ----------------------------------------------
def hook_installed() -> bool:
    """Whether this interpreter's site directories hold the start-up hook (children need it)."""
    dirs = list(getattr(site, "getsitepackages", lambda: [])())
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    return any(os.path.isfile(os.path.join(d, PTH_NAME)) for d in dirs)


def _warn_without_hook() -> None:
    if not hook_installed():
        print(
            "amp_shim: warning: the start-up hook %s is not in this interpreter's site-packages, "
            "so Python processes started from here will not see the apex alias; reinstall "
            "amp-migrate (pip install amp-migrate, or pip install -e . in a checkout)" % PTH_NAME,
            file=sys.stderr,
        )


def activate(force: bool = False) -> bool:
    """Install the alias here and export it to child processes; announce it once per tree.

    Returns whether the shim is in use (False: a real Apex is installed and `force` is off, in
    which case nothing is exported and the real Apex serves this process and its children).
    """
    force = force or alias.env_setting() == "force"
    if not alias.install(force=force):
        print(REAL_APEX_NOTICE, file=sys.stderr, flush=True)
        return False
    os.environ[alias.ENV_VAR] = "force" if force else "1"
    alias.announce()
    return True


def run_command(argv: Sequence[str], force: bool = False) -> int:
    """Run `argv` (python, torchrun, any executable) with the alias exported; its exit status.

    The command inherits this environment plus `AMP_SHIM_ALIAS`; every Python process in its
    tree then imports `apex` as amp_shim (unless a real Apex is installed and `force` is off:
    then the command runs with the environment unchanged). Signals: Ctrl-C reaches the command
    through the terminal's process group and this launcher waits for it; SIGTERM is forwarded.
    A command killed by signal N gives 128 + N, as a shell reports it; a missing command 127.
    """
    argv = list(argv)
    if not argv:
        raise ValueError("run_command needs a command to run")
    force = force or alias.env_setting() == "force"
    if alias.is_installed() or force or not alias.real_apex_available():
        alias.announce()
        env = alias.child_environment(force)
        _warn_without_hook()
    else:
        print(REAL_APEX_NOTICE, file=sys.stderr, flush=True)
        env = dict(os.environ)
    try:
        proc = subprocess.Popen(argv, env=env)
    except FileNotFoundError:
        print("amp_shim: command not found: %s" % argv[0], file=sys.stderr)
        return 127
    except PermissionError:
        print("amp_shim: permission denied: %s" % argv[0], file=sys.stderr)
        return 126
    return _wait(proc)


def _wait(proc: subprocess.Popen) -> int:
    previous = None
    forward = lambda signum, frame: proc.send_signal(signum)  # noqa: E731 - a signal handler that only forwards
    try:
        previous = signal.signal(signal.SIGTERM, forward)
    except ValueError:  # not the main thread: no forwarding
        previous = None
    try:
        while True:
            try:
                code = proc.wait()
                break
            except KeyboardInterrupt:
                continue  # the command got the same SIGINT; its own exit decides
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return 128 - code if code < 0 else code


# -- running a script or module in this process ------------------------------------------------
def _launcher_frame(tb: TracebackType) -> bool:
    name = tb.tb_frame.f_globals.get("__name__")
    return name in (__name__, "runpy")


def _strip_launcher_frames(tb: Optional[TracebackType]) -> Optional[TracebackType]:
    while tb is not None and _launcher_frame(tb):
        tb = tb.tb_next
    return tb


def _report_uncaught(exc: BaseException) -> int:
    """What the interpreter does with an exception that leaves the main module."""
    tb = _strip_launcher_frames(exc.__traceback__)
    if tb is None and isinstance(exc, ImportError) and not isinstance(exc, SyntaxError):
        # runpy could not find the module: `python -m nope` prints one line, not a traceback.
        print("%s: %s" % (sys.executable, exc), file=sys.stderr)
        return 1
    exc.__traceback__ = tb
    sys.last_type, sys.last_value, sys.last_traceback = type(exc), exc, tb
    sys.excepthook(type(exc), exc, tb)
    if isinstance(exc, KeyboardInterrupt):
        # Python ends with SIGINT after an uncaught KeyboardInterrupt, so callers see a signal.
        sys.stderr.flush()
        try:
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        except (OSError, ValueError, AttributeError):
            pass
        return 130
    return 1


def _replace_cwd_entry(path0: Optional[str]) -> None:
    """`python -m amp_shim` put the cwd first on sys.path; `python script.py` puts the script's
    directory there instead (and `-m module` keeps the cwd)."""
    if sys.path and sys.path[0] in ("", os.getcwd()) and not getattr(sys.flags, "safe_path", False):
        if path0 is None:
            del sys.path[0]
        else:
            sys.path[0] = path0


def run_script(path: str, args: Sequence[str]) -> int:
    if not os.path.exists(path):
        print(
            "%s: can't open file %r: [Errno 2] No such file or directory"
            % (sys.executable, os.path.abspath(path)),
            file=sys.stderr,
        )
        return 2
    if _is_importer_path(path):
        _replace_cwd_entry(None)  # a directory or zip with __main__.py: runpy puts it first
    else:
        _replace_cwd_entry(os.path.dirname(os.path.realpath(path)))
    sys.argv = [path, *args]
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit:
        raise
    except BaseException as exc:  # noqa: BLE001 - reported as the interpreter would
        return _report_uncaught(exc)
    return 0


def _is_importer_path(path: str) -> bool:
    import zipfile

    return os.path.isdir(path) or zipfile.is_zipfile(path)


def run_module(module: str, args: Sequence[str]) -> int:
    sys.argv = [module, *args]  # runpy replaces argv[0] with the module's file, as `-m` does
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit:
        raise
    except BaseException as exc:  # noqa: BLE001 - any failure, KeyboardInterrupt too, ends the launcher
        return _report_uncaught(exc)
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    force = False
    while argv and argv[0] in ("--force", "-h", "--help"):
        if argv[0] == "--force":
            force, argv = True, argv[1:]
        else:
            print(USAGE, end="")
            return 0
    if not argv:
        print(USAGE, end="", file=sys.stderr)
        return 2
    if argv[0] == "--":
        if len(argv) == 1:
            print(USAGE, end="", file=sys.stderr)
            return 2
        return run_command(argv[1:], force=force)
    if argv[0] == "-m":
        if len(argv) == 1:
            print("Argument expected for the -m option", file=sys.stderr)
            return 2
        if activate(force):
            _warn_without_hook()
        return run_module(argv[1], argv[2:])
    target = argv[0]
    if (
        not os.path.exists(target)
        and not target.endswith((".py", ".pyw"))
        and shutil.which(target) is not None
    ):
        return run_command(argv, force=force)  # `python -m amp_shim torchrun ...`
    if activate(force):
        # Only says something when the hook is missing: scripts that start Python children
        # (DataLoader spawn workers, subprocess) would then fail with "No module named apex".
        _warn_without_hook()
    return run_script(target, argv[1:])
