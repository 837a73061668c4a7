"""The native form of Apex's cast registry runs, and gives the dtypes Apex's O1 gave.

The golden case `casts/casts_device_cpu` is migrated for CPU; its output is executed with a
stand-in for the user module it registers functions of, and called under
`torch.autocast("cpu", dtype=torch.float16)`. Each function is chosen so that plain autocast
would give a different dtype than Apex did, so a wrapper that did nothing would fail:
float functions compute in fp32 from fp16 inputs, half functions in fp16 from fp32 inputs,
promote functions in the widest dtype of their inputs, and `disable_casts` bodies in fp32.
Outside autocast nothing is cast.
"""

from __future__ import annotations

import sys
import types

import pytest
import torch

from amp_migrate import migrate_source

from .golden import ROOT

CASE = ROOT / "casts" / "casts_device_cpu.py"
AUTOGRAD_CASE = ROOT / "casts" / "float_function_decorator_on_autograd_function.py"
F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32


def _user_ops() -> types.ModuleType:
    ops = types.ModuleType("ops")
    ops.float_fn = lambda x, w: x @ w  # autocast alone: fp16
    ops.half_fn = lambda x, w: x * w  # autocast alone: the inputs' dtype
    ops.promote_fn = lambda x, w: x @ w  # autocast alone: fp16
    return ops


def _run(code: str, monkeypatch: pytest.MonkeyPatch) -> dict:
    """Execute migrated code as a module, with `ops` importable; its globals and the ops."""
    ops = _user_ops()
    monkeypatch.setitem(sys.modules, "ops", ops)
    namespace: dict = {"__name__": "migrated"}
    exec(compile(code, "<migrated>", "exec"), namespace)
    namespace["ops"] = ops
    return namespace


@pytest.fixture
def migrated(monkeypatch: pytest.MonkeyPatch) -> dict:
    result = migrate_source(CASE.read_text(), target="native", device="cpu")
    assert result.target_used == "native", result.diagnostics
    assert result.code == CASE.with_name(CASE.stem + ".native.py").read_text()
    return _run(result.code, monkeypatch)


def _pair(dtype_x: torch.dtype, dtype_w: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    return torch.randn(4, 4, dtype=dtype_x), torch.randn(4, 4, dtype=dtype_w)


def test_plain_autocast_would_differ_from_apex():
    """The premise: without the wrappers, CPU autocast gives other dtypes than Apex O1."""
    ops = _user_ops()
    with torch.autocast("cpu", dtype=F16):
        assert ops.float_fn(*_pair(F16, F16)).dtype == F16
        assert ops.half_fn(*_pair(F32, F32)).dtype == F32
        assert ops.promote_fn(*_pair(F16, F32)).dtype == F16


def test_registered_functions_under_autocast(migrated):
    ops = migrated["ops"]
    with torch.autocast("cpu", dtype=F16):
        assert ops.float_fn(*_pair(F16, F16)).dtype == F32
        assert ops.half_fn(*_pair(F32, F32)).dtype == F16
        assert ops.promote_fn(*_pair(F16, F32)).dtype == F32
        assert ops.promote_fn(*_pair(F16, F16)).dtype == F16
        assert ops.promote_fn(*_pair(BF16, F16)).dtype == F32


@pytest.mark.slow
def test_registered_float_function_matches_fp32_math(migrated):
    x, w = _pair(F16, F16)
    with torch.autocast("cpu", dtype=F16):
        out = migrated["ops"].float_fn(x, w)
    torch.testing.assert_close(out, x.float() @ w.float(), rtol=0, atol=0)


def test_decorated_functions_under_autocast(migrated):
    with torch.autocast("cpu", dtype=F16):
        assert migrated["decorated_float"](*_pair(F16, F16)).dtype == F32
        assert migrated["decorated_half"](*_pair(F32, F32)).dtype == F16
        assert migrated["decorated_promote"](*_pair(F16, F32)).dtype == F32
    assert migrated["decorated_float"].__name__ == "decorated_float"


def test_disable_casts_body_runs_in_fp32(migrated):
    with torch.autocast("cpu", dtype=F16):
        assert (_pair(F32, F32)[0] @ _pair(F32, F32)[1]).dtype == F16
        assert migrated["exact_matmul"](*_pair(F32, F32)).dtype == F32
        assert torch.is_autocast_enabled("cpu")


def test_nothing_is_cast_outside_autocast(migrated):
    ops = migrated["ops"]
    assert ops.float_fn(*_pair(F16, F16)).dtype == F16
    assert ops.half_fn(*_pair(F32, F32)).dtype == F32
    assert ops.promote_fn(*_pair(F32, F32)).dtype == F32
    assert migrated["decorated_half"](*_pair(F32, F32)).dtype == F32
    assert migrated["exact_matmul"](*_pair(F16, F16)).dtype == F16


def test_non_tensor_and_sequence_arguments(migrated):
    cast_inputs = migrated["_cast_inputs"]
    seen = {}

    def fn(xs, scale, *, bias=None, name="n"):
        seen.update(xs=[x.dtype for x in xs], scale=scale, bias=bias.dtype, name=name)
        return xs[0]

    wrapped = cast_inputs("cpu", torch.float16)(fn)
    with torch.autocast("cpu", dtype=F16):
        wrapped(
            [torch.ones(2), torch.ones(2, dtype=torch.float64), torch.ones(2, dtype=torch.int64)],
            3,
            bias=torch.ones(2),
            name="x",
        )
    assert seen == {"xs": [F16, F16, torch.int64], "scale": 3, "bias": F16, "name": "x"}


@pytest.mark.slow
def test_half_means_bfloat16_under_dtype_bfloat16(monkeypatch):
    result = migrate_source(CASE.read_text(), target="native", device="cpu", dtype="bfloat16")
    assert "torch.bfloat16" in result.code and "torch.float16" not in result.code
    migrated = _run(result.code, monkeypatch)
    with torch.autocast("cpu", dtype=BF16):
        assert migrated["ops"].half_fn(*_pair(F32, F32)).dtype == BF16
        assert migrated["ops"].float_fn(*_pair(BF16, BF16)).dtype == F32


@pytest.mark.slow
def test_autograd_function_forward_runs_in_fp32_and_backpropagates(monkeypatch):
    result = migrate_source(AUTOGRAD_CASE.read_text(), target="native", device="cpu")
    assert '@torch.amp.custom_fwd(device_type="cpu", cast_inputs=torch.float32)' in result.code
    migrated = _run(result.code, monkeypatch)
    x = torch.randn(3, 5, dtype=F16, requires_grad=True)
    with torch.autocast("cpu", dtype=F16):
        out = migrated["LogSumExp"].apply(x)
    assert out.dtype == F32
    out.sum().backward()
    assert x.grad is not None and x.grad.dtype == F16
    torch.testing.assert_close(x.grad.float(), torch.softmax(x.detach().float(), -1), rtol=1e-3, atol=1e-3)
