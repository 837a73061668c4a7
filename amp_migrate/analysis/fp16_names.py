"""Which `apex.fp16_utils` object a name is: the module's public names, its submodules, and what
`from apex.fp16_utils import *` binds. Shared by the fp16_utils rules; this module holds no rule.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING, Optional

import libcst as cst
from libcst.helpers import get_full_name_for_node

from .binding import STAR_EXPORTS, ApexBinder

if TYPE_CHECKING:
    from .source_index import SourceIndex

PACKAGE = "apex.fp16_utils"
SUBMODULES = ("fp16util", "fp16_optimizer", "loss_scaler")
_FP16UTIL = {
    "BN_convert_float",
    "network_to_half",
    "prep_param_lists",
    "model_grads_to_master_grads",
    "master_params_to_model_params",
    "tofp16",
    "to_python_float",
    "clip_grad_norm",
    "convert_module",
    "convert_network",
    "FP16Model",
}
_OTHERS = {"FP16_Optimizer", "FP16_Module", "fp32_to_fp16", "fp16_to_fp32", "LossScaler", "DynamicLossScaler"}
#: What `import *` binds: the public names, the submodules the package imports (and, for
#: `fp16util`, the modules it imports itself), including names of older Apex releases.
STAR = {
    PACKAGE: frozenset(_FP16UTIL | _OTHERS | set(SUBMODULES) | {"Fused_Weight_Norm"}),
    PACKAGE + ".fp16util": frozenset(_FP16UTIL | {"torch", "nn", "Variable", "backwards_debug_hook"}),
}
STAR_EXPORTS.update(STAR)


def public(name: Optional[str]) -> Optional[str]:
    """`apex.fp16_utils.fp16util.to_python_float` → `apex.fp16_utils.to_python_float`."""
    if name is None:
        return None
    for sub in SUBMODULES:
        internal = f"{PACKAGE}.{sub}."
        if name.startswith(internal):
            return PACKAGE + "." + name[len(internal) :]
    return name


def star_module(node: cst.ImportFrom) -> Optional[str]:
    """The fp16_utils module a `from ... import *` reads, else None."""
    if not isinstance(node.names, cst.ImportStar) or node.relative or node.module is None:
        return None
    name = get_full_name_for_node(node.module)
    return name if name in STAR else None


def star_words(index: Optional[SourceIndex]) -> set[str]:
    """Every name the file's fp16_utils star imports bind (from the parse of the file as given)."""
    words: set[str] = set()
    if index is not None:
        for node in index.imports():
            if (
                isinstance(node, ast.ImportFrom)
                and node.module in STAR
                and any(a.name == "*" for a in node.names)
            ):
                words |= STAR[node.module]
    return words


def fp16_name(binding: ApexBinder, node: cst.CSTNode, star: set[str]) -> Optional[str]:
    """The public `apex.fp16_utils` name `node` is: through an import, or a bare name that only
    the star import binds (`star`: what it binds and nothing else in the file does)."""
    if isinstance(node, cst.Name) and node.value in star:
        return f"{PACKAGE}.{node.value}"
    return public(binding.name_of(node))


def star_only_names(index: Optional[SourceIndex], binding: Optional[ApexBinder]) -> set[str]:
    """The star-imported names no other binding of the file shadows, when that is known."""
    words = star_words(index)
    if not words or binding is None or binding.table is None:
        return set()
    return words - set(binding.bound_elsewhere)
