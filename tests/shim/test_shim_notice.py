"""What a program on the shim is told where Apex said "apex.amp is deprecated and will be removed
by the end of February 2023": one line, once per process, on stderr, naming what runs and the
way to migrate; Apex's option listing on stdout stays exactly as Apex printed it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

from amp_migrate.runs.recorder import LOSS
from amp_shim import _deprecation, amp
from amp_shim._deprecation import DeprecatedFeatureWarning

ROOT = Path(__file__).resolve().parents[2]
WHAT_RUNS = "runs Apex's amp API on amp_shim over torch.amp"
HOW_TO_MIGRATE = "`amp-migrate PATH`"
APEX_TEXT = ("apex.amp is deprecated", "February 2023")

O1_LISTING = (
    "Selected optimization level O1:  Insert automatic casts around Pytorch functions and Tensor methods.\n"
    "\n"
    "Defaults for this optimization level are:\n"
    "enabled                : True\n"
    "opt_level              : O1\n"
    "cast_model_type        : None\n"
    "patch_torch_functions  : True\n"
    "keep_batchnorm_fp32    : None\n"
    "master_weights         : None\n"
    "loss_scale             : dynamic\n"
    "Processing user overrides (additional kwargs that are not None)...\n"
    "After processing overrides, optimization options are:\n"
    "enabled                : True\n"
    "opt_level              : O1\n"
    "cast_model_type        : None\n"
    "patch_torch_functions  : True\n"
    "keep_batchnorm_fp32    : None\n"
    "master_weights         : None\n"
    "loss_scale             : dynamic\n"
)

# Every amp_shim entry a legacy program reaches (the package, its submodules, `import apex`
# through the alias), three `initialize` calls, a filter change between them (which resets
# Python's own once-per-location registry) and the three decorators.
PROGRAM = textwrap.dedent(
    """
    import sys, warnings
    import torch
    import amp_shim, amp_shim.amp, amp_shim.fp16_utils, amp_shim.optimizers, amp_shim.parallel
    from amp_shim.alias import install
    install(force=True)
    import apex
    from apex import amp
    verbosity = int(sys.argv[1])
    for level in ("O1", "O1", "O1"):
        model = torch.nn.Linear(2, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        amp.initialize(model, optimizer, opt_level=level, verbosity=verbosity)
        amp._amp_state.handle._deactivate()
        with warnings.catch_warnings():
            warnings.simplefilter("always")
    amp.half_function(len), amp.float_function(len), amp.promote_function(len)
    """
)


def _run_program(tmp_path: Path, verbosity: int) -> subprocess.CompletedProcess:
    script = tmp_path / "legacy.py"
    script.write_text(PROGRAM)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("PYTHONWARNINGS", None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), str(ROOT / "shim"), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, str(script), str(verbosity)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def legacy_run(tmp_path_factory) -> subprocess.CompletedProcess:
    return _run_program(tmp_path_factory.mktemp("legacy"), verbosity=1)


def _notice_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if WHAT_RUNS in line]


@pytest.fixture
def notice_not_given(monkeypatch):
    """As in a fresh process: the notice not yet given."""
    monkeypatch.setattr(_deprecation, "_notice_given", False)


@pytest.mark.slow
def test_a_process_gets_one_notice_line_on_stderr_however_many_initialize_calls(legacy_run):
    (line,) = _notice_lines(legacy_run.stderr)
    assert HOW_TO_MIGRATE in line
    assert line == "amp_shim:0: DeprecatedFeatureWarning: " + _deprecation.SHIM_NOTICE
    assert not _notice_lines(legacy_run.stdout)


@pytest.mark.slow
def test_every_process_gets_its_own_single_notice(legacy_run, tmp_path):
    another = _run_program(tmp_path, verbosity=1)
    assert len(_notice_lines(legacy_run.stderr)) == len(_notice_lines(another.stderr)) == 1


@pytest.mark.slow
def test_apex_deprecation_text_is_gone(legacy_run):
    for text in APEX_TEXT:
        assert text not in legacy_run.stderr and text not in legacy_run.stdout


@pytest.mark.slow
def test_apex_option_listing_is_printed_exactly_as_apex_did_for_every_initialize(legacy_run):
    assert legacy_run.stdout == O1_LISTING * 3


@pytest.mark.slow
def test_verbosity_0_silences_the_listing_but_not_the_notice(tmp_path):
    proc = _run_program(tmp_path, verbosity=0)
    assert proc.stdout == ""
    assert len(_notice_lines(proc.stderr)) == 1


def test_the_notice_is_not_a_loss_line_for_log_scrapers():
    assert not LOSS.findall(_deprecation.SHIM_NOTICE)
    assert WHAT_RUNS in _deprecation.SHIM_NOTICE and HOW_TO_MIGRATE in _deprecation.SHIM_NOTICE


def test_the_notice_keeps_apex_category_so_its_filters_and_pytest_warns_still_apply(notice_not_given):
    with pytest.warns(DeprecatedFeatureWarning, match="runs Apex's amp API on amp_shim"):
        amp.initialize(torch.nn.Linear(2, 2), verbosity=0)


def test_a_filter_set_against_apex_deprecation_silences_the_notice(notice_not_given, recwarn):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecatedFeatureWarning)
        amp.initialize(torch.nn.Linear(2, 2), verbosity=0)
    assert not [w for w in recwarn if issubclass(w.category, DeprecatedFeatureWarning)]


def test_a_decorator_gives_the_notice_when_it_is_the_first_amp_call(notice_not_given):
    with pytest.warns(DeprecatedFeatureWarning, match="runs Apex's amp API on amp_shim"):
        amp.float_function(len)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecatedFeatureWarning)
        amp.half_function(len)  # already given in this process
        amp.initialize(torch.nn.Linear(2, 2), verbosity=0)
