"""The rules, in the order they run. Each module is one Apex concern (DESIGN.md §2)."""
from .imports import RemainingApexUses, SettleImports, ShimImports

NATIVE_RULES = [
    SettleImports,
    RemainingApexUses,
]

SHIM_RULES = [ShimImports]
