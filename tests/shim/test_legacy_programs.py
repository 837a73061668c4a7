"""Realistic legacy Apex programs (fixtures/programs/) run unchanged through `python -m amp_shim`.

The DDP program runs under real torchrun (2 processes, gloo on 127.0.0.1), launched both ways:
`python -m amp_shim -- torchrun ... script.py` (the alias reaches the workers, which run the
script as plain `python script.py`, through AMP_SHIM_ALIAS and the start-up hook) and
`torchrun ... -m amp_shim script.py` (each worker installs the alias itself).
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from forked_runs import launch

ROOT = Path(__file__).resolve().parents[2]
PROGRAMS = ROOT / "fixtures" / "programs"
SKIP = "Gradient overflow.  Skipping step, loss scaler {} reducing loss scale to {}"


def _env():
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "shim"), env.get("PYTHONPATH")]))
    return env


def _run(args, cwd, timeout=60):
    proc = subprocess.run(
        [sys.executable, *args], cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def _run_on_the_shim(args, cwd) -> str:
    """`python -m amp_shim ARGS` in `cwd`, forked from a fork server that already imported torch
    (tests/forked_runs.py: what a fresh interpreter would record); its stdout."""
    rc, stdout, stderr = launch([str(a) for a in args], shim=True, env=_env(), cwd=cwd, timeout=60)
    assert rc == 0, stdout[-3000:] + stderr[-3000:]
    return stdout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- ImageNet-style, DDP over 2 ranks ------------------------------------------------------------
def _torchrun(tmp_path, launch, *script_args):
    torchrun = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "1",
        "--nproc-per-node",
        "2",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(_free_port()),
        "--tee",
        "3",
    ]
    script = [
        str(PROGRAMS / "imagenet_style_ddp.py"),
        "--save-params",
        str(tmp_path / "params"),
        *script_args,
    ]
    if launch == "alias-env":  # the alias travels to the workers, which run `python script.py`
        args = ["-m", "amp_shim", "--", *torchrun, *script]
    else:  # each worker is `python -m amp_shim script.py`
        args = [*torchrun[1:], "-m", "amp_shim", *script]
    proc = _run(args, tmp_path, timeout=90)
    per_rank = {0: [], 1: []}
    for line in proc.stdout.splitlines():  # torchrun --tee prefixes "[default<rank>]:"
        m = re.match(r"\[default(\d)\]:(.*)", line)
        if m:
            per_rank[int(m.group(1))].append(m.group(2))
    states = [torch.load(tmp_path / f"params.rank{r}.pt") for r in (0, 1)]
    return per_rank, states


def _losses(lines):
    return [float(v) for v in re.findall(r"Loss (\S+)", "\n".join(lines))]


@pytest.mark.slow
@pytest.mark.parametrize(
    "launch, amp_args",
    [
        ("alias-env", ["--opt-level", "O1"]),
        (
            "torchrun-m-amp_shim",
            ["--opt-level", "O2", "--keep-batchnorm-fp32", "True", "--loss-scale", "dynamic"],
        ),
    ],
    ids=["O1-amp_shim-wraps-torchrun", "O2-string-overrides-torchrun-runs-amp_shim"],
)
def test_imagenet_style_ddp_trains_on_two_ranks_and_an_inf_on_one_rank_skips_both(tmp_path, launch, amp_args):
    per_rank, (rank0, rank1) = _torchrun(
        tmp_path,
        launch,
        *amp_args,
        "--sync_bn",
        "--steps",
        "20",
        "--inject-inf-step",
        "5",
        "--inject-inf-rank",
        "1",
    )
    # trains: the (all-reduced) loss falls
    losses = _losses(per_rank[0])
    assert len(losses) == 20 and losses[5] == float("inf")
    assert losses[-1] < 0.5 * losses[0], losses
    # the inf on rank 1 skips step 5 on both ranks, each printing Apex's message once
    for r in (0, 1):
        assert [line for line in per_rank[r] if "Gradient overflow" in line] == [SKIP.format(0, 32768.0)]
        assert (
            f"rank {r} amp state: OrderedDict([('loss_scaler0', {{'loss_scale': 32768.0, 'unskipped': 14}})])"
        ) in per_rank[r]
    # ranks end identical: parameters and (SyncBatchNorm) running statistics
    assert list(rank0) == list(rank1) and list(rank0)[0].startswith("module.")
    for key in rank0:
        assert torch.equal(rank0[key], rank1[key]), key
    assert "module.bn1.running_mean" in rank0


@pytest.mark.slow
def test_imagenet_style_ddp_runs_as_a_single_process_too(tmp_path):
    stdout = _run_on_the_shim(
        [
            str(PROGRAMS / "imagenet_style_ddp.py"),
            "--opt-level",
            "O1",
            "--steps",
            "12",
            "--loss-scale",
            "128.0",
        ],
        tmp_path,
    )
    losses = _losses(stdout.splitlines())
    assert len(losses) == 12 and losses[-1] < losses[0]
    assert "{'loss_scale': 128.0, 'unskipped': 12}" in stdout


# -- DCGAN-style: two models, two optimizers, three losses ----------------------------------
def _dcgan(tmp_path, *args):
    stdout = _run_on_the_shim([PROGRAMS / "dcgan_style.py", *args], tmp_path)
    iterations, pending = [], []
    for line in stdout.splitlines():  # a skip message prints at the step of its iteration
        if line.startswith("Gradient overflow"):
            pending.append(line)
        m = re.match(
            r"\[(\d+)/\d+\] Loss_D: (\S+) Loss_G: (\S+) D\(x\): (\S+) D\(G\(z\)\): (\S+) / (\S+)", line
        )
        if m:
            iterations.append(
                {
                    "line": line,
                    "skips": pending,
                    "loss_d": float(m.group(2)),
                    "d_x": m.group(4),
                    "d_g_z": (m.group(5), m.group(6)),
                }
            )
            pending = []
    state = eval(re.search(r"amp state: (\{.*\})", stdout).group(1))
    distance = [float(v) for v in re.search(r"distance to real: (\S+) -> (\S+)", stdout).groups()]
    return iterations, state, distance


@pytest.fixture(scope="module")
def dcgan_clean(tmp_path_factory):
    return _dcgan(tmp_path_factory.mktemp("dcgan"))


@pytest.mark.slow
def test_dcgan_style_trains_with_three_loss_scalers(dcgan_clean):
    iterations, state, (start, end) = dcgan_clean
    assert len(iterations) == 40
    first = sum(it["loss_d"] for it in iterations[:5]) / 5
    last = sum(it["loss_d"] for it in iterations[-5:]) / 5
    assert last < 0.8 * first  # the discriminator learns to tell real from fake
    assert end < start  # the generator moves toward the real images
    assert sorted(state) == ["loss_scaler0", "loss_scaler1", "loss_scaler2"]
    # each loss has its own scale: halved once per overflow of that loss alone
    for loss_id in range(3):
        overflows = sum(f"loss scaler {loss_id} " in s for it in iterations for s in it["skips"])
        assert state[f"loss_scaler{loss_id}"]["loss_scale"] == 65536.0 / 2**overflows


@pytest.mark.slow
def test_dcgan_style_an_inf_in_the_generator_loss_skips_only_the_generator_step(tmp_path, dcgan_clean):
    clean, _, _ = dcgan_clean
    step = next(i for i in range(8, 20) if not clean[i]["skips"] and not clean[i + 1]["skips"])
    poisoned, state, _ = _dcgan(tmp_path, "--inject-inf-loss", "2", "--inject-inf-step", str(step))
    assert [it["line"] for it in poisoned[:step]] == [it["line"] for it in clean[:step]]
    assert poisoned[step]["skips"] == [SKIP.format(2, 32768.0)]
    # D stepped as usual in that iteration (same D(x) next), G did not (different fakes next)
    assert poisoned[step + 1]["d_x"] == clean[step + 1]["d_x"]
    assert poisoned[step + 1]["d_g_z"] != clean[step + 1]["d_g_z"]
