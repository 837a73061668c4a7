"""The supervisor each verify run goes through: it keeps the run out of the user's tree and
ends every process the run started.

    python isolate.py [--tree TREE --copy COPY [--keep REL]...] -- PROGRAM [ARGS...]

With `--tree`, the supervisor enters a private user and mount namespace (the current uid and
gid mapped to themselves, so the program does not run as root), makes every mount private and
bind-mounts COPY over TREE: the program runs at the tree's own path, and whatever it writes
there, by a relative or an absolute path, lands in the copy. Each `--keep` (a version-control
folder, a virtual environment: what verify does not copy) is bound from the tree into the copy
first, so the program still finds them at their paths. Only stdlib: it runs before anything
else is imported, under whatever interpreter verify runs.

On Linux the supervisor is a child subreaper: a process the program leaves behind, even one in
a session of its own with an empty environment, is reparented to it. When the program ends,
or verify asks it to stop (SIGTERM), it kills every process below it and reaps them, then
exits as the program did. `--probe` says by its exit status whether this machine lets it set
up the namespace; AMP_MIGRATE_VERIFY_NO_NAMESPACE=1 makes it say no (and refuse `--tree`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import subprocess
import sys
import tempfile
import time
from typing import Optional, Sequence

#: Set to 1: behave as on a machine without user namespaces (the refusals' tests).
NO_NAMESPACE = "AMP_MIGRATE_VERIFY_NO_NAMESPACE"
#: The exit status of a run whose isolation could not be set up (the program never started).
NOT_ISOLATED = 125

_CLONE_NEWNS = 0x00020000
_CLONE_NEWUSER = 0x10000000
_MS_BIND = 0x1000
_MS_REC = 0x4000
_MS_PRIVATE = 0x40000
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


class IsolationError(OSError):
    """The namespace or a mount could not be set up."""


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        error = ctypes.get_errno()
        raise IsolationError(error, f"{what}: {os.strerror(error)}")


def _write(path: str, text: str) -> None:
    with open(path, "w") as file:
        file.write(text)


def enter_namespace() -> None:
    """A user namespace of our own (uid and gid mapped to themselves) and a mount namespace in
    it whose mounts propagate nowhere."""
    if os.environ.get(NO_NAMESPACE) == "1" or not sys.platform.startswith("linux"):
        raise IsolationError(0, "user namespaces are not available")
    libc = _libc()
    uid, gid = os.getuid(), os.getgid()
    _check(libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNS), "unshare")
    _write("/proc/self/uid_map", f"{uid} {uid} 1\n")
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/gid_map", f"{gid} {gid} 1\n")
    _check(libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None), "making the mounts private")


def bind(source: str, target: str) -> None:
    libc = _libc()
    _check(libc.mount(source.encode(), target.encode(), None, _MS_BIND | _MS_REC, None), f"binding {target}")


def map_tree(tree: str, copy: str, keep: Sequence[str]) -> None:
    """The copy at the tree's path; each kept entry of the tree at its place in the copy."""
    for relative in keep:
        source, target = os.path.join(tree, relative), os.path.join(copy, relative)
        if os.path.islink(source):
            if not os.path.lexists(target):
                os.symlink(os.readlink(source), target)
            continue
        if os.path.isdir(source):
            os.makedirs(target, exist_ok=True)
        elif not os.path.lexists(target):
            os.makedirs(os.path.dirname(target), exist_ok=True)
            open(target, "a").close()
        bind(source, target)
    bind(copy, tree)


def probe() -> bool:
    """Whether a namespace can be entered and a folder bound over another, tried in a child
    (the namespace and the mount end with it)."""
    first, second = tempfile.mkdtemp(), tempfile.mkdtemp()
    try:
        _write(os.path.join(second, "seen"), "")
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                enter_namespace()
                bind(second, first)
                code = 0 if os.path.exists(os.path.join(first, "seen")) else 1
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        return os.waitstatus_to_exitcode(status) == 0
    finally:
        os.remove(os.path.join(second, "seen"))
        os.rmdir(first)
        os.rmdir(second)


def _become_reaper() -> None:
    """Orphans below us come to us; and we end when verify ends, whatever ended it."""
    if not sys.platform.startswith("linux"):
        return
    libc = _libc()
    libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def descendants(pid: int) -> list[int]:
    """Every live process below `pid`, by the parent links in /proc (empty where there is none)."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as file:
                stat = file.read()
        except OSError:
            continue  # gone meanwhile
        fields = stat[stat.rfind(b")") + 2 :].split()
        children.setdefault(int(fields[1]), []).append(int(entry))
    found, frontier = [], [pid]
    while frontier:
        below = children.get(frontier.pop(), [])
        found += below
        frontier += below
    return found


def _reap() -> bool:
    """Reap every child that has ended; False once there is no child left at all."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return False
        if pid == 0:
            return True


def end_descendants() -> None:
    """SIGKILL every process below us until none is left, reaping each (a process forked while
    we looked is reparented to us when its parent dies, and found on the next look)."""
    me = os.getpid()
    while True:
        below = descendants(me)
        for pid in below:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        if not _reap() and not below:
            return
        time.sleep(0.01)


class _Stop(Exception):
    """verify asked the supervisor to stop (the timeout, Ctrl-C)."""


def _stop(signum: int, frame: object) -> None:
    raise _Stop()


def supervise(argv: Sequence[str]) -> int:
    """Start `argv`, wait for it, reaping whatever is reparented to us meanwhile, then end
    everything it left; its exit status (negative: the signal that ended it)."""
    signal.signal(signal.SIGTERM, _stop)
    status: Optional[int] = None
    try:
        child = subprocess.Popen(argv)
        while status is None:
            pid, wait_status = os.waitpid(-1, 0)
            if pid == child.pid:
                status = os.waitstatus_to_exitcode(wait_status)
                child.returncode = status  # reaped here, not by Popen
    except _Stop:
        status = -signal.SIGTERM
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        end_descendants()
    return status


def _parse(argv: list[str]) -> tuple[Optional[str], Optional[str], list[str], list[str]]:
    tree = copy = None
    keep: list[str] = []
    while argv and argv[0] != "--":
        option, value, argv = argv[0], argv[1], argv[2:]
        if option == "--tree":
            tree = value
        elif option == "--copy":
            copy = value
        elif option == "--keep":
            keep.append(value)
        else:
            raise SystemExit(f"isolate: unknown option {option}")
    return tree, copy, keep, argv[1:]


def main(argv: list[str]) -> int:
    if argv == ["--probe"]:
        return 0 if probe() else 1
    tree, copy, keep, program = _parse(argv)
    _become_reaper()
    if tree is not None and copy is not None:
        try:
            enter_namespace()
            map_tree(tree, copy, keep)
            os.chdir(tree)
        except OSError as error:
            print(f"verify: could not run the program isolated from the tree: {error}", file=sys.stderr)
            return NOT_ISOLATED
    status = supervise(program)
    if status < 0:
        signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)  # end as the program ended, so verify sees the signal
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
