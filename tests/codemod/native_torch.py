"""Native output only uses torch API that exists: every `torch.` dotted name resolves on the
installed torch, and every `torch.amp.GradScaler(...)` and `torch.autocast(...)` call binds to
the real signature (test_corpus_invariants.py holds every native golden output to it)."""

from __future__ import annotations

import inspect

import libcst as cst
import libcst.matchers as m
import torch
from libcst.helpers import get_full_name_for_node

CHECKED_CALLS = {
    "torch.amp.GradScaler",
    "torch.autocast",
    "torch.amp.autocast",
    "torch.amp.custom_fwd",
    "torch.amp.custom_bwd",
}


def resolve(dotted: str):
    obj = torch
    for part in dotted.split(".")[1:]:
        obj = getattr(obj, part)
    return obj


def _dotted(node: cst.CSTNode) -> bool:
    """`torch.amp.GradScaler`, not `torch.nn.Linear(2, 2).half`."""
    while isinstance(node, cst.Attribute):
        node = node.value
    return isinstance(node, cst.Name)


def torch_names(module: cst.Module) -> set[str]:
    names = set()
    for node in m.findall(module, m.Attribute()):
        full = get_full_name_for_node(node) if _dotted(node) else None
        if full and full.startswith("torch."):
            names.add(full)
    return names


class _Any:
    """Stands in for an argument expression: only the call's shape is checked."""


def torch_calls(module: cst.Module):
    for call in m.findall(module, m.Call()):
        name = get_full_name_for_node(call.func)
        if name in CHECKED_CALLS:
            yield name, call


def torch_name_problems(code: str) -> list[str]:
    """Every `torch.` dotted name in `code` that does not exist, and every checked amp call
    that does not bind to the real signature."""
    module = cst.parse_module(code)
    problems = []
    for name in sorted(torch_names(module)):
        try:
            resolve(name)
        except AttributeError:
            problems.append(f"{name} does not exist in torch {torch.__version__}")
    for name, call in torch_calls(module):
        args = [_Any() for a in call.args if a.keyword is None and a.star == ""]
        kwargs = {a.keyword.value: _Any() for a in call.args if a.keyword is not None}
        try:
            inspect.signature(resolve(name)).bind(*args, **kwargs)
        except TypeError as exc:
            problems.append(f"{get_full_name_for_node(call.func)}(...) does not bind: {exc}")
    return problems
