"""The output is sorted by path and does not depend on the number of worker processes."""

import json
import re

import pytest

from .conftest import NO_APEX, SHIM_INPUT, run_cli, snapshot, write


def make_tree(root):
    for i in range(8):
        write(root / f"pkg{i % 3}" / f"mod_{7 - i}.py", SHIM_INPUT if i % 2 else NO_APEX)
    write(root / "pkg1" / "bad.py", "from apex import amp\nprint 'py2'\n")


@pytest.mark.slow
def test_jobs_1_and_jobs_2_give_identical_output(tmp_path):
    outputs = {}
    for jobs in (1, 2):
        root = tmp_path / f"j{jobs}"
        make_tree(root)
        text = run_cli(["--diff", "--jobs", jobs, "."], root)
        data = run_cli(["--format", "json", "--diff", "--jobs", jobs, "."], root)
        assert text.exit_code == data.exit_code == 2
        document = json.loads(data.stdout)
        del document["summary"]["elapsed_s"]
        outputs[jobs] = (re.sub(r"Time\s+[\d.]+ s", "Time", text.output), document)
        fix = run_cli(["--jobs", jobs, "-q", "."], root)
        outputs[jobs] += (re.sub(r"Time\s+[\d.]+ s", "", fix.output), snapshot(root))
    assert outputs[1] == outputs[2]
    paths = [f["path"] for f in outputs[1][1]["files"]]
    assert paths == sorted(paths) and len(paths) == 5
