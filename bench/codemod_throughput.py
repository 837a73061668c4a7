"""Codemod throughput beside its peers, on one generated corpus, in one run.

    OMP_NUM_THREADS=1 python bench/codemod_throughput.py [--files 600] [--no-torchfix]

1. builds the corpus (`bench/codemod_corpus.py`, seeded) under `bench/.corpus/`;
2. `amp-migrate --check --jobs 1` on it, with each file's job timed (bench/_timed_amp_migrate.py:
   the same CLI, `runner.process` wrapped with a clock), and `amp-migrate --check --jobs 2`;
   the peak RSS of each run's process tree is sampled from /proc;
3. on the Apex files alone, in this process, file by file and interleaved (so that both see the
   same load and the same warm interpreter), each the best of 3: amp-migrate's whole pipeline
   (`migrate_source`: parse, rules, verification, render) and bare libcst parse + render
   (`parse_module(text).code`), the floor for any libcst tool; the CLI run's per-file clock for
   the same files is reported beside them (one cold run, so noisier);
4. TorchFix (`torchfix --jobs 2 CORPUS`, the way its users run it) from its own virtual
   environment `bench/.torchfix-venv/` (created here on first use: its last release pins
   libcst<1.6, this project's environment has a newer one);
5. the real public files of the shared corpus (`../shared/corpus/files`, read in place, never
   copied; `--real-corpus DIR` elsewhere, skipped when there is none): the same side-by-side
   measurement, the whole pipeline's cost per line on the smallest and the largest third
   of its files (by lines), which must not grow with file size, and the project index pass
   (`project.Tree`, each repository's files laid out at their manifest paths in a temporary
   folder, best of 3) against the per-file pipeline. `--real-only` measures this part alone
   and puts it into the existing results (the other rows stay as they were measured).

Prints a table and writes `bench/results/codemod_throughput.json`; `bench/write_performance.py`
puts it into docs/results/performance.md. Timings are wall clock on whatever else the machine is doing: the
load average before and after is recorded beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
import codemod_corpus  # noqa: E402
from _common import ROOT, describe, fmt, loadavg, machine, require_single_thread, run_timed, save, table  # noqa: E402

TORCHFIX_VERSION = "0.7.0"
TORCHFIX_VENV = ROOT / "bench" / ".torchfix-venv"
TARGETS = {
    "vs_torchfix": 10.0,
    "vs_bare_libcst": 0.5,
    "scaling_1_to_2": 1.7,
    "peak_rss_mb": 300.0,
    "real_vs_bare_libcst": 0.5,
    "real_large_vs_small_per_line": 1.5,
    "real_index_share": 0.10,
}


def torchfix_exe() -> Path:
    exe = TORCHFIX_VENV / "bin" / "torchfix"
    if not exe.exists():
        print(f"creating {TORCHFIX_VENV} with torchfix=={TORCHFIX_VERSION} ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(TORCHFIX_VENV)], check=True)
        subprocess.run(
            [str(TORCHFIX_VENV / "bin" / "pip"), "install", "--quiet", f"torchfix=={TORCHFIX_VERSION}"],
            check=True,
        )
    return exe


def torchfix_versions() -> dict:
    out = subprocess.run(
        [
            str(TORCHFIX_VENV / "bin" / "python"),
            "-c",
            "from importlib.metadata import version as v; print(v('torchfix'), v('libcst'))",
        ],
        capture_output=True,
        text=True,
    )
    tf, lc = (out.stdout.split() + ["?", "?"])[:2]
    return {"torchfix": tf, "libcst": lc}


def amp_migrate_cmd(jobs: int, corpus: Path, timed: bool) -> list[str]:
    args = ["--check", "--jobs", str(jobs), "--quiet", "--format", "json", "--no-gitignore", str(corpus)]
    if timed:
        return [sys.executable, str(ROOT / "bench" / "_timed_amp_migrate.py")] + args
    return [str(Path(sys.executable).parent / "amp-migrate")] + args


def clean_files_parsed(report: dict, clean: list[dict], corpus: Path) -> tuple[set[str], int]:
    """Of the files whose text never names Apex: how many use Apex's module anyway, handed in
    from another file of the tree (the report lists them changed or with diagnostics: the
    project pass found them and they must be parsed), and how many others were parsed.

    The report lists every file that passed the text pre-filter and was parsed."""
    listed = {str(Path(f["path"]).resolve()): f for f in report["files"]}
    handed: set[str] = set()
    parsed = 0
    for entry in clean:
        found = listed.get(str((corpus / entry["path"]).resolve()))
        if found is None:
            continue
        if found["changed"] or found["diagnostics"]:
            handed.add(entry["path"])
        else:
            parsed += 1
    return handed, parsed


def run_amp_migrate(jobs: int, corpus: Path, work: Path, timed: bool) -> tuple[dict, dict, dict]:
    env = dict(os.environ, OMP_NUM_THREADS="1", AMP_BENCH_TIMINGS=str(work / f"timings_j{jobs}.json"))
    out_path = work / f"amp_migrate_j{jobs}.json"
    with open(out_path, "w") as out:
        run = run_timed(amp_migrate_cmd(jobs, corpus, timed), env=env, stdout=out)
    if run["rc"] not in (0, 1):
        raise SystemExit(f"amp-migrate --jobs {jobs} failed ({run['rc']}):\n{run['stderr_tail']}")
    report = json.loads(out_path.read_text())
    timings = json.loads((work / f"timings_j{jobs}.json").read_text()) if timed else {}
    return run, report, timings


def side_by_side(paths: list[Path], repeats: int = 3) -> tuple[float, float, float, int]:
    per_file = timed_files(paths, repeats)
    ours, bare = sum(f["ours"] for f in per_file), sum(f["bare"] for f in per_file)
    slowest = max(per_file, key=lambda f: f["ours"], default={"ours": 0.0, "lines": 0})
    return ours, bare, slowest["ours"], slowest["lines"]


def timed_files(paths: list[Path], repeats: int = 3) -> list[dict]:
    """Seconds for `migrate_source` (the whole pipeline: parse, rules, verification, render)
    and for bare libcst parse + render on the same files, in this process, the two
    interleaved file by file and each the best of `repeats`, so that both see the same
    machine load and the same warm interpreter. Also the slowest file's time and lines."""
    import gc

    import libcst as cst

    from amp_migrate.cli.runner import GC_THRESHOLDS
    from amp_migrate.io.source_file import decode
    from amp_migrate.migrate import MigrationError, migrate_source

    gc.freeze()  # as the CLI does (runner.Workers) before its first file, for both sides
    gc.set_threshold(*GC_THRESHOLDS)
    out = []
    for path in paths:
        text = decode(path.read_bytes()).text
        mine = floor = float("inf")
        try:
            for _ in range(repeats):
                start = time.perf_counter()
                migrate_source(text)
                mine = min(mine, time.perf_counter() - start)
                start = time.perf_counter()
                assert cst.parse_module(text).code == text
                floor = min(floor, time.perf_counter() - start)
        except (MigrationError, cst.ParserSyntaxError):
            continue  # a syntax error: neither side has a file to time
        out.append({"path": str(path), "lines": len(text.splitlines()), "ours": mine, "bare": floor})
    return out


