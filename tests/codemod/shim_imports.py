"""What a shim migration may change and what it imports from `amp_shim`."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from typing import Optional

import libcst as cst
from libcst.codemod import CodemodContext

from amp_migrate.options import Options
from amp_migrate.rules.base import FileState
from amp_migrate.rules.deprecated_amp import DeprecatedTorchAmp


def shim_imports(code: str) -> Iterator[tuple[str, Optional[str]]]:
    """(module, name) for each `amp_shim` import in `code` (name None for `import amp_shim.x`)."""
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "amp_shim":
                    yield alias.name, None
        elif (
            isinstance(node, ast.ImportFrom)
            and not node.level
            and (node.module or "").split(".")[0] == "amp_shim"
        ):
            for alias in node.names:
                yield node.module, alias.name


def deprecated_torch_amp_only(source: str) -> str:
    """`source` after the one rewrite besides imports that every target makes: torch's own
    deprecated `torch.cuda.amp` spellings (otherwise a later run would make it)."""
    module = cst.parse_module(source)
    state, context = FileState(Options("shim", "cuda", "float16"), original=source), CodemodContext()
    if DeprecatedTorchAmp.applies(state, context):
        module = DeprecatedTorchAmp(context, state).transform_module(module)
    return module.code
