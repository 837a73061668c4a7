"""What checking shim output against `amp_shim`'s exports costs, both ways it could be done.

    OMP_NUM_THREADS=1 python bench/shim_surface_cost.py [--corpus DIR] [--repeat 5]

Verification must know what `amp_shim` exports. Either each worker imports `amp_shim` (which
imports torch) the first time it needs to know, or the codemod reads a table generated from
the package (`amp_migrate/analysis/_shim_surface_table.py`, kept equal to it by a test). This measures,
in fresh interpreters that have imported the codemod (which loads the table), the time and
peak RSS that loading the table once more, or importing all of `amp_shim`, adds (median of
`--repeat`); and the check itself on the real corpus's shim outputs (parse included) beside
the whole shim migration of those files. Results go to
`bench/results/shim_surface_cost.json`.
"""

from __future__ import annotations

import argparse
import ast
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, describe, fmt, loadavg, machine, require_single_thread, save, table  # noqa: E402

PROBE = """
import resource, sys, time
import amp_migrate.migrate
start = time.perf_counter()
{extra}
elapsed = time.perf_counter() - start
print(elapsed, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "torch" in sys.modules)
"""

VARIANTS = {
    "codemod alone": "",
    "+ load the exports table again": (
        "import importlib, amp_migrate.analysis._shim_surface_table as t; importlib.reload(t)"
    ),
    "+ import amp_shim (the lazy way)": (
        "import amp_shim.amp, amp_shim.fp16_utils, amp_shim.optimizers, amp_shim.parallel, "
        "amp_shim.normalization, amp_shim.multi_tensor_apply"
    ),
}


def probe(extra: str, repeat: int) -> dict:
    times, rss, torch = [], [], False
    for _ in range(repeat):
        out = subprocess.run(
            [sys.executable, "-c", PROBE.format(extra=extra)],
            check=True,
            capture_output=True,
            text=True,
            cwd=ROOT,
        ).stdout.split()
        times.append(float(out[0]))
        rss.append(float(out[1]))
        torch = out[2] == "True"
    return {
        "import_s": statistics.median(times),
        "peak_rss_mb": statistics.median(rss),
        "imports_torch": torch,
    }


def default_corpus() -> Path:
    for candidate in (ROOT.parent / "shared" / "corpus", Path("/work/shared/corpus")):
        if (candidate / "manifest.tsv").exists():
            return candidate
    raise SystemExit("no corpus: pass --corpus DIR")


def corpus_check(corpus: Path, repeat: int) -> dict:
    from amp_migrate import migrate_source
    from amp_migrate.analysis.shim_surface import missing_names
    from amp_migrate.migrate import MigrationError

    texts = []
    for path in sorted((corpus / "files").glob("*.py")):
        text = path.read_text(encoding="utf-8", errors="surrogateescape")
        try:
            ast.parse(text)
        except SyntaxError:
            continue
        texts.append(text)
    migrate_s, outputs = [], []
    for _ in range(repeat):
        start = time.perf_counter()
        results = []
        for text in texts:
            try:
                results.append((text, migrate_source(text, target="shim")))
            except MigrationError:
                pass
        migrate_s.append(time.perf_counter() - start)
        outputs = [(t, r) for t, r in results if r.target_used == "shim" or r.code == t]
    check_s = []
    for _ in range(repeat):
        start = time.perf_counter()
        for text, result in outputs:
            missing_names(ast.parse(result.code), result.code)
            if result.target_used is None:  # left untouched: the input is read to place errors
                missing_names(ast.parse(text), text, ("apex", "amp_shim"))
        check_s.append(time.perf_counter() - start)
    return {
        "files": len(outputs),
        "migrate_shim_s": statistics.median(migrate_s),
        "check_s": statistics.median(check_s),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=None)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    require_single_thread()
    results = {"machine": machine(), "loadavg_before": loadavg()}
    results["imports"] = {name: probe(extra, args.repeat) for name, extra in VARIANTS.items()}
    results["corpus"] = corpus_check(args.corpus or default_corpus(), args.repeat)
    results["loadavg_after"] = loadavg()
    path = save("shim_surface_cost", results)

    base = results["imports"]["codemod alone"]
    rows = [
        [
            name,
            fmt(r["import_s"] * 1000, 0),
            fmt((r["import_s"] - base["import_s"]) * 1000, 0),
            fmt(r["peak_rss_mb"], 0),
            fmt(r["peak_rss_mb"] - base["peak_rss_mb"], 0),
            "yes" if r["imports_torch"] else "no",
        ]
        for name, r in results["imports"].items()
    ]
    print(describe(results["machine"]))
    print(
        table(["after `import amp_migrate.migrate`", "ms", "extra ms", "RSS MB", "extra MB", "torch"], rows)
    )
    c = results["corpus"]
    print(
        f"\ncheck on {c['files']} corpus files' shim outputs: {fmt(c['check_s'] * 1000, 0)} ms "
        f"({fmt(100 * c['check_s'] / c['migrate_shim_s'], 1)}% of their shim migration, "
        f"{fmt(c['migrate_shim_s'] * 1000, 0)} ms)"
    )
    print(f"saved {path.relative_to(ROOT)}")
    json.dumps(results)


if __name__ == "__main__":
    main()
