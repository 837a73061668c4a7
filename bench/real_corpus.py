"""Real public Apex code: what amp-migrate makes of it, and how fast.

    OMP_NUM_THREADS=1 python bench/real_corpus.py [--corpus DIR] [--write] [--unsafe-fixes]

Reads the corpus of real files that use Apex (`../shared/corpus/`: `files/` and `manifest.tsv`
with each file's repository, path, commit and license), lays each repository's files out at
their manifest paths in a temporary folder (never inside this repository), and runs each
repository through exactly what `amp-migrate --check REPO` runs (`--target auto`, one worker):
the project index, `runner.process` per file, then the groups settled (`project.Tree`).
Each file is counted once: **native** (every Apex use rewritten to `torch.amp`), **shim** (fell
back; its codes are counted, each with the reason a careful person refuses it too, from the
code's own `refusal=`), **unchanged**, **refused** (left untouched for a reason its diagnostic
states and a person would accept: input that is not valid Python 3, Apex modules that the
release the shim reproduces does not have), or **error** (a defect: an internal error, an
output the codemod's own checks rejected (AMP002), an output that does not compile, or one that
a second run over the migrated repository changes). Speed: the whole pipeline on the Python
files against bare libcst parse + render of the same files, both file by file, interleaved,
best of 3.

Results go to `bench/results/real_corpus.json`; `--write` puts the table between
`<!-- real-corpus:start -->` and `<!-- real-corpus:end -->` in docs/results/real-corpus.md.
"""

from __future__ import annotations

import argparse
import ast
import collections
import csv
import datetime
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, ROOT, describe, loadavg, machine, table  # noqa: E402

from amp_migrate.diagnostics import CODES, PARSE_ERROR  # noqa: E402
from amp_migrate.docs import register_all_codes  # noqa: E402

register_all_codes()

START, END = "<!-- real-corpus:start -->", "<!-- real-corpus:end -->"
UNSAFE_START, UNSAFE_END = "<!-- real-corpus-unsafe:start -->", "<!-- real-corpus-unsafe:end -->"


def default_corpus() -> Path:
    for candidate in (ROOT.parent / "shared" / "corpus", Path("/work/shared/corpus")):
        if (candidate / "manifest.tsv").exists():
            return candidate
    raise SystemExit("no corpus: pass --corpus DIR (a folder with files/ and manifest.tsv)")


def manifest(corpus: Path) -> list[dict]:
    with open(corpus / "manifest.tsv", newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f, delimiter="\t"))


KINDS = ("native", "shim", "unchanged", "refused", "error")


def _parses_as_python3(data: Optional[bytes]) -> bool:
    try:
        compile(data or b"", "<input>", "exec", ast.PyCF_ONLY_AST, dont_inherit=True)
    except (SyntaxError, ValueError):
        return False
    return True


def _refused(finding, kind: str, data: Optional[bytes]) -> bool:
    """An error a careful person would accept: its code states a refusal, and for a parse error
    the input really is no Python 3 (libcst failing on valid Python is our defect)."""
    code = CODES.get(finding.diagnostic.code)
    if code is None or not code.refusal:
        return False
    if code.code == PARSE_ERROR.code:
        return kind == "python" and not _parses_as_python3(data)
    return True


def outcome(result, data: Optional[bytes] = None) -> tuple[str, str]:
    """The file's outcome and, for "refused" and "error", why. `data`: the input's bytes."""
    name = result.path
    if result.error:
        return "error", f"{name}: {result.error}"
    errors = [f for f in result.findings if f.diagnostic.severity == "error"]
    defects = [f for f in errors if not _refused(f, result.kind, data)]
    if defects:
        return "error", defects[0].format(name)
    if errors:
        first = errors[0]
        return "refused", f"{CODES[first.diagnostic.code].refusal}: {first.format(name)}"
    if not result.changed:
        return "unchanged", ""
    return (result.target_used, "") if result.target_used else ("error", f"{name}: changed, no target")


def output_defect(result, again) -> Optional[str]:
    """Why a changed file's output is a defect, or None: it must compile (Python files) and a
    second run over the migrated repository (`again`, that file's result) must change nothing."""
    if not result.changed or result.new_bytes is None:
        return None
    if result.kind == "python":
        try:
            compile(result.new_bytes, result.path, "exec", dont_inherit=True)
        except (SyntaxError, ValueError) as exc:
            return f"{result.path}: the {result.target_used} output does not compile: {exc}"
    if again is not None and (again.changed or again.error):
        why = again.error or "a second run changes it"
        return f"{result.path}: the {result.target_used} output is not idempotent: {why}"
    return None


