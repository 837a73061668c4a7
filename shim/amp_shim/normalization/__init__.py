"""`apex.normalization` (fused and mixed-dtype norms) on torch's LayerNorm and RMSNorm."""

from .fused_layer_norm import FusedLayerNorm, FusedRMSNorm, MixedFusedLayerNorm, MixedFusedRMSNorm

__all__ = ["FusedLayerNorm", "FusedRMSNorm", "MixedFusedLayerNorm", "MixedFusedRMSNorm"]
