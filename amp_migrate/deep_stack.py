"""Running one file's pass again on a deeper stack when its nesting outruns the recursion limit.

CPython compiles an expression nested about three times as deep as the recursion limit (a
3,000-term sum at the default limit of 1,000), but libcst's parser, visitors and code
generator recurse in Python about twice per level, and fail from about 500 levels on. Such a
file is run again in a thread of its own whose stack is large enough for `RECURSION_LIMIT`
frames, so that every file CPython compiles is read: libcst's frames were measured at under
700 bytes each, frames that recurse through C calls (`sorted`'s key, `repr`) at up to 1.6 KiB,
and `STACK_BYTES` allows 13 KiB, so that the limit is reached before the stack's end. Only a file that fails there too is `TooDeep`. The
first, ordinary try keeps the usual limit for every other file, and the limit is raised only
while the deep thread runs (one at a time), then put back.
"""

from __future__ import annotations

import re
import sys
import threading
from contextlib import contextmanager
from typing import Callable, Iterator, TypeVar

T = TypeVar("T")

#: The recursion limit in the deep thread: above the 5,900 frames libcst needs for the
#: deepest expression CPython compiles under its default limit.
RECURSION_LIMIT = 20_000
#: The deep thread's stack: 13 KiB per frame of `RECURSION_LIMIT` (reserved, touched as used).
STACK_BYTES = 256 * 1024 * 1024

#: What a file too deep to read is told, as its one error.
TOO_DEEP = "expressions nested too deeply to read (Python's recursion limit)"

#: CPython's messages for a file it refuses for one of its limits rather than its grammar
#: (an f-string's are grammar: Python 3.12 lifted them).
_LIMIT_MESSAGE = re.compile(r"^(?!f-string).*(?:too many|too complex|too deeply)")

_ONE_AT_A_TIME = threading.Lock()
_here = threading.local()


class TooDeep(Exception):
    """The pass exceeded the recursion limit on the deep stack too."""

    def __init__(self) -> None:
        super().__init__(TOO_DEEP)


def beyond_python(error: BaseException) -> bool:
    """Whether Python's parser refused a text for its nesting, not its grammar: too many
    nested parentheses or indentation levels, expressions past the recursion limit or its
    parser's stack. No Python runs such a file (unlike syntax newer than this interpreter)."""
    if isinstance(error, RecursionError):
        return True
    if isinstance(error, SyntaxError):
        return bool(_LIMIT_MESSAGE.search(error.msg or ""))
    return isinstance(error, MemoryError) and bool(_LIMIT_MESSAGE.search(str(error)))


def call(function: Callable[..., T], *args, **kwargs) -> T:
    """`function(*args, **kwargs)`; where it exceeds the recursion limit, its result on the
    deep stack, or TooDeep. `function` must be free of side effects it would repeat."""
    try:
        return function(*args, **kwargs)
    except RecursionError:
        if getattr(_here, "deep", False) or sys.getrecursionlimit() >= RECURSION_LIMIT:
            raise TooDeep() from None
    return _on_deep_stack(function, args, kwargs)


def _on_deep_stack(function: Callable[..., T], args: tuple, kwargs: dict) -> T:
    value: list[T] = []
    error: list[BaseException] = []

    def run() -> None:
        _here.deep = True
        previous = _here.limit = sys.getrecursionlimit()
        sys.setrecursionlimit(RECURSION_LIMIT)
        try:
            value.append(function(*args, **kwargs))
        except RecursionError:
            error.append(TooDeep())
        except BaseException as exc:  # handed to the caller's thread as it is
            error.append(exc)
        finally:
            sys.setrecursionlimit(previous)

    with _ONE_AT_A_TIME:
        size = threading.stack_size()
        try:
            threading.stack_size(STACK_BYTES)
            thread = threading.Thread(target=run, name="amp-migrate-deep", daemon=True)
            thread.start()
        except (RuntimeError, ValueError, MemoryError):  # no thread, or no stack that large
            raise TooDeep() from None
        finally:
            threading.stack_size(size)
        thread.join()
    if error:
        raise error[0]
    return value[0]


@contextmanager
def callers_limit() -> Iterator[None]:
    """On the deep stack, the recursion limit of the thread that asked for it, meanwhile: so
    that Python's own parser accepts there only the nesting it accepts in an ordinary run."""
    if not getattr(_here, "deep", False):
        yield
        return
    sys.setrecursionlimit(_here.limit)
    try:
        yield
    finally:
        sys.setrecursionlimit(RECURSION_LIMIT)
