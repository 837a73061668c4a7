"""Write the benchmarks' latest results into docs/results/performance.md.

    python bench/write_performance.py [--check]

Reads `bench/results/codemod_throughput.json`, `bench/results/shim_overhead.json` and
`bench/results/startup.json` (written by the benchmarks) and replaces what lies between `<!-- performance:start -->` and
`<!-- performance:end -->` in docs/results/performance.md; nothing else in the file changes. `--check` exits 1
when the section is not what the results say (for CI), writing nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import codemod_throughput  # noqa: E402
import shim_overhead  # noqa: E402
import startup  # noqa: E402
from _common import RESULTS, ROOT, describe, table  # noqa: E402

PAGE = ROOT / "docs" / "results" / "performance.md"
IDLE_LOAD = 0.7
START, END = "<!-- performance:start -->", "<!-- performance:end -->"


def _targets(res: dict) -> str:
    return table(
        ["target", "measured", "met"],
        [[t["target"], t["measured"], "yes" if t["met"] else "**missed**"] for t in res["targets"]],
        markdown=True,
    )


def _missed(res: dict) -> list[str]:
    return [f"- **Missed:** {t['target']}: measured {t['measured']}." for t in res["targets"] if not t["met"]]


def _header(res: dict, what: str) -> str:
    out = (
        f"*{what}: {res['date']}, {describe(res['machine'])}; load average "
        f"{', '.join(map(str, res['load_before']))} before, "
        f"{', '.join(map(str, res['load_after']))} after; the run took {res['total_s']:.0f} s.*"
    )
    busiest = max((res["load_before"] or [0])[:1] + (res["load_after"] or [0])[:1])
    if busiest > IDLE_LOAD:
        out += (
            f" **The machine was not idle** (1-minute load average up to {busiest:g} on "
            f"{res['machine']['cores']} cores, from other work): wall-clock figures are "
            "pessimistic and ratios between runs are noisy."
        )
    return out


def codemod_section(res: dict) -> str:
    c, a, cl = res["corpus"], res["apex_only"], res["clean_files"]
    out = [
        "### Codemod throughput (`bench/codemod_throughput.py`)",
        "",
        _header(res, "Measured"),
        "",
        f"Corpus (`bench/codemod_corpus.py --files {c['generated']} --seed {c['seed']}`): "
        f"{c['files']} files, {c['lines']:,} lines; {c['apex_files']} use Apex "
        f"({c['apex_lines']:,} lines: {round(c['generated'] * c['apex_share'])} generated, "
        f"the rest `fixtures/` programs). The default corpus is {c['generated']} generated "
        "files, not thousands: at TorchFix's throughput (it parses every file that mentions "
        "torch) a corpus of thousands would not fit the three benchmarks' 10-minute budget "
        "on this machine; `bench/codemod_throughput.py --files 2000` measures that size. Nor "
        "is it smaller: every amp-migrate wall time includes about 0.5 s of start-up (importing "
        "libcst), which a run of a few seconds must outweigh for the 1-to-2-jobs scaling to "
        "mean anything.",
        "",
        table(codemod_throughput.HEADERS, codemod_throughput.rows(res), markdown=True),
        "",
    ]
    facts = []
    if "ratio_to_torchfix_j2" in res:
        t = res["torchfix"]
        facts.append(
            f"- Against TorchFix {t['version']} (libcst {t['libcst']}, its own venv, "
            f"{t['findings']:,} findings printed): {res['ratio_to_torchfix_j2']:.2f}x its "
            f"throughput with both at `--jobs 2` ({res['ratio_to_torchfix_j1']:.2f}x with "
            "amp-migrate at `--jobs 1`)."
        )
    cli = (
        f" The same files in the CLI's own `--jobs 1` run (one cold pass, per-file clock, "
        f"reading and decoding included): {a['cli_lines_per_s']:,.0f} lines/s, "
        f"{a['cli_lines_per_s'] / a['bare_libcst_lines_per_s']:.2f}x."
        if "cli_lines_per_s" in a
        else ""
    )
    facts.append(
        f"- Apex files alone: {a['amp_migrate_lines_per_s']:,.0f} lines/s for the whole "
        f"pipeline (`migrate_source`: parse, rules, verification, render; "
        f"{a['amp_migrate_ms_per_line']:.2f} ms per line; the slowest file, "
        f"{a['slowest_file']['lines']:,} lines, took {a['slowest_file']['s']:.2f} s) against "
        f"{a['bare_libcst_lines_per_s']:,.0f} lines/s for bare libcst parse + render, both "
        f"measured file by file, interleaved, best of 3: "
        f"{a['ratio_to_bare_libcst']:.3f}x.{cli}"
    )
    real = res.get("real_corpus")
    if real is not None:
        small, large = real["smallest_third"], real["largest_third"]
        facts.append(
            f"- Real public files ({real['files']} Python files that parse, {real['lines']:,} lines, "
            "read in place from the shared corpus): "
            f"{real['lines'] / real['amp_migrate_s']:,.0f} lines/s for the whole pipeline against "
            f"{real['lines'] / real['bare_libcst_s']:,.0f} lines/s for bare libcst, "
            f"{real['ratio_to_bare_libcst']:.3f}x, measured the same way; cost per line "
            f"{small['amp_migrate_us_per_line']:.0f} µs on the smallest third of the files "
            f"({small['lines']:,} lines), {large['amp_migrate_us_per_line']:.0f} µs on the largest "
            f"third ({large['lines']:,} lines): {real['large_vs_small_per_line']:.2f}x."
            + (
                f" The project index pass (`project.Tree` over each of the {real['index_repos']} "
                f"repositories, laid out at their paths) took {real['index_s']:.2f} s, "
                f"{real['index_vs_pipeline']:.1%} on top of the per-file pipeline."
                if "index_vs_pipeline" in real
                else ""
            )
            + (
                f" (This row measured {real['measured']} with `--real-only`, load average "
                f"{', '.join(map(str, real['load_before']))} before, "
                f"{', '.join(map(str, real['load_after']))} after.)"
                if "measured" in real
                else ""
            )
        )
    facts.append(
        f"- Files without Apex: {cl['parsed']} of {cl['count']} parsed; "
        f"{cl['us_per_file']:.0f} µs per file (read + text pre-filter)."
        + (
            f" {cl['apex_handed_in']} more files never name Apex but use its module, handed in from "
            "another file: the project pass finds and migrates them, so they are parsed and not "
            "counted here."
            if cl.get("apex_handed_in")
            else ""
        )
    )
    facts.append(f"- Scaling from `--jobs 1` to `--jobs 2`: {res['scaling_1_to_2']:.2f}x.")
    s2 = res["amp_migrate_j2"]["summary"]
    facts.append(
        f"- Outcome of the run: {s2['changed']} files would change ({s2['native']} native, "
        f"{s2['shim']} shim fallback), {s2['errors']} errors."
    )
    out += facts + ["", _targets(res)]
    return "\n".join(out)


def shim_section(res: dict) -> str:
    out = [
        "### Shim overhead and host syncs (`bench/shim_overhead.py`)",
        "",
        _header(res, "Measured"),
        "",
        f'CPU, float16 (`torch.autocast("cpu", dtype=torch.float16)` + `torch.amp.GradScaler("cpu")` '
        f"natively; the shim's CPU default at O1), SGD with momentum; median of single steps "
        f"over {res['rounds']} interleaved slices of about {res['seconds_per_slice']:g} s per model "
        "and way, each way in a worker process of its own. Host syncs counted over 5 iterations after warm-up, "
        "the 3rd overflowing; the fused column is `torch.optim.AdamW(fused=True)` natively and Apex's "
        "`FusedAdam()` / `FusedAdam(capturable=True)` / `AdamW(fused=True)` under the shim (the last two "
        "support amp scaling and skip an overflowing step on the device; the default `FusedAdam()` keeps "
        "its step count as a host int, so its skip is decided on the host, as in Apex).",
        "",
        table(shim_overhead.HEADERS, shim_overhead.rows(res), markdown=True),
        "",
        "The ratio judged is the ratio of the medians. The same ratio from neighbouring "
        "slices only (median over rounds of each slice's median over native's), which a "
        "drifting load disturbs less: "
        + "; ".join(
            f"{r['label']} O1 {r['paired_ratio']['O1']:.3f}x, O2 {r['paired_ratio']['O2']:.3f}x"
            for r in res["models"].values()
        )
        + ".",
        "",
        _targets(res),
    ]
    return "\n".join(out)


def startup_section(res: dict) -> str:
    bare = res["cases"][0]
    version, check = startup.case(res, "amp-migrate --version"), startup.case(res, "amp-migrate --check")
    out = [
        "### Start-up (`bench/startup.py`)",
        "",
        _header(res, "Measured"),
        "",
        f"Whole-process time of `{res['command']} --version`, of `{res['command']} --check DIR` on a "
        "one-file tree whose file does not use Apex (what pre-commit and editor integrations run on "
        "every call), and of bare `python -c pass`; median of "
        f"{res['runs']} runs each, interleaved, after a warm-up run (bytecode caches written), "
        "`OMP_NUM_THREADS=1`. CPU time is the process's user + system time, which other work on "
        "the machine disturbs far less than wall time."
        + (
            f" The baseline is the code at {res['baseline']}, measured in the same rounds."
            if res["baseline"]
            else ""
        ),
        "",
        table(startup.HEADERS, startup.rows(res), markdown=True),
        "",
        f"- Over bare Python ({bare['median_cpu_s']:.3f} s CPU): `--version` costs "
        f"{version['median_cpu_s'] - bare['median_cpu_s']:.3f} s CPU, the `--check` "
        f"{check['median_cpu_s'] - bare['median_cpu_s']:.3f} s CPU. `--version` imports click alone; "
        "the `--check` adds the discovery, the text pre-filter, the project index and rich for the "
        "report, never libcst, the rules or torch (tests/cli/test_startup_imports.py).",
    ]
    if res["baseline"]:
        base = f"baseline {res['baseline']}"
        bv, bc = (
            startup.case(res, "amp-migrate --version", base),
            startup.case(res, "amp-migrate --check", base),
        )
        out.append(
            f"- Against {res['baseline']}: `--version` {bv['median_cpu_s'] / version['median_cpu_s']:.1f}x less "
            f"CPU time, the `--check` {bc['median_cpu_s'] / check['median_cpu_s']:.1f}x less."
        )
    out += ["", _targets(res)]
    return "\n".join(out)


def render() -> str:
    parts = []
    missed = []
    sections = (
        ("codemod_throughput", codemod_section),
        ("shim_overhead", shim_section),
        ("startup", startup_section),
    )
    for name, section in sections:
        path = RESULTS / f"{name}.json"
        if not path.exists():
            parts.append(f"*`bench/{name}.py` has not been run yet.*")
            continue
        res = json.loads(path.read_text())
        parts.append(section(res))
        missed += _missed(res)
    head = (
        ["Targets missed in the latest runs:", ""] if missed else ["Every target is met in the latest runs."]
    )
    totals = [
        json.loads((RESULTS / f"{n}.json").read_text())["total_s"]
        for n in ("codemod_throughput", "shim_overhead")
        if (RESULTS / f"{n}.json").exists()
    ]
    if len(totals) == 2:
        missed.append(
            f"\nThe two benchmarks took {totals[0]:.0f} s + {totals[1]:.0f} s = "
            f"{sum(totals):.0f} s of wall clock in their latest runs (the 10-minute budget "
            "covers the three scripts; `write_performance.py` takes under a second)."
        )
    return "\n\n".join(["\n".join(head + missed)] + parts)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    text = PAGE.read_text()
    if START not in text or END not in text:
        print(f"{PAGE.relative_to(ROOT)} has no {START} ... {END} section", file=sys.stderr)
        return 2
    before, rest = text.split(START, 1)
    _, after = rest.split(END, 1)
    new = before + START + "\n" + render() + "\n" + END + after
    if args.check:
        return 0 if new == text else 1
    if new != text:
        PAGE.write_text(new)
        print(f"{PAGE.relative_to(ROOT)}: performance section updated")
    else:
        print(f"{PAGE.relative_to(ROOT)}: performance section already up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
