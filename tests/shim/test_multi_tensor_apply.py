"""`apex.multi_tensor_apply.multi_tensor_applier`: Apex's dispatcher, always available in the
shim (the kernels it drives are `amp_shim.amp_C`, tested in test_amp_c.py)."""

from amp_shim.multi_tensor_apply import MultiTensorApply, multi_tensor_applier


def test_applier_calls_the_op_with_apex_chunk_size_and_arguments():
    seen = []
    result = multi_tensor_applier(lambda *args: seen.append(args) or "ret", "flag", [[1]], 2.0)
    assert result == "ret" and seen == [(2048 * 32, "flag", [[1]], 2.0)]
    assert MultiTensorApply.available and multi_tensor_applier.check_avail() is None


def test_an_applier_of_another_chunk_size_passes_its_own():
    seen = []
    MultiTensorApply(333)(lambda *args: seen.append(args[0]), None, [[]])
    assert seen == [333]
