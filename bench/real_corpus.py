"""Real public Apex code: what amp-migrate makes of it, and how fast.

    OMP_NUM_THREADS=1 python bench/real_corpus.py [--corpus DIR] [--write-readme]

Reads the corpus of real files that use Apex (`../shared/corpus/`: `files/` and `manifest.tsv`
with each file's repository, commit and license) in place, never copies it, and runs every file
through exactly what `amp-migrate --check` runs per file (`runner.process`, `--target auto`).
Each file is counted once: **native** (every Apex use rewritten to `torch.amp`), **shim** (fell
back; its codes are counted), **unchanged**, or **error** (left untouched: a syntax error, a
refused output, an internal error). Speed: the whole pipeline on the Python files against bare
libcst parse + render of the same files, both file by file, interleaved, best of 3.

Results go to `bench/results/real_corpus.json`; `--write-readme` puts the table between
`<!-- real-corpus:start -->` and `<!-- real-corpus:end -->` in README.md.
"""
from __future__ import annotations

import argparse
import collections
import csv
import datetime
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, ROOT, describe, loadavg, machine, table  # noqa: E402

START, END = "<!-- real-corpus:start -->", "<!-- real-corpus:end -->"


def default_corpus() -> Path:
    for candidate in (ROOT.parent / "shared" / "corpus", Path("/work/shared/corpus")):
        if (candidate / "manifest.tsv").exists():
            return candidate
    raise SystemExit("no corpus: pass --corpus DIR (a folder with files/ and manifest.tsv)")


def manifest(corpus: Path) -> list[dict]:
    with open(corpus / "manifest.tsv", newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f, delimiter="\t"))


def outcome(result) -> str:
    if result.error or any(f.diagnostic.severity == "error" for f in result.findings):
        return "error"
    if not result.changed:
        return "unchanged"
    return result.target_used or "error"


def run(corpus: Path) -> dict:
    import libcst as cst

    from amp_migrate.options import Options
    from amp_migrate.runner import Job, process

    rows = manifest(corpus)
    options = Options(target="auto")
    files = []
    fallback: dict[str, dict] = {}
    best_pipeline: dict[str, float] = {}
    best_libcst: dict[str, float] = {}
    for attempt in range(3):
        for row in rows:
            path = corpus / "files" / row["file_name"]
            kind = "notebook" if path.suffix == ".ipynb" else "python"
            started = time.perf_counter()
            result = process(Job(str(path), kind, options))
            elapsed = time.perf_counter() - started
            if kind == "python":
                best_pipeline[row["file_name"]] = min(elapsed, best_pipeline.get(row["file_name"], elapsed))
                text = path.read_bytes().decode("utf-8", "surrogateescape")
                started = time.perf_counter()
                try:
                    cst.parse_module(text).code
                except cst.ParserSyntaxError:
                    pass
                elapsed = time.perf_counter() - started
                best_libcst[row["file_name"]] = min(elapsed, best_libcst.get(row["file_name"], elapsed))
            if attempt:
                continue
            kind_of = outcome(result)
            codes = sorted(set(result.fallback_codes)) if kind_of == "shim" else []
            for finding in result.findings:
                d = finding.diagnostic
                if kind_of == "shim" and d.code in codes and d.code not in fallback:
                    where = f"cell {finding.cell}:" if finding.cell is not None else ""
                    fallback[d.code] = {"file": row["file_name"], "where": f"{where}{d.line}", "message": d.message}
            files.append({"file": row["file_name"], "repo": row["repo"], "kind": kind, "lines": int(row["lines"]),
                          "outcome": kind_of, "codes": codes,
                          "error": result.error or next((f.format(row["file_name"]) for f in result.findings
                                                         if f.diagnostic.severity == "error"), None)})
    counts = collections.Counter(f["outcome"] for f in files)
    code_files = collections.Counter(code for f in files for code in f["codes"])
    python = [f for f in files if f["kind"] == "python" and f["outcome"] != "error"]
    lines = sum(f["lines"] for f in python)
    pipeline_s = sum(best_pipeline[f["file"]] for f in python)
    libcst_s = sum(best_libcst[f["file"]] for f in python)
    return {
        "date": datetime.date.today().isoformat(), "machine": machine(), "corpus": str(corpus),
        "files": files, "counts": dict(counts),
        "fallbacks": [{"code": c, "files": n, **fallback[c]} for c, n in code_files.most_common()],
        "speed": {"files": len(python), "lines": lines, "pipeline_s": pipeline_s, "libcst_s": libcst_s,
                  "pipeline_lines_per_s": lines / pipeline_s, "libcst_lines_per_s": lines / libcst_s,
                  "ratio": libcst_s / pipeline_s},
    }


def render(res: dict) -> str:
    counts = res["counts"]
    changed = counts.get("native", 0) + counts.get("shim", 0)
    share = counts.get("native", 0) / changed if changed else 0.0
    sp = res["speed"]
    out = [
        "### Real public code (`bench/real_corpus.py`)", "",
        f"*Measured {res['date']}, {describe(res['machine'])}.* {len(res['files'])} real files that use "
        f"Apex, from {len({f['repo'] for f in res['files']})} public repositories at pinned commits "
        "(read in place from the shared corpus, whose manifest names each file's repository, commit "
        "and license), each run as `amp-migrate --check` runs it (`--target auto`):", "",
        table(["outcome", "files"], [[k, counts.get(k, 0)] for k in ("native", "shim", "unchanged", "error")],
              markdown=True), "",
        f"Native: {counts.get('native', 0)} of the {changed} files that change ({share:.0%}). "
        "Why the others use the shim (files per code, and one place each):", "",
        "| code | files | example |", "|---|---:|---|",
        *[f"| `{r['code']}` | {r['files']} | " + f"{r['file']}:{r['where']}: {r['message']}".replace("|", "\\|") + " |"
          for r in res["fallbacks"]], "",
    ]
    errors = [f for f in res["files"] if f["outcome"] == "error"]
    if errors:
        out += ["Left untouched with an error:", ""] + [f"- {f['error']}" for f in errors] + [""]
    out.append(f"Speed on the {sp['files']} Python files that parse ({sp['lines']:,} lines): "
               f"{sp['pipeline_lines_per_s']:,.0f} lines/s for the whole pipeline against "
               f"{sp['libcst_lines_per_s']:,.0f} lines/s for bare libcst parse + render, "
               f"{sp['ratio']:.2f}x.")
    return "\n".join(out)


def write_readme(body: str) -> None:
    readme = ROOT / "README.md"
    text = readme.read_text()
    if START not in text or END not in text:
        raise SystemExit(f"README.md has no {START} ... {END} section")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    readme.write_text(head + START + "\n" + body + "\n" + END + tail)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, default=None)
    parser.add_argument("--write-readme", action="store_true")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    load_before = loadavg()
    res = run(args.corpus or default_corpus())
    res["load_before"], res["load_after"] = load_before, loadavg()
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "real_corpus.json").write_text(json.dumps(res, indent=1) + "\n")
    body = render(res)
    print(body)
    if args.write_readme:
        write_readme(body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
