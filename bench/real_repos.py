"""Whole real repositories: what `amp-migrate PATH` makes of each, as a user runs it.

    OMP_NUM_THREADS=1 python bench/real_repos.py MIRRORS [--corpus DIR] [--jobs N] [--write]

MIRRORS is a folder of git directories of the repositories that the shared corpus's
`manifest.tsv` names (one folder per repository, named `owner+name`, holding a bare git
directory at any depth), for example what the search tool's `fetch` brings. Nothing of those
repositories is copied into this project: each tree is read out of its git directory at the
manifest's commit (the newest of the repository's manifest commits, where it lists several)
into a temporary folder, and only the figures are kept.

Each tree is migrated twice from the same checkout, once as `amp-migrate --format json .` and
once with `--unsafe-fixes`, each in a subprocess of the console entry point, writing in place.
Then each written tree is checked: every changed Python file compiles, no native file imports
Apex, and a second run (`--check`) changes nothing. Any of those is a **defect**.

Per file that mentions Apex: **native**, **shim**, **unchanged**, **refused** (left untouched for
a reason its code states: not Python 3, an Apex module the shim's release does not have) or
**error** (a defect of amp-migrate, or a file left untouched for a reason no code accepts).
Per repository: those counts, and whether it is left with no shim. Fallback codes by the number
of files they keep on the shim. Speed: lines of the files that mention Apex per second of the
run's own `elapsed_s` (the walk of the whole tree included).

Results go to `bench/results/real_repos.json`; `--write` puts the tables between
`<!-- real-repos:start -->` and `<!-- real-repos:end -->` in docs/results/real-repos.md and
one line of figures into README's link to that page.
"""

from __future__ import annotations

import argparse
import ast
import collections
import csv
import datetime
import io
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, ROOT, describe, loadavg, machine  # noqa: E402

from amp_migrate.diagnostics import CODES  # noqa: E402
from amp_migrate.docs import register_all_codes  # noqa: E402

register_all_codes()

START, END = "<!-- real-repos:start -->", "<!-- real-repos:end -->"
PAGE = ROOT / "docs" / "results" / "real-repos.md"
README_MARKS = ("<!-- real-repos-summary:start -->", "<!-- real-repos-summary:end -->")
KINDS = ("native", "shim", "unchanged", "refused", "error")
MODES = {"default": (), "unsafe": ("--unsafe-fixes",)}
#: What a tree needs to be migrated as its checkout would be: sources, notebooks, the config.
WANTED = (".py", ".ipynb")
CONFIG = ("pyproject.toml",)


def default_corpus() -> Path:
    for candidate in (ROOT.parent / "shared" / "corpus", Path("/work/shared/corpus")):
        if (candidate / "manifest.tsv").exists():
            return candidate
    raise SystemExit("no corpus: pass --corpus DIR (a folder with manifest.tsv)")


