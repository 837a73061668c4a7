"""`amp_shim.normalization`: Apex's fused norms are torch's LayerNorm/RMSNorm
with Apex's arguments, defaults, output dtypes and checkpoint keys."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from amp_shim import normalization
from amp_shim.normalization import FusedLayerNorm, FusedRMSNorm, MixedFusedLayerNorm, MixedFusedRMSNorm
from amp_shim.normalization import fused_layer_norm as fln


def _x(*shape, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0)).to(dtype)


def test_apex_normalization_exports_apexs_four_modules():
    assert normalization.__all__ == [
        "FusedLayerNorm",
        "FusedRMSNorm",
        "MixedFusedLayerNorm",
        "MixedFusedRMSNorm",
    ]


@pytest.mark.parametrize(
    "shape, kwargs",
    [
        (8, {}),
        ([4, 8], {"eps": 1e-3}),
        (torch.Size([8]), {"elementwise_affine": False}),
        (8, {"memory_efficient": True}),
    ],
)
def test_fused_layer_norm_equals_torch_layer_norm_forward_and_backward(shape, kwargs):
    torch.manual_seed(1)
    apex_kwargs = dict(kwargs)
    memory_efficient = apex_kwargs.pop("memory_efficient", False)
    ours = FusedLayerNorm(shape, memory_efficient=memory_efficient, **apex_kwargs)
    ref = nn.LayerNorm(shape, **{"eps": 1e-5, **apex_kwargs})
    assert isinstance(ours, nn.LayerNorm) and ours.eps == ref.eps
    if ours.weight is not None:
        with torch.no_grad():
            for p, q in zip(ours.parameters(), ref.parameters()):
                p.uniform_(), q.copy_(p)
    x1, x2 = _x(3, 4, 8).requires_grad_(), _x(3, 4, 8).requires_grad_()
    out1, out2 = ours(x1), ref(x2)
    assert torch.equal(out1, out2)
    out1.pow(2).sum().backward(), out2.pow(2).sum().backward()
    assert torch.equal(x1.grad, x2.grad)
    for p, q in zip(ours.parameters(), ref.parameters()):
        assert torch.equal(p.grad, q.grad)


@pytest.mark.parametrize(
    "shape, kwargs", [(8, {}), ([4, 8], {"eps": 1e-3}), (8, {"elementwise_affine": False})]
)
def test_fused_rms_norm_equals_torch_rms_norm_with_apexs_eps(shape, kwargs):
    ours = FusedRMSNorm(shape, **kwargs)
    ref = nn.RMSNorm(shape, **{"eps": 1e-5, **kwargs})
    assert isinstance(ours, nn.RMSNorm) and ours.eps == ref.eps
    if ours.weight is not None:
        with torch.no_grad():
            ours.weight.uniform_(), ref.weight.copy_(ours.weight)
    x1, x2 = _x(3, 4, 8).requires_grad_(), _x(3, 4, 8).requires_grad_()
    out1, out2 = ours(x1), ref(x2)
    assert torch.equal(out1, out2)
    out1.pow(2).sum().backward(), out2.pow(2).sum().backward()
    assert torch.equal(x1.grad, x2.grad)


def test_module_eps_defaults_to_1e_5_while_torch_rmsnorm_would_use_machine_epsilon():
    assert FusedLayerNorm(4).eps == FusedRMSNorm(4).eps == 1e-5
    assert MixedFusedLayerNorm(4).eps == MixedFusedRMSNorm(4).eps == 1e-5
    assert nn.RMSNorm(4).eps is None  # why the shim always passes eps
    x = _x(2, 4) * 1e-3  # tiny activations: eps decides the output
    assert not torch.allclose(FusedRMSNorm(4)(x), nn.RMSNorm(4)(x))


def test_functional_forms_default_to_eps_1e_6_and_keep_apexs_argument_order():
    x, w, b = _x(3, 8), torch.rand(8), torch.randn(8)
    assert torch.equal(fln.fused_layer_norm_affine(x, w, b, [8]), F.layer_norm(x, (8,), w, b, 1e-6))
    assert torch.equal(fln.fused_layer_norm(x, 8), F.layer_norm(x, (8,), None, None, 1e-6))
    assert torch.equal(fln.fused_rms_norm_affine(x, w, (8,)), F.rms_norm(x, (8,), w, 1e-6))
    assert torch.equal(fln.fused_rms_norm(x, 8), F.rms_norm(x, (8,), None, 1e-6))
    assert fln.mixed_dtype_fused_layer_norm_affine(x.half(), w, b, 8).dtype == torch.float32
    assert fln.mixed_dtype_fused_rms_norm_affine(x.half(), w, 8).dtype == torch.float32


def test_functional_forms_run_on_the_autocast_dtype_like_apexs():
    x, w, b = _x(3, 8), torch.rand(8), torch.randn(8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert fln.fused_layer_norm_affine(x, w, b, 8).dtype == torch.bfloat16
        assert fln.fused_rms_norm_affine(x, w, 8).dtype == torch.bfloat16


def test_fused_norms_return_the_input_dtype_and_mixed_ones_the_parameter_dtype():
    x = _x(3, 8, dtype=torch.float16)
    assert FusedLayerNorm(8)(x).dtype == torch.float16
    assert FusedRMSNorm(8)(x).dtype == torch.float16
    assert MixedFusedLayerNorm(8)(x).dtype == torch.float32
    assert MixedFusedRMSNorm(8)(x).dtype == torch.float32
    half = MixedFusedRMSNorm(8).half()
    assert half(_x(3, 8)).dtype == torch.float16


def test_fused_rms_norm_computes_in_fp32_for_reduced_precision_inputs():
    x = _x(3, 8, dtype=torch.bfloat16)
    expected = fln.manual_rms_norm(x.float(), (8,), None, 1e-5).to(torch.bfloat16)
    assert torch.equal(FusedRMSNorm(8, elementwise_affine=False)(x), expected)


def test_mixed_fused_norms_reject_elementwise_affine_false_and_warn_on_the_argument():
    with pytest.warns(UserWarning, match="does not support `elementwise_affine` argument"):
        MixedFusedLayerNorm(8, elementwise_affine=True)
    with pytest.warns(UserWarning), pytest.raises(RuntimeError, match="elementwise_affine = False"):
        MixedFusedRMSNorm(8, elementwise_affine=False)
    MixedFusedLayerNorm(8, some_megatron_flag=True)  # other keywords are ignored, as in Apex


@pytest.mark.parametrize(
    "ours, theirs",
    [
        (lambda: FusedLayerNorm([2, 4]), lambda: nn.LayerNorm([2, 4])),
        (lambda: MixedFusedLayerNorm(4), lambda: nn.LayerNorm(4)),
        (lambda: FusedRMSNorm(4), lambda: nn.RMSNorm(4)),
        (lambda: MixedFusedRMSNorm(4), lambda: nn.RMSNorm(4)),
    ],
)
def test_checkpoints_load_both_ways_with_torch_norms(ours, theirs):
    a, b = ours(), theirs()
    with torch.no_grad():
        for p in a.parameters():
            p.uniform_()
    assert list(a.state_dict()) == list(b.state_dict())
    b.load_state_dict(a.state_dict())
    a2 = ours()
    a2.load_state_dict(b.state_dict())
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), a2.parameters()))


def test_extra_repr_names_shape_eps_and_affine_like_apex():
    assert "(8,), eps=1e-05, elementwise_affine=True" in repr(FusedRMSNorm(8))
    assert "(8,), eps=1e-05, elementwise_affine=True" in repr(FusedLayerNorm(8))
