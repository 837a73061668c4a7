"""Reading and writing checkpoint files for `convert-checkpoint`, with every failure turned
into one `CheckpointError` that says what is wrong with which file.

Reading: `torch.load(weights_only=True)` first. When it fails, the file's structure is
examined without running any of it (`pickletools` only parses opcodes) to tell a damaged or
foreign file from a complete pickle that the safe loader refused: only the latter is worth
`--unsafe-load`, and only such a file is ever unpickled unsafely.

Writing: the converted checkpoint is serialized in memory and handed to `atomic_write`, the
writer the CLI's in-place rewrites use too: a new file beside the target renamed over it, so
TARGET is either as it was or complete. A new TARGET gets mode 0o666 filtered by the umask, as
`open()` and `torch.save` create files; an existing one keeps its mode, as under `torch.save`.
"""

from __future__ import annotations

import errno
import io
import os
import pickle
import pickletools
import stat
import warnings
import zipfile
from pathlib import Path
from typing import IO, Any, Optional

import torch

from ..io.atomic_write import WriteFailed, replace_atomically

# A torch file in the legacy (pre-1.6) format is five pickles in a row: magic number,
# protocol version, system info, the object, its storage keys; then the raw storage bytes.
_LEGACY_PICKLES = 5
_PICKLE_PROTO = 0x80  # the first opcode of every pickle of protocol 2 and later
_ZIP_MAGIC = b"PK\x03\x04"


class CheckpointError(Exception):
    """The checkpoint cannot be converted as asked; the message says why and what to do."""


# -- reading ----------------------------------------------------------------------------------


class _ApexObject:
    """Stands in for a pickled Apex class (FP16_Optimizer's LossScaler): keeps its attributes."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        self.__dict__.update(state if isinstance(state, dict) else {"state": state})


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module == "apex" or module.startswith("apex."):
            return type(name, (_ApexObject,), {"__module__": module})
        return super().find_class(module, name)


class _PickleModule:
    """`pickle` with Apex classes readable without Apex installed (for `torch.load`)."""

    Unpickler = _Unpickler
    load = pickle.load
    __name__ = "amp_migrate.checkpoints.files._PickleModule"


def load(path: Path, *, unsafe: bool = False) -> Any:
    """The checkpoint's object, loaded safely, or unpickled in full when `unsafe` and the file
    is a complete pickle the safe loader refused."""
    _check_regular_file(path)
    safe_error: Optional[Exception] = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            loaded = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # torch's safe unpickler raises anything on a foreign file
            safe_error = exc
    if safe_error is None:
        for warning in caught:  # about the checkpoint itself: the user should still see them
            warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
        return loaded
    # Warnings about a file that is then refused (torch's, on the "pickle protocol" of random
    # bytes) would only bury the one line that says what is wrong.
    damage = _damage(path)
    if damage is not None:
        raise CheckpointError(f"{path}: not a readable torch checkpoint: {damage}")
    if not isinstance(safe_error, pickle.UnpicklingError):
        raise CheckpointError(f"{path}: not a readable torch checkpoint ({_brief(safe_error)})")
    if not unsafe:
        found = _unsafe_globals(path)
        objects = f" ({', '.join(found)})" if found else ""
        raise CheckpointError(
            f"{path} holds pickled Python objects besides tensors and containers{objects}; "
            "loading them runs code from the file. If you trust it, pass --unsafe-load."
        )
    try:
        return torch.load(path, map_location="cpu", weights_only=False, pickle_module=_PickleModule)
    except Exception as exc:  # a pickle can raise anything while it runs
        raise CheckpointError(f"{path}: cannot unpickle ({type(exc).__name__}: {_brief(exc)})") from None


def _check_regular_file(path: Path) -> None:
    """A FIFO or device would block or never end; a directory is not a checkpoint."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read ({exc.strerror})") from None
    if not stat.S_ISREG(mode):
        raise CheckpointError(f"{path}: not a regular file")


def _damage(path: Path) -> Optional[str]:
    """Why the file is not a complete torch checkpoint, judged from its structure alone
    (nothing in it runs); None when it is one as far as its pickles go."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
            if not head:
                return "the file is empty"
            if head == _ZIP_MAGIC:
                return _zip_damage(path)
            if head[0] != _PICKLE_PROTO:
                return "neither a zip archive (torch.save) nor a pickle"
            f.seek(0)
            for _ in range(_LEGACY_PICKLES):
                if not _complete_pickle(f):
                    return "its pickle is truncated or damaged"
    except OSError as exc:
        return f"cannot read it ({exc.strerror})"
    return None


def _zip_damage(path: Path) -> Optional[str]:
    try:
        with zipfile.ZipFile(path) as archive:
            names = [n for n in archive.namelist() if n.endswith("/data.pkl") or n == "data.pkl"]
            if not names:
                return "a zip archive without a data.pkl, so not written by torch.save"
            with archive.open(names[0]) as data:
                if not _complete_pickle(data):
                    return "its data.pkl is truncated or damaged"
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, ValueError) as exc:
        return f"truncated or damaged zip archive ({_brief(exc)})"
    return None


def _complete_pickle(stream: IO[bytes]) -> bool:
    """Whether the stream holds one well-formed pickle (up to its STOP) at its position."""
    try:
        for _ in pickletools.genops(stream):
            pass
    except Exception:  # genops reports malformed input as ValueError, truncation as anything
        return False
    return True


def _unsafe_globals(path: Path) -> list[str]:
    """The Python objects the file would import; only zip checkpoints can be asked."""
    try:
        return sorted(torch.serialization.get_unsafe_globals_in_checkpoint(path))
    except Exception:  # legacy format, or a torch without the function: just name none
        return []


def _brief(exc: BaseException) -> str:
    """The first sentence of an error, on one line (torch's run to paragraphs)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    sentence, dot, _ = text.partition(". ")
    return sentence if dot else text


# -- writing ----------------------------------------------------------------------------------


def check_target(path: Path) -> None:
    """Refuse a TARGET that cannot be written, before the (possibly long) load."""
    folder = path.parent
    if not folder.is_dir():
        raise CheckpointError(f"{path}: the folder {folder} does not exist")
    if path.is_dir():
        raise CheckpointError(f"{path}: is a folder")
    if os.path.lexists(path) and not os.access(path, os.W_OK):
        raise CheckpointError(f"{path}: is read-only; not replaced")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise CheckpointError(f"{path}: cannot write to its folder {folder} (permission denied)")


def save_atomically(obj: Any, path: Path) -> None:
    """Serialize in memory, then write through the one atomic writer, so OUT is either
    absent/old or complete."""
    buffer = io.BytesIO()
    try:
        torch.save(obj, buffer)
    except Exception as exc:  # an object loaded with --unsafe-load may not pickle again
        raise CheckpointError(
            f"cannot serialize the converted checkpoint "
            f"({type(exc).__name__}: {_brief(exc)}); {path} not written"
        ) from None
    try:
        replace_atomically(path, buffer.getbuffer(), may_create=True)
    except WriteFailed as exc:
        raise CheckpointError(f"{path}: cannot write ({_reason(exc.error)}); nothing written") from None


def _reason(exc: OSError) -> str:
    if exc.errno == errno.ENOSPC:
        return "no space left on device"
    return exc.strerror or _brief(exc)
