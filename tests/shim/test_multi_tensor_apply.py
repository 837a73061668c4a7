"""`apex.multi_tensor_apply.multi_tensor_applier` and the torch versions of the amp_C kernels
that user code drives through it (apex_api.md §15)."""
import torch

from amp_shim.multi_tensor_apply import (
    MultiTensorApply,
    multi_tensor_applier,
    multi_tensor_axpby,
    multi_tensor_l2norm,
    multi_tensor_scale,
)


def test_applier_calls_the_op_with_apex_chunk_size_and_arguments():
    seen = []
    result = multi_tensor_applier(lambda *args: seen.append(args) or "ret", "flag", [[1]], 2.0)
    assert result == "ret" and seen == [(2048 * 32, "flag", [[1]], 2.0)]
    assert MultiTensorApply.available and multi_tensor_applier.check_avail() is None


def test_scale_writes_dst_and_flags_non_finite_sources_without_clearing_the_flag():
    flag = torch.zeros(1, dtype=torch.int)
    src = [torch.tensor([1.0, 2.0]), torch.tensor([4.0], dtype=torch.float16)]
    dst = [torch.empty(2, dtype=torch.float16), torch.empty(1)]
    multi_tensor_applier(multi_tensor_scale, flag, [src, dst], 0.5)
    assert dst[0].tolist() == [0.5, 1.0] and dst[1].tolist() == [2.0] and flag.item() == 0
    assert src[0].tolist() == [1.0, 2.0]  # the source is untouched
    multi_tensor_applier(multi_tensor_scale, flag, [[torch.tensor([float("inf")])], [torch.empty(1)]], 1.0)
    assert flag.item() == 1
    multi_tensor_applier(multi_tensor_scale, flag, [src, dst], 1.0)
    assert flag.item() == 1


def test_axpby_checks_only_the_requested_argument():
    flag = torch.zeros(1, dtype=torch.int)
    x, y, out = [torch.tensor([1.0])], [torch.tensor([float("nan")])], [torch.empty(1)]
    multi_tensor_applier(multi_tensor_axpby, flag, [x, y, out], 2.0, 3.0, 0)
    assert flag.item() == 0
    multi_tensor_applier(multi_tensor_axpby, flag, [x, [torch.tensor([1.0])], out], 2.0, 3.0, -1)
    assert out[0].item() == 5.0
    multi_tensor_applier(multi_tensor_axpby, flag, [x, y, out], 2.0, 3.0, 1)
    assert flag.item() == 1


def test_l2norm_returns_the_global_and_per_tensor_norms():
    flag = torch.zeros(1, dtype=torch.int)
    tensors = [torch.tensor([3.0, 4.0]), torch.tensor([12.0], dtype=torch.float16)]
    total, per = multi_tensor_applier(multi_tensor_l2norm, flag, [tensors], True)
    assert total.tolist() == [13.0] and per.tolist() == [5.0, 12.0]
    total, per = multi_tensor_applier(multi_tensor_l2norm, flag, [tensors])
    assert per.numel() == 0
