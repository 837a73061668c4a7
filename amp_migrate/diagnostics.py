"""Diagnostics: what the codemod tells the user about a file, with stable codes.

Every code is registered once, next to the rule that emits it, with the documentation that
`docs/diagnostics.md` and `amp-migrate explain CODE` show (what it means, why, an example),
in the manner of ruff's rule pages. Codes never change meaning once released.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass
from typing import Any


class Severity(str, enum.Enum):
    INFO = "info"  # a fix was applied; a behaviour worth knowing changed
    WARNING = "warning"  # the file fell back to the shim, or needs a manual look
    ERROR = "error"  # the file could not be migrated at all

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Code:
    code: str
    name: str
    severity: Severity
    summary: str
    why: str
    before: str = ""
    after: str = ""
    falls_back: bool = False  # emitting it sends the file to the shim under --target auto
    #: Why a careful person, migrating by hand, would not rewrite this natively either (or, for
    #: an error, would not touch the file): one short phrase, for reports that list the codes.
    refusal: str = ""
    #: What tells this code's messages apart: a phrase of each message text the code can carry,
    #: each also in the page (summary or why), so `amp-migrate explain` describes what fired.
    variants: tuple[str, ...] = ()
    #: For a code that falls back, what docs/fallbacks.md and `amp-migrate explain` tell a
    #: person migrating by hand: the shapes of real code that trigger it, and what to change.
    shape: str = ""
    by_hand: str = ""
    #: Why a native rewrite of those shapes cannot be shown to train the same, where the
    #: fallback page says it in other words than `why` (which the page shows otherwise).
    fallback_why: str = ""
    #: The fallback page's heading for the code; codes with one heading share an entry.
    fallback_title: str = ""
    #: An unsafe fix (ruff's tiers): the rewrite it reports differs from Apex only as the
    #: docs/differences.md entry of this id says. Without `--unsafe-fixes` it falls back.
    unsafe: str = ""


CODES: dict[str, Code] = {}


def define(
    code: str,
    name: str,
    severity: Severity,
    summary: str,
    why: str,
    *,
    before: str = "",
    after: str = "",
    falls_back: bool = False,
    refusal: str = "",
    variants: tuple[str, ...] = (),
    shape: str = "",
    by_hand: str = "",
    fallback_why: str = "",
    fallback_title: str = "",
    unsafe: str = "",
) -> Code:
    """Register a diagnostic code; rule modules call this at import time."""
    if code in CODES and CODES[code].name != name:
        raise ValueError(f"diagnostic code {code} registered twice ({CODES[code].name}, {name})")
    entry = Code(
        code,
        name,
        severity,
        summary,
        why,
        before.strip("\n"),
        after.strip("\n"),
        falls_back,
        refusal,
        variants,
        shape,
        by_hand,
        fallback_why,
        fallback_title,
        unsafe,
    )
    if unsafe and falls_back:
        raise ValueError(
            f"diagnostic code {code}: an unsafe fix is applied with --unsafe-fixes, never a fallback"
        )
    CODES[code] = entry
    return entry


@dataclass(frozen=True)
class Diagnostic:
    code: str
    severity: Severity
    line: int
    col: int
    message: str
    fixed: bool
    #: An unsafe fix that was applied (`--unsafe-fixes`); its code names the differences entry.
    unsafe: bool = False

    @property
    def falls_back(self) -> bool:
        """Sends the file to the shim under `--target auto`: a code that always does, or an
        unsafe fix the run did not allow."""
        entry = CODES[self.code]
        return entry.falls_back or bool(entry.unsafe) and not self.unsafe

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["severity"] = str(self.severity)
        return data

    def format(self, path: str = "<string>") -> str:
        return f"{path}:{self.line}:{self.col}: {self.code} {self.message}"


def settle_unsafe(diagnostics, applied: bool) -> list["Diagnostic"]:
    """The unsafe fixes' diagnostics once the file's target is known: applied where the native
    output is kept and the run allowed them, else fallback reasons; each message names its
    differences entry and says which."""
    settled = []
    for d in diagnostics:
        entry = CODES[d.code].unsafe
        if not entry:
            settled.append(d)
        elif applied and d.unsafe:
            note = f" (unsafe fix, applied: differs from Apex as docs/differences.md entry {entry} says)"
            settled.append(Diagnostic(d.code, d.severity, d.line, d.col, d.message + note, d.fixed, True))
        else:
            note = (
                f" (unsafe fix, not applied: the file keeps the shim for the reasons reported with it; it "
                f"differs from Apex as docs/differences.md entry {entry} says)"
                if d.unsafe
                else f" (unsafe fix: it differs from Apex as docs/differences.md entry {entry} says, so the "
                "file keeps the shim; `--unsafe-fixes` applies it)"
            )
            settled.append(Diagnostic(d.code, d.severity, d.line, d.col, d.message + note, False, False))
    return settled


PARSE_ERROR = define(
    "AMP001",
    "parse-error",
    Severity.ERROR,
    "The file is not valid Python, so it was left untouched.",
    "The codemod rewrites syntax trees; a file that does not parse has none. Fix the syntax "
    "error (or run the file's own Python version's parser on it) and run again.",
    refusal="the input is not valid Python 3",
)
VERIFY_FAILED = define(
    "AMP002",
    "verification-failed",
    Severity.ERROR,
    "The rewrite failed the codemod's own checks, so the file was left untouched.",
    "Every output is re-parsed, compiled, checked for names that do not resolve and migrated "
    "a second time (which must change nothing). An output that fails is a bug in amp-migrate: "
    "the file is kept as it was and the failure is reported; please report it with the file.",
)
INDENTATION_UNREADABLE = define(
    "AMP004",
    "indentation-unreadable",
    Severity.ERROR,
    "The file's indentation mixes tabs and spaces in a way Python accepts and the codemod's "
    "parser cannot read, and it could not be rewritten with provably the same blocks; the "
    "file was left untouched.",
    "Python measures indentation in columns (a tab reaches the next multiple of 8), so a "
    "block indented `\\t    ` inside one indented four spaces is valid. libcst, which the "
    "codemod rewrites with, needs a deeper block's indentation to start with its enclosing "
    "block's. The codemod then migrates the file with that indentation written as spaces and "
    "puts the file's own indentation back on every line, checking with Python's parser that "
    "both steps keep the program; where a check fails, this error names the first line libcst "
    "cannot read. Reindent the file with spaces (`expand -i -t 8 FILE` expands leading tabs "
    "only, leaving tabs inside strings alone) and run again.",
    refusal="the indentation could not be kept with provably the same blocks",
)
NATIVE_IMPOSSIBLE = define(
    "AMP003",
    "native-impossible",
    Severity.ERROR,
    "`--target native` was asked for, but the file has Apex uses with no provably right "
    "native form; it was left untouched.",
    "Native output must train the way the Apex code did. The diagnostics before this one name "
    "each use that blocks it; `--target auto` would migrate the file to the shim instead.",
)
# Notebooks (amp_migrate/io/notebook.py): cells are migrated as one module, IPython lines set aside.
MAGIC_USES_MIGRATED_NAME = define(
    "AMP021",
    "ipython-line-uses-migrated-name",
    Severity.WARNING,
    "An IPython line (a magic, a shell command, `obj?`) names something the native rewrite "
    "removes; the notebook uses the shim.",
    "Notebook cells are migrated as one Python module with their IPython lines set aside, so "
    "the rules cannot rewrite what those lines say. A line that names an Apex import's name "
    "(`%store amp`, `!echo {amp.state_dict()}`, `amp.initialize?`) or any other name the "
    "rewrite no longer binds would fail, or do something else, after a native migration. "
    "`%time STMT` and `%timeit STMT` are migrated as code, since their argument is one Python "
    "statement; other lines are not guessed at. The shim keeps every name bound as it was. "
    "Move the use into plain code (`%time` of a function works) to migrate natively.",
    before="from apex import amp\n%store amp",
    after="from amp_shim import amp\n%store amp",
    falls_back=True,
    refusal="an IPython line names what the rewrite removes",
    variants=("no longer binds",),
    fallback_title="an IPython line that names what the native rewrite removes",
    shape=(
        "A notebook line that is not Python and names an Apex import's name, or another name the native "
        "rewrite no longer binds: `%store amp`, `!echo {amp.state_dict()}`, `amp.initialize?`."
    ),
    by_hand=(
        "Move the use into plain code (`%time` of a function works: `%time STMT` and `%timeit STMT` are "
        "migrated as code), then re-run; or keep the shim, which binds every name as before."
    ),
)
NATIVE_SPANS_CELLS = define(
    "AMP023",
    "native-rewrite-spans-cells",
    Severity.WARNING,
    "The native rewrite would reach across the notebook's cells; the notebook uses the shim.",
    "Notebook cells are migrated as one Python module and cut back into the cells after. A "
    "native rewrite that opens a block around later code (the autocast region of a model "
    "Apex prepared for inference covers every statement that may use it, to the end of the "
    "notebook) or moves a statement over a cell boundary cannot be cut back: a `with` block "
    "cannot span cells, and a cell run on its own would run outside it. The shim changes only "
    "the imports, so every cell keeps its code. The diagnostic is at the first line the native "
    "rewrite changed. Keep the code that uses the model in the cell that prepares it, or in a "
    "function, to migrate natively.",
    before='from apex import amp\nmodel = amp.initialize(model, opt_level="O1")\n# -- next cell --\nout = model(x)',
    after='from amp_shim import amp\nmodel = amp.initialize(model, opt_level="O1")\n# -- next cell --\nout = model(x)',
    falls_back=True,
    refusal="a block cannot span notebook cells",
    variants=("cannot span cells",),
    fallback_title="a native rewrite that would span notebook cells",
    shape=(
        '`model = amp.initialize(model, opt_level="O1")` with no optimizer in one cell and the model\'s '
        "forward in a later cell (the autocast region would cover the later cells), or any native rewrite "
        "that moves a statement over a cell boundary."
    ),
    by_hand=(
        "Keep the code that uses the model in the cell that prepares it, or put both in a function, then "
        're-run; or drop the `initialize` and open `with torch.autocast("cuda", dtype=torch.float16):` '
        "around the forward in each cell that runs it."
    ),
)
