"""How far an evaluation outside autocast moves after a native migration (AMP170).

    python bench/eval_precision.py [--out bench/results/eval_precision.json]

Apex O1 cast torch's functions for the whole process, so a script's evaluation ran in float16
like its training forward; the native rewrite puts only the training forward under autocast,
and the evaluation then runs in float32. This runs one small legacy O1 script (an MLP trained
20 steps, then evaluated on held-out data) three ways on CPU with float16 autocast: through the
shim (Apex's behaviour), migrated natively with `--device cpu`, and migrated with its
evaluation wrapped in the `torch.autocast` AMP170 names. It prints the training and held-out
losses of each and the relative difference of the held-out loss, and writes them as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "bench" / "results" / "eval_precision.json"

LEGACY = """\
import torch
import torch.nn as nn
import torch.nn.functional as F
from apex import amp


def evaluate(model, x, y):
    model.eval()
    with torch.no_grad():
        return F.cross_entropy(model(x), y).item()


def main():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    x, y = torch.randn(512, 64), torch.randint(0, 10, (512,))
    x_test, y_test = torch.randn(512, 64), torch.randint(0, 10, (512,))
    for step in range(20):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()
    print("train", repr(loss.item()))
    print("eval", repr(evaluate(model, x_test, y_test)))


main()
"""
EVAL = "        return F.cross_entropy(model(x), y).item()\n"
WRAPPED = (
    '        with torch.autocast("cpu", dtype=torch.float16):\n'
    "            return F.cross_entropy(model(x), y).item()\n"
)


def _run(args: list[str], cwd: Path) -> dict[str, float]:
    env = dict(os.environ, OMP_NUM_THREADS="1", AMP_SHIM_DTYPE="float16")
    proc = subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, check=True
    )
    values = dict(line.split() for line in proc.stdout.splitlines() if line.startswith(("train ", "eval ")))
    return {key: float(value) for key, value in values.items()}


def measure() -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        legacy = work / "legacy.py"
        legacy.write_text(LEGACY)
        shim = _run(["-m", "amp_shim", str(legacy)], work)
        native = work / "native.py"
        native.write_text(LEGACY)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "amp_migrate.cli.main",
                "--device",
                "cpu",
                "--target",
                "native",
                str(native),
            ],
            check=True,
            capture_output=True,
        )
        migrated = _run([str(native)], work)
        assert EVAL in native.read_text(), "the migrated evaluation is not the legacy one"
        native.write_text(native.read_text().replace(EVAL, WRAPPED))
        wrapped = _run([str(native)], work)
    return {
        "shim (Apex O1)": shim,
        "native": migrated,
        "native, evaluation under autocast": wrapped,
        "eval relative difference, native vs shim": abs(migrated["eval"] - shim["eval"]) / abs(shim["eval"]),
        "eval relative difference, wrapped vs shim": abs(wrapped["eval"] - shim["eval"]) / abs(shim["eval"]),
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    found = measure()
    args.out.write_text(json.dumps(found, indent=2) + "\n")
    print(json.dumps(found, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
