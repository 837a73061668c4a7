"""Run an engine op on the torch path and on the emulated kernels, from identical inputs."""

from __future__ import annotations

import contextlib
import os
from typing import Callable, Iterator

import torch


@contextlib.contextmanager
def kernels_env(mode: str) -> Iterator[None]:
    old = os.environ.get("AMP_SHIM_KERNELS")
    os.environ["AMP_SHIM_KERNELS"] = mode
    try:
        yield
    finally:
        if old is None:
            del os.environ["AMP_SHIM_KERNELS"]
        else:
            os.environ["AMP_SHIM_KERNELS"] = old


def clone_tree(obj):
    if isinstance(obj, torch.Tensor):
        return obj.clone()
    if isinstance(obj, (list, tuple)):
        return type(obj)(clone_tree(o) for o in obj)
    return obj


def flatten(obj) -> list:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for o in obj for t in flatten(o)]
    return []


def run_both(emulated, config: dict, op: Callable, inputs):
    """(torch-path inputs after op, its result, kernel-path inputs after op, its result, backend)."""
    torch_inputs, kernel_inputs = clone_tree(inputs), clone_tree(inputs)
    with kernels_env("torch"):
        torch_out = op(*torch_inputs)
    with emulated(**config) as backend:
        kernel_out = op(*kernel_inputs)
    return torch_inputs, torch_out, kernel_inputs, kernel_out, backend