def real_corpus(directory: Path) -> Optional[dict]:
    """The real files of `directory` (a corpus with `files/` and `manifest.tsv`, read in
    place): the pipeline against bare libcst, and its cost per line by thirds of file size."""
    files = sorted((directory / "files").glob("*.py"))
    if not files:
        return None
    per_file = sorted(timed_files(files), key=lambda f: (f["lines"], f["path"]))
    third = len(per_file) // 3

    def part(rows: list[dict]) -> dict:
        lines, ours, bare = (sum(r[k] for r in rows) for k in ("lines", "ours", "bare"))
        return {
            "files": len(rows),
            "lines": lines,
            "amp_migrate_s": round(ours, 3),
            "bare_libcst_s": round(bare, 3),
            "amp_migrate_us_per_line": round(1e6 * ours / lines, 1),
            "bare_libcst_us_per_line": round(1e6 * bare / lines, 1),
        }

    whole, small, large = part(per_file), part(per_file[:third]), part(per_file[-third:])
    index = index_pass(directory)
    return {
        "corpus": str(directory),
        **whole,
        **index,
        "index_vs_pipeline": round(index["index_s"] / whole["amp_migrate_s"], 4),
        "ratio_to_bare_libcst": round(whole["bare_libcst_s"] / whole["amp_migrate_s"], 4),
        "smallest_third": small,
        "largest_third": large,
        "large_vs_small_per_line": round(
            large["amp_migrate_us_per_line"] / small["amp_migrate_us_per_line"], 3
        ),
        "slowest_files": [
            {
                "file": Path(f["path"]).name,
                "lines": f["lines"],
                "s": round(f["ours"], 3),
                "ratio_to_bare_libcst": round(f["bare"] / f["ours"], 3),
            }
            for f in sorted(per_file, key=lambda f: f["bare"] / f["ours"])[:5]
        ],
    }


