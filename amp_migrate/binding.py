"""Which expressions mean an Apex object, whatever the file calls it.

Names are resolved with libcst's `QualifiedNameProvider`, so `from apex import amp as A`,
`import apex` + `apex.amp.initialize`, imports inside functions or under `if`/`try` all give
`apex.amp.initialize`, while a local variable that happens to be called `amp` gives nothing.
Two bindings that scope analysis cannot see are added where the file proves them:
attributes that only ever hold an Apex object (`self.amp = amp`), and handles returned by the
old `amp.init()` API.
"""
from __future__ import annotations

from typing import Callable, Optional

import libcst as cst
import libcst.matchers as m
from libcst.metadata import QualifiedNameProvider

APEX = "apex"
HANDLE = "apex.amp.AmpHandle"  # what `amp.init()` returns

GetMetadata = Callable[..., object]


def is_apex_name(name: str) -> bool:
    return name == APEX or name.startswith(APEX + ".")


class ApexBinder:
    """Answers "which Apex name is this expression?" for one metadata-resolved module."""

    def __init__(self, module: cst.Module, get_metadata: GetMetadata,
                 known: Optional["ApexBinder"] = None) -> None:
        """`known`: the binder of the file as first read. Rules delete the assignments that
        proved a holder or a handle, so later rules keep the original file's facts."""
        self._get = get_metadata
        self.holders: dict[str, str] = {}  # self.<attr> -> apex name
        self.handles: set[str] = set()  # local names bound to amp.init()
        if known is not None:
            self.holders, self.handles = known.holders, known.handles
        else:
            self._scan(module)

    def _direct(self, node: cst.CSTNode) -> Optional[str]:
        names = self._get(QualifiedNameProvider, node, set())
        apex = sorted(q.name for q in names if is_apex_name(q.name))
        return apex[0] if apex else None

    def _scan(self, module: cst.Module) -> None:
        candidates: dict[str, set] = {}
        for assign in m.findall(module, m.Assign()):
            if m.matches(assign.value, m.Call()) and self._direct(assign.value.func) == "apex.amp.init":
                if len(assign.targets) == 1:
                    target = assign.targets[0].target
                    if m.matches(target, m.Name()):
                        self.handles.add(target.value)
                    elif m.matches(target, m.Attribute(value=m.Name("self"))):
                        candidates.setdefault(target.attr.value, set()).add(HANDLE)
                continue
            # `self.norm = FusedLayerNorm(d)` holds an instance, not the Apex object itself.
            value_name = None if isinstance(assign.value, cst.Call) else self._direct(assign.value)
            for t in assign.targets:
                if m.matches(t.target, m.Attribute(value=m.Name("self"))):
                    candidates.setdefault(t.target.attr.value, set()).add(value_name)
        for attr, values in candidates.items():
            if len(values) == 1 and None not in values:
                self.holders[attr] = values.pop()

    def name_of(self, node: cst.CSTNode) -> Optional[str]:
        """The Apex qualified name `node` evaluates to, or None if it is not an Apex object."""
        direct = self._direct(node)
        if direct is not None:
            return direct
        return self._bound(node)

    def _bound(self, node: cst.CSTNode) -> Optional[str]:
        if isinstance(node, cst.Call):
            return self._bound(node.func)
        if isinstance(node, cst.Name) and node.value in self.handles:
            return HANDLE
        if isinstance(node, cst.Attribute):
            if m.matches(node.value, m.Name("self")) and node.attr.value in self.holders:
                return self.holders[node.attr.value]
            base = self._bound(node.value)
            if base is not None:
                return f"{base}.{node.attr.value}"
        return None

    def is_(self, node: cst.CSTNode, *names: str) -> bool:
        return self.name_of(node) in names
