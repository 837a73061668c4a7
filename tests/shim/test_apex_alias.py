"""Legacy code that says `from apex import amp` runs unchanged through `python -m amp_shim`."""
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "fixtures" / "examples" / "legacy_project" / "train.py"


def run(args, cwd, extra_env=None):
    env = dict(os.environ, OMP_NUM_THREADS="1", **(extra_env or {}))
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True)


def test_bundled_legacy_example_trains_through_the_shim(tmp_path):
    proc = run(["-m", "amp_shim", str(EXAMPLE), "--steps", "30"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "running with the Apex-compatible shim" in proc.stderr
    losses = [float(v) for v in re.findall(r"loss (\d+\.\d+)", proc.stdout)]
    assert len(losses) == 4 and losses[-1] < 0.5 * losses[0]
    assert "'loss_scaler0': {'loss_scale': 65536.0, 'unskipped': 30}" in proc.stdout


def test_alias_resolves_apex_modules_to_the_shim(tmp_path):
    script = tmp_path / "probe.py"
    script.write_text(
        "import sys\n"
        "import apex\n"
        "from apex import amp\n"
        "import apex.amp.scaler as S\n"
        "from apex.amp import _amp_state\n"
        "import amp_shim.amp, amp_shim.amp.scaler\n"
        "assert amp is amp_shim.amp and S is amp_shim.amp.scaler\n"
        "assert _amp_state is amp_shim.amp._amp_state\n"
        "assert sys.argv == [sys.argv[0], 'x', '--y'] and __name__ == '__main__'\n"
        "print('ok')\n"
    )
    proc = run(["-m", "amp_shim", str(script), "x", "--y"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


def test_a_real_apex_wins_unless_forced(tmp_path):
    fake = tmp_path / "site" / "apex" / "amp"
    fake.mkdir(parents=True)
    (fake.parent / "__init__.py").write_text("REAL = True\n")
    (fake / "__init__.py").write_text("")
    script = tmp_path / "probe.py"
    script.write_text("import apex\nprint(getattr(apex, 'REAL', False))\n")
    env = {"PYTHONPATH": str(tmp_path / "site")}
    assert run(["-m", "amp_shim", str(script)], tmp_path, env).stdout.strip() == "True"
    forced = run(["-m", "amp_shim", "--force", str(script)], tmp_path, env)
    assert forced.stdout.strip() == "False", forced.stderr
