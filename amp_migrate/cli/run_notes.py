"""Notes about a whole run rather than one file: what the user should know before running the
output here, and how to read the positions the report gives."""

from __future__ import annotations

import re
from typing import Optional, Sequence

from ..options import Options
from .file_result import FileResult

#: A GradScaler or autocast for device "cuda" as the rules write it (in a notebook's JSON the
#: quotes are escaped): what torch turns off where CUDA is missing.
_CUDA_AMP = re.compile(rb"""\b(?:GradScaler|autocast)\(\s*(?:device_type\s*=\s*)?\\?["']cuda\\?["']""")


def _written(result: FileResult, mode: str) -> bool:
    """The run writes the file (or, with --check/--diff, would)."""
    if mode in ("fix", "interactive"):
        return result.written
    return result.changed and result.error is None


def run_notes(results: Sequence[FileResult], options: Options, mode: str) -> list[str]:
    """The notes the text and the JSON report both carry, in order."""
    note = cuda_note(results, options, mode)
    return [note] if note else []


def cuda_note(results: Sequence[FileResult], options: Options, mode: str) -> Optional[str]:
    """Native code for device "cuda" on a machine without CUDA runs, but torch turns its
    GradScaler and autocast off there with one warning, and it trains in float32: say so, and
    how to target this machine's CPU. The machine is looked at only when such a file exists."""
    if options.device != "cuda":
        return None
    native = sum(
        r.target_used == "native" and _written(r, mode) and _CUDA_AMP.search(r.new_bytes or b"") is not None
        for r in results
    )
    if not native:
        return None
    from .cuda_here import cuda_available

    if cuda_available() is not False:
        return None
    files = f"{native} file{'s' if native != 1 else ''}"
    if mode in ("fix", "interactive"):
        written, how = "written", "migrate the original files again with"
    else:
        written, how = "this run would write", "add"
    return (
        f'this machine has no CUDA, and the native code {written} for device "cuda" ({files}) would '
        "train here in float32: torch disables its GradScaler and autocast, with a warning. To train "
        f'on this machine\'s CPU, {how} `--device cpu` (float16 autocast with GradScaler("cpu")) or '
        "`--device cpu --dtype bfloat16` (no loss scaling); on a CUDA machine nothing needs to change."
    )


def positions_note(results: Sequence[FileResult]) -> Optional[str]:
    """The diagnostics give lines of the text the codemod read; after an in-place rewrite the
    user opens the written file, where some of them moved. Said once, where that happened."""
    moved = sum(r.written and any(r.output_line(f) != f.diagnostic.line for f in r.findings) for r in results)
    if not moved:
        return None
    files = f"{moved} written file{'s' if moved != 1 else ''}"
    return (
        "positions above are lines of each file as it was before this run rewrote it; they moved in "
        f"{files} (`--format json` gives each diagnostic's line in the written file as output_line)"
    )
