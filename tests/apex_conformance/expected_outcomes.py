"""What each of Apex's L0 tests is expected to do against the shim, and why (a pytest plugin).

Every test passes unless it is named here. A test named here either cannot pass by design (a
strict expected failure whose reason says "docs/differences.md row N", or "adapter artefact"
for what running CUDA tests on the CPU cannot show) or is skipped because the test itself is
wrong (an upstream defect). Tests that upstream skips by itself (two GPUs, a 60 GB GPU,
disabled upstream) are not named here: `UPSTREAM_SKIPS` lists the reasons they may give, and
the runner rejects any other skip.

Strict: an expected failure that starts passing fails the run, so this table cannot go stale.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest


@dataclass(frozen=True)
class Expected:
    outcome: str  # "xfail" or "skip"
    reason: str
    #: Only where the CPU stands in for CUDA (the adapter is active); with CUDA the test runs
    #: as it is, so a CPU-only expectation must not be imposed there.
    cpu_only: bool = True


EXPECTED: dict[str, Expected] = {
    "run_amp/test_multi_tensor_unscale_l2norm.py::TestMultiTensorUnscaleL2Norm::test_fuzz": Expected(
        "skip",
        "upstream defect: compares amp_C's shape-[1] total norm with a 0-dim reference "
        "(torch.testing.assert_close checks shapes), so it fails against Apex's own amp_C",
        cpu_only=False,
    ),
}

#: The reasons upstream's own skips give, and what each means on this machine.
UPSTREAM_SKIPS: dict[str, str] = {
    "more than 1 GPU required": "needs two GPUs",
    "Insufficient cuda memory": "needs a 60 GB GPU",
    "No longer support output fp16 param": "disabled upstream",
    "Disable until 8/1/2019 adam/adamw upstream picked": "disabled upstream",
    "No longer support fuse scaling": "disabled upstream",
    "PyTorch optimizer is not numerically correct for fp16": "disabled upstream",
}


def expectation(nodeid: str, on_cpu: bool) -> Expected | None:
    found = EXPECTED.get(nodeid)
    if found is None or (found.cpu_only and not on_cpu):
        return None
    return found


def pytest_collection_modifyitems(config, items) -> None:
    import torch

    on_cpu = not torch.cuda.is_available()
    for item in items:
        found = expectation(item.nodeid, on_cpu)
        if found is None:
            continue
        if found.outcome == "skip":
            item.add_marker(pytest.mark.skip(reason=found.reason))
        else:
            item.add_marker(pytest.mark.xfail(strict=True, reason=found.reason))
