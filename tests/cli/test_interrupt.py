"""Ctrl-C in the middle of a large run leaves every file either fully old or fully new."""

import os
import signal
import subprocess
import sys
import time

import pytest

from amp_migrate import migrate_source

TEMPLATES = [
    "from apex import amp\nmodel, optimizer = amp.initialize(model, optimizer)\n",
    "import apex\nfrom apex import amp\n\n\ndef f(loss, optimizer):\n"
    "    with amp.scale_loss(loss, optimizer) as s:\n        s.backward()\n" + "# padding\n" * 200,
    "from apex.fp16_utils import FP16_Optimizer\r\nopt = FP16_Optimizer(opt)\r\n",
]
FILES = 400


@pytest.mark.slow
def test_sigint_mid_run_leaves_each_file_old_or_new(tmp_path, ctrl_c_as_from_a_terminal):
    old = {}
    for i in range(FILES):
        path = tmp_path / f"pkg{i % 10}" / f"mod{i:03d}.py"
        path.parent.mkdir(exist_ok=True)
        old[path] = TEMPLATES[i % len(TEMPLATES)].encode()
        path.write_bytes(old[path])
    new = {
        text.encode(): migrate_source(text.replace("\r\n", "\n"), target="shim")
        .code.replace("\n", "\r\n" if "\r\n" in text else "\n")
        .encode()
        for text in TEMPLATES
    }
    assert all(new[t] != t for t in new)

    proc = subprocess.Popen(
        [sys.executable, "-m", "amp_migrate", "--target", "shim", "--jobs", "2", "."],
        cwd=tmp_path,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )  # its own process group, as a terminal's Ctrl-C reaches it
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        if any(path.read_bytes() != data for path, data in old.items()):
            break
        time.sleep(0.05)
    time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=60)

    assert proc.returncode == 130, (proc.returncode, out[-2000:], err[-2000:])
    assert b"Interrupted" in err and b"Traceback" not in err
    states = []
    for path, data in old.items():
        content = path.read_bytes()
        assert content in (data, new[data]), path
        compile(content, str(path), "exec")
        states.append(content == data)
    assert any(states) and not all(states), "the run was not interrupted in the middle"
    assert not [p for p in tmp_path.rglob("*") if p.name.startswith(".")], "temporary files left behind"