def commits_by_repo(corpus: Path) -> dict[str, list[str]]:
    with open(corpus / "manifest.tsv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    found: dict[str, list[str]] = {}
    for row in rows:
        listed = found.setdefault(row["repo"], [])
        if row["commit"] not in listed:
            listed.append(row["commit"])
    return found


def git_dir(mirrors: Path, repo: str) -> Optional[Path]:
    """The bare git directory under `mirrors/owner+name` (None: not there)."""
    top = mirrors / repo.replace("/", "+")
    if not top.is_dir():
        return None
    candidates = [top, *sorted(top.iterdir())]
    candidates += [c / ".git" for c in candidates]
    for folder in candidates:
        if (folder / "HEAD").is_file() and (folder / "objects").is_dir():
            return folder
    return None


def _git(gitdir: Path, *args: str, binary: bool = False):
    proc = subprocess.run(["git", f"--git-dir={gitdir}", *args], capture_output=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr.decode(errors="replace").strip() or f"git {args[0]} failed")
    return proc.stdout if binary else proc.stdout.decode()


def pick_commit(gitdir: Path, commits: list[str]) -> tuple[Optional[str], str]:
    """The newest of the manifest's commits that the mirror holds, and a note on the others."""
    held = []
    for commit in commits:
        try:
            held.append((int(_git(gitdir, "show", "-s", "--format=%ct", commit).strip()), commit))
        except RuntimeError:
            continue
    if not held:
        return None, f"none of the manifest's commits ({', '.join(c[:10] for c in commits)}) is in the mirror"
    held.sort()
    missing = len(commits) - len(held)
    note = f"{missing} older manifest commit(s) not in the mirror" if missing else ""
    return held[-1][1], note


def checkout(gitdir: Path, commit: str, into: Path) -> int:
    """The tree's sources at `commit` under `into` (blobs the mirror lacks are skipped); their count."""
    listing = _git(gitdir, "ls-tree", "-r", "-z", "--full-tree", commit)
    wanted = []
    for entry in listing.split("\0"):
        if not entry:
            continue
        meta, path = entry.split("\t", 1)
        mode, kind, sha = meta.split()
        if kind == "blob" and mode != "120000" and (path.endswith(WANTED) or path in CONFIG):
            wanted.append((path, sha))
    if not wanted:
        return 0
    batch = subprocess.run(
        ["git", f"--git-dir={gitdir}", "cat-file", "--batch"],
        input="".join(f"{sha}\n" for _, sha in wanted).encode(),
        capture_output=True,
        check=True,
    ).stdout
    stream, written = io.BytesIO(batch), 0
    for path, _sha in wanted:
        header = stream.readline().decode().split()
        if len(header) < 3 or header[1] == "missing":
            continue
        data = stream.read(int(header[2]))
        stream.read(1)
        target = into / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        written += 1
    return written


def amp_migrate(tree: Path, *args: str, jobs: int) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", NO_COLOR="1")
    proc = subprocess.run(
        [sys.executable, "-m", "amp_migrate", "--format", "json", "--jobs", str(jobs), *args, "."],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    if not proc.stdout.startswith("{"):
        raise RuntimeError(f"amp-migrate printed no JSON (exit {proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads(proc.stdout)


def _parses_as_python3(data: bytes) -> bool:
    try:
        compile(data, "<input>", "exec", ast.PyCF_ONLY_AST, dont_inherit=True)
    except (SyntaxError, ValueError):
        return False
    return True


def outcome(entry: dict, original: bytes, unsafe_fixes: bool) -> tuple[str, list[str], str]:
    """The file's outcome, the codes that keep it on the shim (an unsafe fix's code only where
    the run left unsafe fixes out), and why for refused and error."""
    errors = [d for d in entry["diagnostics"] if d["severity"] == "error"]
    if entry["error"] and not errors:
        return "error", [], entry["error"]
    refused = all(
        CODES.get(d["code"]) is not None
        and CODES[d["code"]].refusal
        and (d["code"] != "AMP001" or not _parses_as_python3(original))
        for d in errors
    )
    if errors:
        first = errors[0]
        return (
            ("refused" if refused else "error"),
            [],
            f"{first['code']} line {first['line']}: {first['message']}",
        )
    if not entry["changed"]:
        return "unchanged", [], ""
    target = entry["target_used"] or "error"
    codes = []
    if target == "shim":
        codes = sorted(
            {
                d["code"]
                for d in entry["diagnostics"]
                if d["code"] in CODES
                and (CODES[d["code"]].falls_back or (CODES[d["code"]].unsafe and not unsafe_fixes))
            }
        )
    return target, codes, ""


def _imports_apex(text: str) -> bool:
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "apex" for a in node.names):
            return True
        if (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and (node.module or "").split(".")[0] == "apex"
        ):
            return True
    return False


def _sources_of(path: Path) -> list[str]:
    """A Python file's text, or a notebook's code cells with IPython's magics blanked."""
    data = path.read_bytes()
    if path.suffix != ".ipynb":
        return [data.decode("utf-8", "surrogateescape")]
    cells = json.loads(data).get("cells", [])
    sources = []
    for cell in cells:
        if cell.get("cell_type") == "code":
            text = "".join(cell.get("source", []))
            sources.append("\n".join("" if line.lstrip()[:1] in "%!" else line for line in text.splitlines()))
    return sources


def defects_of(tree: Path, report: dict, again: dict) -> list[str]:
    """What the written tree gets wrong: code that does not compile, Apex left in a native file,
    a second run that changes something."""
    found = []
    for entry in report["files"]:
        if not entry["changed"]:
            continue
        path = tree / entry["path"]
        for source in _sources_of(path):
            try:
                compile(source, entry["path"], "exec", dont_inherit=True)
            except (SyntaxError, ValueError) as exc:
                if entry["kind"] == "python":
                    found.append(
                        f"{entry['path']}: the {entry['target_used']} output does not compile: {exc}"
                    )
                break
        if entry["target_used"] == "native" and any(_imports_apex(s) for s in _sources_of(path)):
            found.append(f"{entry['path']}: native output still imports apex")
    for entry in again["files"]:
        if entry["changed"]:
            found.append(f"{entry['path']}: a second run changes it")
    return found


def measure_repo(gitdir: Path, commit: str, mode: str, jobs: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="amp-real-repo-") as tmp:
        tree = Path(tmp) / "tree"
        tree.mkdir()
        sources = checkout(gitdir, commit, tree)
        originals = {}
        report = amp_migrate(tree, *MODES[mode], jobs=jobs)
        again = amp_migrate(tree, "--check", *MODES[mode], jobs=jobs)
        files = []
        for entry in report["files"]:
            original = (
                _git(gitdir, "show", f"{commit}:{entry['path']}", binary=True) if entry["changed"] else b""
            )
            originals[entry["path"]] = original
            kind, codes, why = outcome(
                entry, original or (tree / entry["path"]).read_bytes(), report["options"]["unsafe_fixes"]
            )
            lines = (original or (tree / entry["path"]).read_bytes()).count(b"\n")
            files.append(
                {
                    "path": entry["path"],
                    "kind": entry["kind"],
                    "outcome": kind,
                    "codes": codes,
                    "unsafe": entry.get("unsafe_fixes", []),
                    "lines": lines,
                    "reason": why or None,
                }
            )
        return {
            "sources": sources,
            "files": files,
            "defects": defects_of(tree, report, again),
            "elapsed_s": report["summary"]["elapsed_s"],
            "exit_code": report["exit_code"],
        }


def run(mirrors: Path, corpus: Path, jobs: int, only: Optional[set[str]] = None) -> dict:
    repos = []
    for repo, commits in sorted(commits_by_repo(corpus).items()):
        if only and repo not in only:
            continue
        gitdir = git_dir(mirrors, repo)
        if gitdir is None:
            repos.append({"repo": repo, "missing": f"no git directory under {repo.replace('/', '+')}"})
            continue
        commit, note = pick_commit(gitdir, commits)
        if commit is None:
            repos.append({"repo": repo, "missing": note})
            continue
        row: dict = {"repo": repo, "commit": commit, "note": note}
        for mode in MODES:
            print(f"{repo} @ {commit[:10]} ({mode})", file=sys.stderr, flush=True)
            row[mode] = measure_repo(gitdir, commit, mode, jobs)
        repos.append(row)
    return {
        "date": datetime.date.today().isoformat(),
        "machine": machine(),
        "jobs": jobs,
        "repos": repos,
        "summary": {mode: summarise(repos, mode) for mode in MODES},
    }


def summarise(repos: list[dict], mode: str) -> dict:
    measured = [r for r in repos if mode in r]
    counts: collections.Counter = collections.Counter()
    codes: collections.Counter = collections.Counter()
    no_shim = with_changes = 0
    lines = elapsed = 0.0
    for r in measured:
        files = r[mode]["files"]
        counts.update(f["outcome"] for f in files)
        codes.update(c for f in files for c in f["codes"])
        kinds = {f["outcome"] for f in files}
        if kinds & {"native", "shim"}:
            with_changes += 1
            no_shim += "shim" not in kinds
        lines += sum(f["lines"] for f in files)
        elapsed += r[mode]["elapsed_s"]
    changed = counts["native"] + counts["shim"]
    return {
        "repos": len(measured),
        "repos_changed": with_changes,
        "repos_no_shim": no_shim,
        "counts": {k: counts.get(k, 0) for k in KINDS},
        "native_share": counts["native"] / changed if changed else 0.0,
        "defects": sum(len(r[mode]["defects"]) for r in measured),
        "fallback_codes": codes.most_common(),
        "lines": int(lines),
        "elapsed_s": elapsed,
        "lines_per_s": lines / elapsed if elapsed else 0.0,
    }


def render(res: dict) -> str:
    sd, su = res["summary"]["default"], res["summary"]["unsafe"]
    missing = [r for r in res["repos"] if "missing" in r]
    out = [
        "### Whole repositories (`bench/real_repos.py`)",
        "",
        f"*Measured {res['date']}, {describe(res['machine'])}, `--jobs {res['jobs']}`.* "
        f"{sd['repos']} public repositories that use Apex (those of the shared corpus), each read out "
        "of its git history at the corpus manifest's commit and migrated whole, as "
        "`amp-migrate .` and as `amp-migrate --unsafe-fixes .`, in place; then each written tree "
        "checked (changed Python compiles, no native file imports Apex, a second run changes "
        "nothing). Files that mention Apex:",
        "",
        "| | default | `--unsafe-fixes` |",
        "|---|---:|---:|",
        *[f"| {k} | {sd['counts'][k]} | {su['counts'][k]} |" for k in KINDS],
        f"| native share of changed files | {sd['native_share']:.0%} | {su['native_share']:.0%} |",
        f"| repositories with no shim left (of those changed) | {sd['repos_no_shim']} of {sd['repos_changed']} "
        f"| {su['repos_no_shim']} of {su['repos_changed']} |",
        f"| defects (not compiling, Apex left in native, not idempotent) | {sd['defects']} | {su['defects']} |",
        f"| speed (lines of the files that mention Apex per second, whole run) | {sd['lines_per_s']:,.0f} "
        f"| {su['lines_per_s']:,.0f} |",
        "",
        "Per repository (native / shim / unchanged / refused / error; **bold**: no shim left):",
        "",
        "| repository | commit | default | `--unsafe-fixes` |",
        "|---|---|---|---|",
    ]
    for r in res["repos"]:
        if "missing" in r:
            continue
        cells = []
        for mode in MODES:
            c = collections.Counter(f["outcome"] for f in r[mode]["files"])
            text = " / ".join(str(c.get(k, 0)) for k in KINDS)
            changed = c.get("native", 0) + c.get("shim", 0)
            cells.append(f"**{text}**" if changed and not c.get("shim") else text)
        out.append(f"| {r['repo']} | `{r['commit'][:10]}` | {cells[0]} | {cells[1]} |")
    out += [
        "",
        "Codes that keep files on the shim (files per code):",
        "",
        "| code | default | `--unsafe-fixes` |",
    ]
    out.append("|---|---:|---:|")
    unsafe = dict(su["fallback_codes"])
    for code, n in sd["fallback_codes"]:
        out.append(f"| `{code}` | {n} | {unsafe.pop(code, 0)} |")
    out += [f"| `{code}` | 0 | {n} |" for code, n in unsafe.items()]
    errors = [
        (r["repo"], f)
        for r in res["repos"]
        if "default" in r
        for f in r["default"]["files"]
        if f["outcome"] == "error"
    ]
    if errors:
        out += ["", "Errors (default):", ""] + [
            f"- {repo}: `{f['path']}`: {f['reason']}" for repo, f in errors
        ]
    defects = [
        (r["repo"], d) for r in res["repos"] for mode in MODES if mode in r for d in r[mode]["defects"]
    ]
    if defects:
        out += ["", "Defects:", ""] + [f"- {repo}: {d}" for repo, d in defects]
    if missing:
        out += ["", "Not measured: " + "; ".join(f"{r['repo']} ({r['missing']})" for r in missing) + "."]
    return "\n".join(out)


def summary_line(res: dict) -> str:
    """README's one line: the share of changed files made native and the repositories left
    with no shim, for each tier."""
    sd, su = res["summary"]["default"], res["summary"]["unsafe"]
    return (
        f": {sd['repos']} repositories, {sd['native_share']:.0%} of changed files native and "
        f"{sd['repos_no_shim']} of {sd['repos_changed']} with no shim left by default, "
        f"{su['native_share']:.0%} and {su['repos_no_shim']} with `--unsafe-fixes`, "
        f"{sd['defects'] + su['defects']} defects"
    )


def _between(path: Path, start: str, end: str, body: str, newline: str = "\n") -> None:
    text = path.read_text()
    if start not in text or end not in text:
        raise SystemExit(f"{path} has no {start} ... {end} section")
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    path.write_text(head + start + newline + body + newline + end + tail)


def write_page(res: dict, body: str) -> None:
    _between(PAGE, START, END, body)
    _between(ROOT / "README.md", *README_MARKS, summary_line(res), newline="")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mirrors", type=Path, help="folder of owner+name git directories")
    parser.add_argument("--corpus", type=Path, default=None)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--only", action="append", help="measure only this owner/name (repeatable)")
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args(argv)
    load_before = loadavg()
    res = run(args.mirrors, args.corpus or default_corpus(), args.jobs, set(args.only or ()))
    res["load_before"], res["load_after"] = load_before, loadavg()
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "real_repos.json").write_text(json.dumps(res, indent=1) + "\n")
    body = render(res)
    print(body)
    if args.write:
        write_page(res, body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
