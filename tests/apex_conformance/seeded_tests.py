"""Every Apex L0 test starts from the same random state (a pytest plugin).

Some upstream tests draw from torch's generator without seeding it, and their verdict can depend
on the draw: run_amp's test_loss_scale_decrease forces an overflow by feeding `x * 2**17` through
`x * self.param`, where `param` is `torch.randn(1)` unseeded; when the draw is small (|param|
below about 0.11, one run in ten) the float16 activations stay finite, no step is skipped, and
the loss scale it checks does not fall. The draw, not the shim, decided the verdict. Seeding the
generator before each test makes each verdict the same on every run and independent of which
tests ran before it; tests that seed themselves (in `setUp` or the test body) still do, after
this.
"""

from __future__ import annotations

import torch

#: The seed every test starts from; any fixed value makes the run reproducible.
SEED = 0


def pytest_runtest_setup(item) -> None:
    torch.default_generator.manual_seed(SEED)
