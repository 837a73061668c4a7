"""Same input, same output, byte for byte, whatever `PYTHONHASHSEED` and `--jobs`.

Each run is a fresh process with its own hash seed, so any set or `id()` order that reaches a
diagnostic, the JSON report or the code written shows up as a difference between runs (libcst
keeps a name's assignments and reads in sets: a rule that reports the first refusal it meets
among them reported a different line from run to run).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fixture_files import is_expected_output

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "fixtures" / "rules"
CORPUS_CANDIDATES = (REPO.parent / "shared" / "corpus" / "files", Path("/work/shared/corpus/files"))
#: (PYTHONHASHSEED, --jobs) of the whole passes over the goldens and the corpus: the two differ in
#: seed and in job count, so a set or `id()` order or the split between workers that reaches the
#: output makes them differ.
RUNS = ((0, 2), (1, 1))
#: A third seed, with the first run's job count, over the goldens alone (a tenth of a whole pass:
#: the corpus is nine tenths of the bytes): a difference from the first run there is the seed's.
#: That holds because a file's report names other modules only as the nearest that qualifies
#: (project/loss_helpers.py): a golden's sibling, never a corpus file, wherever the two lie.
GOLDENS_AGAIN = (12345, 2)
FIRST_REFUSAL = RULES / "fp16_utils" / "fp16_optimizer_first_refusal_fallback.py"
_ELAPSED = re.compile(r'"elapsed_s": [0-9.e+-]+')


def run(args: list[str], cwd: Path, seed: int) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONHASHSEED=str(seed), OMP_NUM_THREADS="1", NO_COLOR="1")
    return subprocess.run(
        [sys.executable, "-m", "amp_migrate", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )


def golden_inputs(root: Path) -> Path:
    """The golden cases' inputs (not their expected outputs), in their rule folders."""
    for case in sorted(RULES.glob("*/*.py")):
        if not is_expected_output(case):
            (root / case.parent.name).mkdir(parents=True, exist_ok=True)
            shutil.copyfile(case, root / case.parent.name / case.name)
    return root


@pytest.mark.slow
@pytest.mark.minutes
def test_report_and_written_code_do_not_depend_on_hash_seed_or_jobs(tmp_path):
    golden_inputs(tmp_path / "rules")
    corpus = [str(c) for c in CORPUS_CANDIDATES if c.is_dir()][:1]  # read in place: --diff writes nothing
    outputs = {}
    for seed, jobs in RUNS:
        proc = run(["--format", "json", "--diff", "--jobs", str(jobs), "rules", *corpus], tmp_path, seed)
        assert proc.stdout.startswith("{"), proc.stderr[-2000:]
        outputs[seed, jobs] = (proc.returncode, _ELAPSED.sub('"elapsed_s": 0', proc.stdout))
    first = outputs[RUNS[0]]
    for key, output in outputs.items():
        if output != first:
            differ = _files_that_differ(first[1], output[1])
            raise AssertionError(
                f"PYTHONHASHSEED={key[0]} --jobs {key[1]} differs from {RUNS[0]} in {differ}"
            )
    seed, jobs = GOLDENS_AGAIN
    proc = run(["--format", "json", "--diff", "--jobs", str(jobs), "rules"], tmp_path, seed)
    assert proc.stdout.startswith("{"), proc.stderr[-2000:]
    goldens = {p: f for p, f in _by_path(first[1]).items() if p.startswith("rules")}
    again = _by_path(_ELAPSED.sub('"elapsed_s": 0', proc.stdout))
    assert len(goldens) >= 300, sorted(goldens)[:5]
    differ = sorted(p for p in goldens.keys() | again.keys() if goldens.get(p) != again.get(p))
    assert not differ, f"PYTHONHASHSEED={seed} --jobs {jobs} differs from {RUNS[0]} in {differ}"


def _by_path(report: str) -> dict[str, dict]:
    return {f["path"]: f for f in json.loads(report)["files"]}


def _files_that_differ(a: str, b: str) -> list[str]:
    one, other = _by_path(a), _by_path(b)
    return sorted(p for p in one.keys() | other.keys() if one.get(p) != other.get(p)) or ["the summary"]


@pytest.mark.slow
def test_fp16_optimizer_refusal_names_the_first_use_in_the_file_in_every_process(tmp_path):
    """The wrapper's uses are checked in the file's order: the refusal is the first use that
    has no native form (line 12: a nested function reads it outside its `if args.fp16:`), not
    whichever of its three refusable uses a set happened to yield first."""
    shutil.copyfile(FIRST_REFUSAL, tmp_path / "train.py")
    for seed in (0, 1, 2, 3):
        proc = run(["--check", "--jobs", "1", "train.py"], tmp_path, seed)
        found = re.findall(r"train\.py:(\d+):\d+: AMP466 (.*)", proc.stdout)
        assert found == [
            (
                "12",
                "`optimizer` is used outside the function that builds it under `if args.fp16:`, "
                "where that condition cannot be read; the file uses the shim",
            )
        ], f"PYTHONHASHSEED={seed}: {proc.stdout}"


PROVIDER = """def get_amp(fp16):
    if fp16:
        from apex import amp
    else:
        amp = None
    return amp
"""
CALLER = """from amp_utils import get_amp

USE_AMP = HALF = MIXED = True


def train(model, optimizer, x, fp16=False):
    amp = get_amp(fp16 and USE_AMP and HALF and MIXED)
    if amp:
        model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    loss = model(x).sum()
    if amp:
        with amp.scale_loss(loss, optimizer) as scaled:
            scaled.backward()
    else:
        loss.backward()
    optimizer.step()
"""


@pytest.mark.slow
def test_a_provider_call_names_the_first_global_its_condition_reads_in_every_process(tmp_path):
    """The condition's names were a set: the refusal named `USE_AMP`, `HALF` or `MIXED` by
    hash seed. It names the first in the condition."""
    (tmp_path / "amp_utils.py").write_text(PROVIDER)
    (tmp_path / "train.py").write_text(CALLER)
    for seed in (0, 1, 2, 3):
        proc = run(["--check", "--jobs", "1", "."], tmp_path, seed)
        found = re.findall(r"train\.py:7:\d+: AMP163 (.*)", proc.stdout)
        assert found == [
            "`USE_AMP` in `fp16 and USE_AMP and HALF and MIXED` is not a parameter of `train`"
        ], f"PYTHONHASHSEED={seed}: {proc.stdout}"
