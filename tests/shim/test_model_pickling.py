"""A model returned by `amp.initialize` can be saved whole, pickled and deep-copied.

Apex users save models with `torch.save(model)` and copy them for EMA or evaluation; what the
shim attaches to a model (O1's forward hooks, O2/O3's casting forward, the output cast of
`cast_model_outputs`) must survive that round trip and behave in the copy as on the original.
"""

from __future__ import annotations

import copy
import io
import pickle
import threading

import pytest
import torch
from torch import nn

from amp_shim import amp
from amp_shim.amp.autocast_casts import shim_dtype

OPT_LEVELS = ["O0", "O1", "O2", "O3"]


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 6)
        self.bn = nn.BatchNorm1d(6)
        self.fc2 = nn.Linear(6, 3)

    def forward(self, x):
        return self.fc2(torch.relu(self.bn(self.fc1(x))))


def _initialized(opt_level: str, n_models: int = 1, **kwargs):
    torch.manual_seed(0)
    models = [Net().eval() for _ in range(n_models)]
    params = [p for m in models for p in m.parameters()]
    optimizer = torch.optim.SGD(params, lr=0.1)
    models, _ = amp.initialize(models, optimizer, opt_level=opt_level, verbosity=0, **kwargs)
    return models


def _batch() -> torch.Tensor:
    return torch.randn(5, 8, generator=torch.Generator().manual_seed(1))


def _torch_save_load(obj):
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


def _pickle_round_trip(obj):
    return pickle.loads(pickle.dumps(obj))


ROUND_TRIPS = {
    "torch_save": _torch_save_load,
    "pickle": _pickle_round_trip,
    "deepcopy": copy.deepcopy,
}


def _assert_same_forward(original: nn.Module, restored: nn.Module) -> None:
    """Same output, from the restored model's own weights (not through the original's)."""
    x = _batch()
    with torch.no_grad():
        expected, got = original(x), restored(x)
        assert got.dtype == expected.dtype
        assert torch.equal(got, expected)
        for p in original.parameters():
            p.zero_()
        assert not torch.equal(original(x), expected)
        assert torch.equal(restored(x), expected)


def _in_thread(fn):
    result = {}
    thread = threading.Thread(target=lambda: result.setdefault("value", fn()))
    thread.start()
    thread.join()
    return result["value"]


@pytest.mark.parametrize("round_trip", sorted(ROUND_TRIPS))
@pytest.mark.parametrize("opt_level", OPT_LEVELS)
def test_initialized_model_round_trips_with_same_output(opt_level, round_trip):
    (model,) = _initialized(opt_level)
    restored = ROUND_TRIPS[round_trip](model)
    _assert_same_forward(model, restored)


@pytest.mark.parametrize("round_trip", sorted(ROUND_TRIPS))
@pytest.mark.parametrize("opt_level", OPT_LEVELS)
def test_model_with_cast_model_outputs_round_trips_with_same_output_dtype(opt_level, round_trip):
    (model,) = _initialized(opt_level, cast_model_outputs=torch.float16)
    restored = ROUND_TRIPS[round_trip](model)
    _assert_same_forward(model, restored)
    with torch.no_grad():
        assert restored(_batch()).dtype == torch.float16


@pytest.mark.parametrize("round_trip", sorted(ROUND_TRIPS))
@pytest.mark.parametrize("opt_level", OPT_LEVELS)
def test_several_models_saved_together_round_trip(opt_level, round_trip):
    models = _initialized(opt_level, n_models=2)
    restored = ROUND_TRIPS[round_trip](models)
    assert len(restored) == 2
    for original, copied in zip(models, restored):
        _assert_same_forward(original, copied)


@pytest.mark.parametrize("round_trip", sorted(ROUND_TRIPS))
def test_o1_copy_casts_in_other_threads_like_the_original(round_trip):
    (model,) = _initialized("O1")
    restored = ROUND_TRIPS[round_trip](model)

    def run(m):
        with torch.no_grad():
            return m(_batch())

    from_original = _in_thread(lambda: run(model))
    from_copy = _in_thread(lambda: run(restored))
    assert from_original.dtype == shim_dtype("cpu")
    assert from_copy.dtype == from_original.dtype
    assert torch.equal(from_copy, from_original)


def test_o1_copy_stops_casting_when_o1_is_switched_off():
    from amp_shim.amp._amp_state import _amp_state

    (model,) = _initialized("O1")
    restored = _torch_save_load(model)
    _amp_state.handle._deactivate()
    with torch.no_grad():
        from_original = _in_thread(lambda: model(_batch()))
        from_copy = _in_thread(lambda: restored(_batch()))
    assert from_original.dtype == torch.float32
    assert from_copy.dtype == torch.float32