def index_pass(directory: Path, repeats: int = 3) -> dict:
    """Seconds for the project index (`project.Tree`, what `amp-migrate` builds before it
    migrates a folder's files) of each repository of the corpus, laid out at its manifest
    paths in a temporary folder; each the best of `repeats`."""
    import tempfile

    from real_corpus import layout, manifest

    from amp_migrate.options import Options
    from amp_migrate.project.migrate import Tree

    best: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="amp-bench-index-") as tmp:
        repos = layout(directory, manifest(directory), Path(tmp))
        for _ in range(repeats):
            for repo, files in repos.items():
                paths = [str(p) for _, p in files if p.suffix == ".py"]
                start = time.perf_counter()
                Tree(paths, Options(), False)
                elapsed = time.perf_counter() - start
                best[repo] = min(elapsed, best.get(repo, elapsed))
    return {"index_s": round(sum(best.values()), 3), "index_repos": len(best)}


def default_real_corpus() -> Optional[Path]:
    for candidate in (ROOT.parent / "shared" / "corpus", Path("/work/shared/corpus")):
        if (candidate / "files").is_dir():
            return candidate
    return None


def main(argv=None) -> int:
    require_single_thread()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=600, help="generated files (plus the fixtures)")
    parser.add_argument("--apex-share", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--corpus", type=Path, default=codemod_corpus.DEFAULT_OUT)
    parser.add_argument("--no-torchfix", action="store_true", help="skip TorchFix (no venv needed)")
    parser.add_argument("--no-save", action="store_true", help="print only; keep bench/results as is")
    parser.add_argument(
        "--real-corpus",
        type=Path,
        default=None,
        help="a corpus of real files (files/, manifest.tsv); default ../shared/corpus",
    )
    parser.add_argument("--no-real-corpus", action="store_true", help="skip the real files")
    parser.add_argument(
        "--real-only",
        action="store_true",
        help="measure the real files alone; update their part of the saved results",
    )
    args = parser.parse_args(argv)
    if args.real_only:
        return real_only(args.real_corpus or default_real_corpus(), not args.no_save)

    start_all = time.perf_counter()
    t0 = time.perf_counter()
    manifest = codemod_corpus.build(args.corpus, args.files, args.apex_share, args.seed)
    gen_s = time.perf_counter() - t0
    corpus = args.corpus
    entries = manifest["entries"]
    apex = [e for e in entries if e["apex"]]
    clean = [e for e in entries if not e["apex"]]
    n_files, n_lines = len(entries), manifest["total_lines"]
    apex_lines = sum(e["lines"] for e in apex)
    print(
        f"corpus: {n_files} files, {n_lines:,} lines; {len(apex)} with Apex ({apex_lines:,} lines); "
        f"generated in {gen_s:.1f} s",
        flush=True,
    )
    tf_exe = None if args.no_torchfix else torchfix_exe()

    info = machine()
    load_before = loadavg()
    print(f"machine: {describe(info)}\nload average before: {load_before}", flush=True)
    work = corpus.parent / ".bench-work"
    work.mkdir(exist_ok=True)

    print("amp-migrate --check --jobs 1 ...", flush=True)
    j1, report1, timings = run_amp_migrate(1, corpus, work, timed=True)
    print(f"  {j1['wall_s']:.1f} s", flush=True)
    print("amp-migrate --check --jobs 2 ...", flush=True)
    j2, report2, _ = run_amp_migrate(2, corpus, work, timed=False)
    print(f"  {j2['wall_s']:.1f} s", flush=True)

    print("amp-migrate and bare libcst parse + render on the Apex files, side by side ...", flush=True)
    apex_s, bare_s, slowest_s, slowest_lines = side_by_side([corpus / e["path"] for e in apex])
    print(f"  {apex_s:.2f} s vs {bare_s:.2f} s", flush=True)

    real = None
    real_dir = None if args.no_real_corpus else (args.real_corpus or default_real_corpus())
    if real_dir is not None:
        print(f"amp-migrate and bare libcst parse + render on the real files of {real_dir} ...", flush=True)
        real = real_corpus(real_dir)
        if real is not None:
            print(f"  {real['amp_migrate_s']:.2f} s vs {real['bare_libcst_s']:.2f} s", flush=True)

    tf = None
    if tf_exe is not None:
        print(f"torchfix --jobs 2 (TorchFix {TORCHFIX_VERSION}) ...", flush=True)
        env = dict(os.environ, OMP_NUM_THREADS="1")
        out_path = work / "torchfix.txt"
        with open(out_path, "w") as out:
            tf = run_timed([str(tf_exe), "--jobs", "2", str(corpus)], env=env, stdout=out)
        tf["findings"] = sum(1 for _ in open(out_path))
        tf.update(torchfix_versions())
        print(f"  {tf['wall_s']:.1f} s, {tf['findings']} findings", flush=True)
    load_after = loadavg()

    # -- figures ----------------------------------------------------------------------------
    by_path = {str(Path(p).resolve()): s for p, s in timings.items()}

    def job_time(e) -> float:
        return by_path.get(str((corpus / e["path"]).resolve()), float("nan"))

    apex_cli_s = sum(job_time(e) for e in apex)
    summary1 = report1["summary"]
    handed, clean_parsed = clean_files_parsed(report1, clean, corpus)
    clean = [e for e in clean if e["path"] not in handed]
    clean_job_s = sum(job_time(e) for e in clean)

    def rates(wall: float) -> dict:
        return {
            "wall_s": round(wall, 3),
            "files_per_s": round(n_files / wall, 1),
            "lines_per_s": round(n_lines / wall, 1),
        }

    res = {
        "machine": info,
        "load_before": load_before,
        "load_after": load_after,
        "corpus": {
            "files": n_files,
            "lines": n_lines,
            "apex_files": len(apex),
            "apex_lines": apex_lines,
            "generated": args.files,
            "apex_share": args.apex_share,
            "seed": args.seed,
            "generation_s": round(gen_s, 2),
        },
        "amp_migrate_j1": {
            **rates(j1["wall_s"]),
            "peak_rss_tree_mb": j1["peak_rss_tree_mb"],
            "summary": summary1,
        },
        "amp_migrate_j2": {
            **rates(j2["wall_s"]),
            "peak_rss_tree_mb": j2["peak_rss_tree_mb"],
            "peak_rss_single_mb": j2["peak_rss_single_mb"],
            "summary": report2["summary"],
        },
        "apex_only": {
            "amp_migrate_job_s": round(apex_s, 3),
            "amp_migrate_lines_per_s": round(apex_lines / apex_s, 1),
            "amp_migrate_files_per_s": round(len(apex) / apex_s, 3),
            "amp_migrate_ms_per_line": round(1000 * apex_s / apex_lines, 3),
            "bare_libcst_s": round(bare_s, 3),
            "bare_libcst_lines_per_s": round(apex_lines / bare_s, 1),
            "bare_libcst_files_per_s": round(len(apex) / bare_s, 1),
            "slowest_file": {"lines": slowest_lines, "s": round(slowest_s, 3)},
            "cli_job_s": round(apex_cli_s, 3),
            "cli_lines_per_s": round(apex_lines / apex_cli_s, 1),
        },
        "clean_files": {
            "count": len(clean),
            "job_s": round(clean_job_s, 4),
            "us_per_file": round(1e6 * clean_job_s / max(len(clean), 1), 1),
            "parsed": clean_parsed,
            "apex_handed_in": len(handed),
        },
    }
    if real is not None:
        res["real_corpus"] = real
    res["scaling_1_to_2"] = round(j1["wall_s"] / j2["wall_s"], 2)
    res["apex_only"]["ratio_to_bare_libcst"] = round(
        res["apex_only"]["amp_migrate_lines_per_s"] / res["apex_only"]["bare_libcst_lines_per_s"], 4
    )
    if tf is not None:
        res["torchfix"] = {
            **rates(tf["wall_s"]),
            "jobs": 2,
            "version": tf["torchfix"],
            "libcst": tf["libcst"],
            "findings": tf["findings"],
            "rc": tf["rc"],
            "peak_rss_tree_mb": tf["peak_rss_tree_mb"],
        }
        res["ratio_to_torchfix_j2"] = round(tf["wall_s"] / j2["wall_s"], 3)
        res["ratio_to_torchfix_j1"] = round(tf["wall_s"] / j1["wall_s"], 3)
    t = TARGETS
    res["targets"] = [
        {
            "target": f">= {t['vs_torchfix']:g}x TorchFix's throughput (mixed corpus, both --jobs 2)",
            "measured": f"{res['ratio_to_torchfix_j2']:.2f}x" if tf else "not run",
            "met": bool(tf) and res["ratio_to_torchfix_j2"] >= t["vs_torchfix"],
        },
        {
            "target": f">= {t['vs_bare_libcst']:g}x bare libcst parse + render (Apex files, one process)",
            "measured": f"{res['apex_only']['ratio_to_bare_libcst']:.4f}x "
            f"({fmt(res['apex_only']['amp_migrate_lines_per_s'])} vs "
            f"{fmt(res['apex_only']['bare_libcst_lines_per_s'], 0)} lines/s)",
            "met": res["apex_only"]["ratio_to_bare_libcst"] >= t["vs_bare_libcst"],
        },
        {
            "target": "files without Apex cost no parse",
            "measured": f"{res['clean_files']['parsed']} of {len(clean)} parsed, "
            f"{res['clean_files']['us_per_file']:.0f} us per file",
            "met": res["clean_files"]["parsed"] == 0,
        },
        {
            "target": f">= {t['scaling_1_to_2']:g}x from --jobs 1 to --jobs 2",
            "measured": f"{res['scaling_1_to_2']:.2f}x",
            "met": res["scaling_1_to_2"] >= t["scaling_1_to_2"],
        },
        {
            "target": f"peak RSS with --jobs 2 < {t['peak_rss_mb']:g} MB (whole process tree)",
            "measured": f"{j2['peak_rss_tree_mb']:.0f} MB",
            "met": j2["peak_rss_tree_mb"] < t["peak_rss_mb"],
        },
    ]
    res["targets"] += real_targets(real)
    res["total_s"] = round(time.perf_counter() - start_all, 1)
    print()
    print(render_text(res))
    if not args.no_save:
        print(f"\nwrote {save('codemod_throughput', res).relative_to(ROOT)}")
    return 0


def real_only(directory: Optional[Path], write: bool) -> int:
    """The real-corpus row alone, printed, and put into the saved results in place of the
    one there (with its own date, machine and load: the other rows keep theirs)."""
    if directory is None:
        raise SystemExit("no real corpus: pass --real-corpus DIR")
    load_before = loadavg()
    print(f"amp-migrate and bare libcst parse + render on the real files of {directory} ...", flush=True)
    real = real_corpus(directory)
    if real is None:
        raise SystemExit(f"no Python files under {directory}/files")
    real.update(
        measured=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        machine=machine(),
        load_before=load_before,
        load_after=loadavg(),
    )
    targets = real_targets(real)
    print(
        table(
            ["target", "measured", "met"],
            [[t["target"], t["measured"], "yes" if t["met"] else "NO"] for t in targets],
        )
    )
    path = ROOT / "bench" / "results" / "codemod_throughput.json"
    if write and path.exists():
        res = json.loads(path.read_text())
        res["real_corpus"] = real
        res["targets"] = [t for t in res["targets"] if not t.get("real")] + targets
        path.write_text(json.dumps(res, indent=1) + "\n")
        print(f"\nupdated the real-corpus part of {path.relative_to(ROOT)}")
    return 0


def real_targets(real: Optional[dict]) -> list[dict]:
    """The real-corpus targets: speed against bare libcst, cost per line by file size, and
    the project index pass against the per-file pipeline."""
    t = TARGETS
    if real is None:
        return []
    small, large = real["smallest_third"], real["largest_third"]
    out = [
        {
            "target": f">= {t['real_vs_bare_libcst']:g}x bare libcst parse + render (real files, one process)",
            "measured": f"{real['ratio_to_bare_libcst']:.3f}x ({fmt(real['lines'] / real['amp_migrate_s'], 0)} vs "
            f"{fmt(real['lines'] / real['bare_libcst_s'], 0)} lines/s, {real['files']} files)",
            "met": real["ratio_to_bare_libcst"] >= t["real_vs_bare_libcst"],
        },
        {
            "target": f"cost per line of the largest third of the real files <= "
            f"{t['real_large_vs_small_per_line']:g}x the smallest third's",
            "measured": f"{real['large_vs_small_per_line']:.2f}x ({large['amp_migrate_us_per_line']:.0f} vs "
            f"{small['amp_migrate_us_per_line']:.0f} us per line)",
            "met": real["large_vs_small_per_line"] <= t["real_large_vs_small_per_line"],
        },
    ]
    if "index_vs_pipeline" in real:
        out.append(
            {
                "target": f"the project index pass adds < {t['real_index_share']:.0%} to the per-file "
                "pipeline (real files)",
                "measured": f"{real['index_vs_pipeline']:.1%} ({real['index_s']:.2f} s over "
                f"{real['index_repos']} repositories vs {real['amp_migrate_s']:.2f} s)",
                "met": real["index_vs_pipeline"] < t["real_index_share"],
            }
        )
    return [{**target, "real": True} for target in out]


def rows(res: dict) -> list[list[str]]:
    n_files = res["corpus"]["files"]
    out = []
    for key, label in (
        ("amp_migrate_j1", "amp-migrate --check --jobs 1"),
        ("amp_migrate_j2", "amp-migrate --check --jobs 2"),
        ("torchfix", f"torchfix --jobs 2 (TorchFix {res.get('torchfix', {}).get('version', '')})"),
    ):
        r = res.get(key)
        if r is None:
            continue
        out.append(
            [
                label,
                f"{n_files}",
                fmt(r["wall_s"]),
                fmt(r["files_per_s"]),
                fmt(r["lines_per_s"], 0),
                fmt(r.get("peak_rss_tree_mb"), 0),
            ]
        )
    a = res["apex_only"]
    c = res["corpus"]
    if "cli_job_s" in a:
        out.append(
            [
                "amp-migrate, Apex files only (CLI --jobs 1 run, per-file clock)",
                f"{c['apex_files']}",
                fmt(a["cli_job_s"]),
                fmt(c["apex_files"] / a["cli_job_s"], 2),
                fmt(a["cli_lines_per_s"], 0),
                "-",
            ]
        )
    out.append(
        [
            "amp-migrate `migrate_source`, Apex files only (best of 3 per file)",
            f"{c['apex_files']}",
            fmt(a["amp_migrate_job_s"]),
            fmt(a["amp_migrate_files_per_s"], 2),
            fmt(a["amp_migrate_lines_per_s"], 0),
            "-",
        ]
    )
    out.append(
        [
            "bare libcst parse + render, Apex files only (best of 3 per file)",
            f"{c['apex_files']}",
            fmt(a["bare_libcst_s"], 2),
            fmt(a["bare_libcst_files_per_s"]),
            fmt(a["bare_libcst_lines_per_s"], 0),
            "-",
        ]
    )
    real = res.get("real_corpus")
    if real is not None:
        for key, label in (
            ("amp_migrate_s", "amp-migrate `migrate_source`, real files (best of 3 per file)"),
            ("bare_libcst_s", "bare libcst parse + render, real files (best of 3 per file)"),
        ):
            out.append(
                [
                    label,
                    f"{real['files']}",
                    fmt(real[key], 2),
                    fmt(real["files"] / real[key], 2),
                    fmt(real["lines"] / real[key], 0),
                    "-",
                ]
            )
    return out


HEADERS = ["run", "files", "wall s", "files/s", "lines/s", "peak RSS MB"]


def render_text(res: dict) -> str:
    c = res["corpus"]
    lines = [
        f"machine: {describe(res['machine'])}",
        f"load average before/after: {res['load_before']} / {res['load_after']}",
        f"corpus: {c['files']} files, {c['lines']:,} lines, {c['apex_files']} with Apex "
        f"({c['apex_lines']:,} lines), seed {c['seed']}",
        "",
        table(HEADERS, rows(res)),
        "",
    ]
    if "ratio_to_torchfix_j2" in res:
        lines.append(
            f"ratio to TorchFix (both --jobs 2): {res['ratio_to_torchfix_j2']:.2f}x; "
            f"amp-migrate --jobs 1 vs TorchFix --jobs 2: {res['ratio_to_torchfix_j1']:.2f}x"
        )
    a = res["apex_only"]
    lines.append(
        f"ratio to bare libcst on the Apex files: {a['ratio_to_bare_libcst']:.4f}x "
        f"({a['amp_migrate_ms_per_line']:.3f} ms per line; slowest file "
        f"{a['slowest_file']['lines']} lines in {a['slowest_file']['s']:.2f} s)"
    )
    real = res.get("real_corpus")
    if real is not None:
        lines.append(
            f"ratio to bare libcst on the real files: {real['ratio_to_bare_libcst']:.3f}x; cost per "
            f"line, largest third vs smallest: {real['large_vs_small_per_line']:.2f}x; project index "
            f"{real.get('index_vs_pipeline', float('nan')):.1%} of the per-file pipeline"
        )
    cl = res["clean_files"]
    lines.append(
        f"files without Apex: {cl['count']} ({cl.get('apex_handed_in', 0)} more use Apex's module "
        f"handed in), {cl['parsed']} parsed, {cl['us_per_file']:.0f} us per file"
    )
    lines.append(f"scaling --jobs 1 -> 2: {res['scaling_1_to_2']:.2f}x")
    lines.append("")
    lines.append(
        table(
            ["target", "measured", "met"],
            [[t["target"], t["measured"], "yes" if t["met"] else "NO"] for t in res["targets"]],
        )
    )
    lines.append(f"\ntotal {res['total_s']:.0f} s")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
