"""`apex.normalization` (apex_api.md §11.3) on torch's LayerNorm and RMSNorm."""

from .fused_layer_norm import FusedLayerNorm, FusedRMSNorm, MixedFusedLayerNorm, MixedFusedRMSNorm

__all__ = ["FusedLayerNorm", "FusedRMSNorm", "MixedFusedLayerNorm", "MixedFusedRMSNorm"]
