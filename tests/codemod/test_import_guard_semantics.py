"""Native output without the Apex import guards runs as the legacy file ran with Apex installed.

Each golden case under `imports/guard_*` is migrated for CPU and executed with a small model:
the handlers that reported a missing Apex never print, the flags they cleared read as they did
when Apex imported, an `else:` arm that moved out of its `try:` still runs (once, before the code
after it), a `finally:` arm still runs, a handler that was kept still defines what the file
calls, and no read finds a name unbound.
"""

from __future__ import annotations

import contextlib
import io

import pytest
import torch

from amp_migrate import migrate_source

from .golden import ROOT

CASES = {
    # case: (what the file itself prints, in order; the globals it leaves)
    "guard_bare_except_prints_and_clears_flag": ([], {"mixed_precision": True}),
    "guard_except_import_error_prints": ([], {}),
    "guard_except_tuple_as_e_logs": ([], {}),
    "guard_except_exception_warns_one_line": ([], {}),
    "guard_handler_exits": ([], {}),
    "guard_else_arm_runs_in_place": (["apex found"], {"USE_AMP": True}),
    "guard_flag_set_in_body_read_later": (
        ["mixed precision available: True", "trained with amp"],
        {"APEX_AVAILABLE": True},
    ),
    "guard_else_and_finally_keep_try": (["apex found", "import check done"], {}),
    "guard_finally_without_else_runs_in_place": (["import check done", "True"], {"HAS_APEX": True}),
    "guard_handler_defines_fallback_stays": (["fused kernels: True"], {}),
}


def _training_globals() -> dict:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    return {
        "__name__": "migrated",
        "model": model,
        "optimizer": torch.optim.SGD(model.parameters(), lr=0.1),
        "data": [(torch.randn(2, 4), torch.randn(2, 4)) for _ in range(2)],
        "criterion": torch.nn.functional.mse_loss,
    }


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.slow
def test_native_output_runs_as_the_file_did_with_apex_installed(case: str):
    printed, flags = CASES[case]
    result = migrate_source((ROOT / "imports" / f"{case}.py").read_text(), target="native", device="cpu")
    assert result.target_used == "native", result.diagnostics
    namespace = _training_globals()
    before = namespace["model"].weight.detach().clone()
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        exec(compile(result.code, f"<{case}>", "exec"), namespace)
        if "train" in namespace:
            namespace["train"](
                namespace["model"], namespace["optimizer"], namespace["data"], namespace["criterion"]
            )
    assert out.getvalue().splitlines() == printed
    assert {name: namespace[name] for name in flags} == flags
    model = namespace["model"]
    assert not torch.equal(model.weight.detach(), before), "the training loop did not run"