def layout(corpus: Path, rows: list[dict], folder: Path) -> dict[str, list[tuple[dict, Path]]]:
    """Each repository's files at their manifest paths under `folder` (a temporary folder
    outside the repository), by repository."""
    repos: dict[str, list[tuple[dict, Path]]] = {}
    for row in rows:
        target = folder / row["repo"].replace("/", "__") / row["path"]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes((corpus / "files" / row["file_name"]).read_bytes())
        repos.setdefault(row["repo"], []).append((row, target))
    return repos


def _migrate_repo(files: list[tuple[dict, Path]], options) -> tuple[dict, dict, dict]:
    """One repository as `amp-migrate --check REPO` runs it (one worker): its files' results
    alone and after the project pass, and the time of each part."""
    from amp_migrate.cli.runner import Job, process
    from amp_migrate.project import Tree

    times = {"index": 0.0, "files": {}, "settle": 0.0}
    alone, final = {}, {}
    cwd = os.getcwd()
    os.chdir(files[0][1].parents[len(Path(files[0][0]["path"]).parts) - 1])  # the repository's folder
    try:
        started = time.perf_counter()
        tree = Tree([row["path"] for row, p in files if p.suffix == ".py"], options, False)
        times["index"] = time.perf_counter() - started
        for row, path in files:
            kind = "notebook" if path.suffix == ".ipynb" else "python"
            started = time.perf_counter()
            result = process(Job(row["path"], kind, options))
            times["files"][row["file_name"]] = time.perf_counter() - started
            alone[row["path"]] = result
            started = time.perf_counter()
            for settled in tree.feed(result):
                final[settled.path] = settled
            times["settle"] += time.perf_counter() - started
    finally:
        os.chdir(cwd)
    return alone, final, times


def _entry(row: dict, result, data: Optional[bytes], defect: Optional[str] = None) -> dict:
    kind_of, reason = ("error", defect) if defect else outcome(result, data)
    codes = sorted(set(result.fallback_codes)) if kind_of == "shim" else []
    # Left as it is with a warning that names why (the project pass's AMP031-AMP033).
    warned = sorted(
        {
            f.diagnostic.code
            for f in result.findings
            if f.diagnostic.severity == "warning" and not f.diagnostic.fixed and not f.diagnostic.falls_back
        }
    )
    return {
        "file": row["file_name"],
        "repo": row["repo"],
        "path": row["path"],
        "lines": int(row["lines"]),
        "kind": "notebook" if row["file_name"].endswith(".ipynb") else "python",
        "outcome": kind_of,
        "codes": codes,
        "warned": warned,
        "reason": reason.replace(row["path"], row["file_name"], 1) if reason else None,
    }


def _examples(results: dict, files: list[dict], fallback: dict) -> None:
    for entry in files:
        result = results[entry["file"]]
        for finding in result.findings:
            d = finding.diagnostic
            if d.code in entry["codes"] + entry["warned"] and d.code not in fallback:
                where = f"cell {finding.cell}:" if finding.cell is not None else ""
                fallback[d.code] = {"file": entry["file"], "where": f"{where}{d.line}", "message": d.message}


def _libcst_seconds(path: Path) -> float:
    import libcst as cst

    text = path.read_bytes().decode("utf-8", "surrogateescape")
    started = time.perf_counter()
    try:
        _ = cst.parse_module(text).code
    except cst.ParserSyntaxError:
        pass
    return time.perf_counter() - started


