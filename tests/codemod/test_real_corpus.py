"""Real public Apex code (../shared/corpus, read in place, never copied): every file, through
exactly what `amp-migrate` runs per file, under `--target auto` and `--target shim`.

No crash (the two files only Python 2 can parse are a located syntax error), no refusal
(AMP002), no diagnostic without a place; every output compiles where the input did and is
final (migrating it again changes nothing); native output imports neither Apex nor the shim;
shim output imports only what the installed `amp_shim` has.
"""

from __future__ import annotations

import ast
import csv
import importlib
import importlib.util
import json
import os
import re
import warnings
from concurrent.futures import ProcessPoolExecutor
from functools import lru_cache
from pathlib import Path
from typing import Optional

import pytest

from amp_migrate.cli.file_result import FileResult
from amp_migrate.cli.runner import Job, process
from amp_migrate.options import Options

ROOT = Path(__file__).resolve().parents[2]
CANDIDATES = (ROOT.parent / "shared" / "corpus", Path("/work/shared/corpus"))
CORPUS = next((c for c in CANDIDATES if (c / "manifest.tsv").is_file()), None)
TARGETS = ("auto", "shim")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        CORPUS is None,
        reason="the real-code corpus is not here (looked for manifest.tsv in "
        + " and ".join(str(c) for c in CANDIDATES)
        + "); it is not part of the repository",
    ),
]


def _rows() -> list[dict]:
    if CORPUS is None:
        return []
    with open(CORPUS / "manifest.tsv", newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f, delimiter="\t"))


ROWS = _rows()


def _kind(name: str) -> str:
    return "notebook" if name.endswith(".ipynb") else "python"


def _run(args: tuple[str, str, str]) -> tuple[FileResult, Optional[FileResult]]:
    """One file under one target, then its output migrated again (from a scratch copy)."""
    path, target, scratch = args
    options = Options(target=target)
    first = process(Job(path, _kind(path), options))
    if not first.changed or first.new_bytes is None:
        return first, None
    again_path = Path(scratch) / f"{target}-{Path(path).name}"
    again_path.write_bytes(first.new_bytes)
    return first, process(Job(str(again_path), _kind(path), options))


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[tuple[str, str], tuple[FileResult, Optional[FileResult]]]:
    """Every file under both targets, in as many processes as there are cores (a minute's work
    on one)."""
    scratch = tmp_path_factory.mktemp("corpus-again")
    jobs = [
        (str(CORPUS / "files" / row["file_name"]), target, str(scratch)) for row in ROWS for target in TARGETS
    ]
    workers = max(1, min(4, len(os.sched_getaffinity(0))))
    with ProcessPoolExecutor(workers) as pool:
        done = list(pool.map(_run, jobs, chunksize=4))
    return {(Path(path).name, target): result for (path, target, _), result in zip(jobs, done)}


def _cells(data: bytes) -> list[str]:
    """A notebook's code cells, IPython lines (`%magic`, `!cmd`) blanked to `pass`."""
    nb = json.loads(data)
    out = []
    for cell in nb.get("cells", []):
        if cell.get("cell_type") != "code":
            continue
        source = cell.get("source", "")
        source = "".join(source) if isinstance(source, list) else source
        if source.lstrip().startswith("%%"):
            continue
        out.append(re.sub(r"^([ \t]*)[%!].*$", r"\1pass", source, flags=re.M))
    return out


def _sources(data: bytes, kind: str) -> list[str]:
    if kind == "notebook":
        return _cells(data)
    return [data.decode("utf-8", "surrogateescape")]


def _compiles(source: str) -> bool:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compile(source, "<corpus>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return False
    return True


def _imports(source: str):
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, None
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            for alias in node.names:
                yield node.module, alias.name


def _top(module: str) -> str:
    return module.split(".")[0]


@lru_cache(maxsize=None)
def _shim_has(module: str, name: Optional[str]) -> bool:
    """Whether the installed amp_shim has `module` (and `name` in it), asked of the package."""
    try:
        imported = importlib.import_module(module)
    except ImportError:
        return False
    if name in (None, "*") or hasattr(imported, name):
        return True
    return importlib.util.find_spec(f"{module}.{name}") is not None


def test_the_corpus_has_the_files_the_manifest_lists():
    assert len(ROWS) >= 100
    for row in ROWS:
        assert (CORPUS / "files" / row["file_name"]).is_file(), row["file_name"]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("row", ROWS, ids=[r["file_name"] for r in ROWS])
def test_real_file_migrates_soundly_and_finally(results, row, target):
    name = row["file_name"]
    kind = _kind(name)
    first, again = results[(name, target)]
    assert first.error is None, first.error
    codes = [f.diagnostic.code for f in first.findings]
    assert "AMP002" not in codes, [f.format(name) for f in first.findings]
    for finding in first.findings:
        assert finding.diagnostic.line >= 1 and finding.diagnostic.col >= 1, finding.format(name)
    if "py2" in row["features"].split(","):
        # Python 3 cannot parse it: a syntax error with its place, the file untouched.
        assert not first.changed
        (error,) = [f.diagnostic for f in first.findings if f.diagnostic.code == "AMP001"]
        assert error.line >= 1 and "syntax error" in error.message
        return
    assert "AMP001" not in codes
    if not first.changed:
        return
    before = _sources((CORPUS / "files" / name).read_bytes(), kind)
    after = _sources(first.new_bytes, kind)
    assert len(before) == len(after)
    for old, new in zip(before, after):
        assert _compiles(new) or not _compiles(old)
    assert again is not None and again.error is None and not again.changed, (
        "migrating the output again changed it",
        [f.format(name) for f in (again.findings if again else ())],
    )
    imported = [(module, obj) for source in after for module, obj in _imports(source)]
    if first.target_used == "native":
        assert not [m for m, _ in imported if _top(m) == "apex"], imported
        # Native code takes from amp_shim only an optimizer torch has no class for (AMP505).
        shim = {m for m, _ in imported if _top(m) == "amp_shim"}
        kept = any(f.diagnostic.code == "AMP505" for f in first.findings)
        assert not shim or (kept and shim == {"amp_shim.optimizers"}), imported
    else:
        assert first.target_used == "shim"
        assert not [m for m, _ in imported if _top(m) == "apex"], imported
        missing = [(m, o) for m, o in imported if _top(m) == "amp_shim" and not _shim_has(m, o)]
        assert missing == []
