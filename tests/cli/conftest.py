"""Helpers for driving the command line: through click's CliRunner (fast, in process) and as
a real subprocess (`python -m amp_migrate`), on tiny files in a temporary folder."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from amp_migrate.cli.main import main

CLI_DOC = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


@pytest.fixture(scope="module")
def schema():
    """The JSON report's schema, as docs/cli.md publishes it."""
    text = CLI_DOC.read_text()
    match = re.search(r"<!-- json-schema -->\n```json\n(.*?)\n```", text, re.S)
    assert match, "docs/cli.md must hold the JSON schema after <!-- json-schema -->"
    return json.loads(match.group(1))


# The shim target rewrites imports only, which is ~20x faster than the native rules; tests
# that are about the command line rather than the rewrite use it.
SHIM_INPUT = "from apex import amp\nmodel, optimizer = amp.initialize(model, optimizer)\n"
SHIM_OUTPUT = "from amp_shim import amp\nmodel, optimizer = amp.initialize(model, optimizer)\n"
NATIVE_INPUT = (
    "import torch\n"
    "from apex import amp\n"
    "\n"
    "def train(model, optimizer, x):\n"
    '    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")\n'
    "    loss = model(x).sum()\n"
    "    with amp.scale_loss(loss, optimizer) as scaled:\n"
    "        scaled.backward()\n"
    "    optimizer.step()\n"
)
NO_APEX = "import torch\n\nprint(torch.ones(2))\n"


def run_cli(args, cwd: Path, input: str | None = None):
    """Run `amp-migrate ARGS` in process, in `cwd`."""
    old = os.getcwd()
    os.chdir(cwd)
    try:
        return CliRunner().invoke(main, [str(a) for a in args], input=input, catch_exceptions=False)
    finally:
        os.chdir(old)


def run_process(args, cwd: Path, **kwargs) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", NO_COLOR="1")
    return subprocess.run(
        [sys.executable, "-m", "amp_migrate", *map(str, args)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        **kwargs,
    )


def write(path: Path, text: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_bytes(text.encode("utf-8"))
    return path


def snapshot(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }


@pytest.fixture
def project(tmp_path) -> Path:
    root = tmp_path / "project"
    root.mkdir()
    return root