def run(corpus: Path, unsafe_fixes: bool = False) -> dict:
    from amp_migrate.options import Options

    rows = manifest(corpus)
    options = Options(target="auto", unsafe_fixes=unsafe_fixes)
    best: dict[str, float] = {}
    best_libcst: dict[str, float] = {}
    best_index: dict[str, float] = {}
    best_settle: dict[str, float] = {}
    collected: dict[str, tuple] = {}
    with tempfile.TemporaryDirectory(prefix="amp-real-corpus-") as tmp:
        repos = layout(corpus, rows, Path(tmp))
        for attempt in range(3):
            for repo, files in repos.items():
                alone, final, times = _migrate_repo(files, options)
                best_index[repo] = min(times["index"], best_index.get(repo, times["index"]))
                best_settle[repo] = min(times["settle"], best_settle.get(repo, times["settle"]))
                for row, path in files:
                    name = row["file_name"]
                    best[name] = min(times["files"][name], best.get(name, times["files"][name]))
                    if path.suffix == ".py":
                        elapsed = _libcst_seconds(path)
                        best_libcst[name] = min(elapsed, best_libcst.get(name, elapsed))
                if attempt == 0:
                    by_name = {row["file_name"]: (row, row["path"]) for row, path in files}
                    collected[repo] = (
                        by_name,
                        {n: alone[p] for n, (_, p) in by_name.items()},
                        {n: final[p] for n, (_, p) in by_name.items()},
                    )
        defects: dict[str, str] = {}
        for repo, files in repos.items():
            defects.update(_verify_repo(files, collected[repo][2], options))
    result = _summarise(collected, defects, best, best_libcst, best_index, best_settle, corpus)
    return {**result, "unsafe_fixes": unsafe_fixes}


def _verify_repo(files: list[tuple[dict, Path]], final: dict, options) -> dict[str, str]:
    """Each file whose output is a defect (see `output_defect`), by file name: the repository's
    outputs written over its laid-out files and the whole repository run a second time, as a
    user running amp-migrate twice would."""
    for row, path in files:
        result = final[row["file_name"]]
        if result.changed and result.new_bytes is not None:
            path.write_bytes(result.new_bytes)
    _, again, _ = _migrate_repo(files, options)
    found = {
        row["file_name"]: output_defect(final[row["file_name"]], again.get(row["path"])) for row, _ in files
    }
    return {name: why for name, why in found.items() if why}


def _summarise(
    collected: dict,
    defects: dict,
    best: dict,
    best_libcst: dict,
    best_index: dict,
    best_settle: dict,
    corpus: Path,
) -> dict:
    files, alone_files, fallback, first_all, last_all = [], [], {}, {}, {}
    for _repo, (by_name, first, last) in sorted(collected.items()):
        for name, (row, _) in sorted(by_name.items()):
            data = (corpus / "files" / name).read_bytes()
            files.append(_entry(row, last[name], data, defects.get(name)))
            alone_files.append(_entry(row, first[name], data, output_defect(first[name], None)))
            first_all[name], last_all[name] = first[name], last[name]
    _examples(last_all, files, fallback)
    counts = collections.Counter(f["outcome"] for f in files)
    alone_counts = collections.Counter(f["outcome"] for f in alone_files)
    code_files = collections.Counter(code for f in files for code in f["codes"] + f["warned"])
    python = [f for f in files if f["kind"] == "python" and f["outcome"] not in ("error", "refused")]
    lines = sum(f["lines"] for f in python)
    pipeline_s = sum(best[f["file"]] for f in python)
    libcst_s = sum(best_libcst[f["file"]] for f in python)
    index_s, settle_s = sum(best_index.values()), sum(best_settle.values())
    moved = [f for f, a in zip(files, alone_files) if f["outcome"] != a["outcome"]]
    return {
        "date": datetime.date.today().isoformat(),
        "machine": machine(),
        "corpus": str(corpus),
        "mode": "project",
        "files": files,
        "counts": dict(counts),
        "alone_counts": dict(alone_counts),
        "moved": [
            {"file": f["file"], "alone": a["outcome"], "project": f["outcome"]}
            for f, a in zip(files, alone_files)
            if f["outcome"] != a["outcome"]
        ],
        "fallbacks": [
            {"code": c, "files": n, "refusal": CODES[c].refusal if c in CODES else "", **fallback[c]}
            for c, n in code_files.most_common()
        ],
        "speed": {
            "files": len(python),
            "lines": lines,
            "pipeline_s": pipeline_s,
            "libcst_s": libcst_s,
            "pipeline_lines_per_s": lines / pipeline_s,
            "libcst_lines_per_s": lines / libcst_s,
            "ratio": libcst_s / pipeline_s,
            "index_s": index_s,
            "settle_s": settle_s,
            "index_share": index_s / (index_s + pipeline_s + settle_s),
            "moved": len(moved),
        },
    }


def _first_sentence(text: str) -> str:
    found = re.search(r"[.!?](?=\s)", text)
    return text[: found.end()] if found else text


def render(res: dict) -> str:
    counts, alone = res["counts"], res.get("alone_counts", {})
    changed = counts.get("native", 0) + counts.get("shim", 0)
    share = counts.get("native", 0) / changed if changed else 0.0
    sp = res["speed"]
    out = [
        "### Real public code (`bench/real_corpus.py`"
        + (" --unsafe-fixes)" if res.get("unsafe_fixes") else ")"),
        "",
        f"*Measured {res['date']}, {describe(res['machine'])}.* {len(res['files'])} real files that use "
        f"Apex, from {len({f['repo'] for f in res['files']})} public repositories at pinned commits "
        "(read from the shared corpus, whose manifest names each file's repository, path, commit "
        "and license). Each repository's files are laid out at their paths in a temporary folder "
        "and run as `amp-migrate --check REPO` runs them (`--target auto`): the project index, "
        "each file alone, then each group of files that share Apex objects settled on one target. "
        '"alone" is each file migrated by itself, for comparison:',
        "",
        table(
            ["outcome", "files", "alone"],
            [[k, counts.get(k, 0), alone.get(k, 0)] for k in KINDS],
            markdown=True,
        ),
        "",
        f"Native: {counts.get('native', 0)} of the {changed} files that change ({share:.0%}). "
        "Why the others use the shim, or stay as they are with a warning (files per code, the "
        "reason a careful person refuses it too, and one place each):",
        "",
        "| code | files | why refuse | example |",
        "|---|---:|---|---|",
        *[
            f"| `{r['code']}` | {r['files']} | {r.get('refusal', '')} | "
            + f"{r['file']}:{r['where']}: {r['message']}".replace("|", "\\|")
            + " |"
            for r in res["fallbacks"]
        ],
        "",
    ]
    moved = res.get("moved", [])
    if moved:
        out += [
            f"Files whose outcome the project pass changed ({len(moved)}): "
            + ", ".join(f"`{m['file']}` ({m['alone']} -> {m['project']})" for m in moved)
            + ".",
            "",
        ]
    for kind, title in (
        ("refused", "Refused (left untouched, for the reason given)"),
        ("error", "Errors (defects of amp-migrate)"),
    ):
        listed = [f for f in res["files"] if f["outcome"] == kind]
        if listed:
            out += [f"{title}:", ""] + [f"- {_first_sentence(f['reason'])}" for f in listed] + [""]
    out.append(
        f"Speed on the {sp['files']} Python files neither refused nor in error ({sp['lines']:,} lines): "
        f"{sp['pipeline_lines_per_s']:,.0f} lines/s for the per-file pipeline against "
        f"{sp['libcst_lines_per_s']:,.0f} lines/s for bare libcst parse + render, "
        f"{sp['ratio']:.2f}x. The project index took {sp['index_s']:.2f} s "
        f"({sp['index_share']:.1%} of the run), settling the groups {sp['settle_s']:.2f} s."
    )
    return "\n".join(out)


def write_page(body: str, unsafe_fixes: bool = False) -> None:
    """The default run's section, or with `--unsafe-fixes` the section of that tier."""
    page = ROOT / "docs" / "results" / "real-corpus.md"
    start, end = (UNSAFE_START, UNSAFE_END) if unsafe_fixes else (START, END)
    text = page.read_text()
    if start not in text or end not in text:
        raise SystemExit(f"{page} has no {start} ... {end} section")
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    page.write_text(head + start + "\n" + body + "\n" + end + tail)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, default=None)
    parser.add_argument("--write", "--write-readme", action="store_true")
    parser.add_argument(
        "--unsafe-fixes",
        action="store_true",
        help="migrate as `amp-migrate --unsafe-fixes` does (its own JSON and section)",
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    load_before = loadavg()
    res = run(args.corpus or default_corpus(), args.unsafe_fixes)
    res["load_before"], res["load_after"] = load_before, loadavg()
    RESULTS.mkdir(parents=True, exist_ok=True)
    name = "real_corpus_unsafe.json" if args.unsafe_fixes else "real_corpus.json"
    (RESULTS / name).write_text(json.dumps(res, indent=1) + "\n")
    body = render(res)
    print(body)
    if args.write:
        write_page(body, args.unsafe_fixes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
