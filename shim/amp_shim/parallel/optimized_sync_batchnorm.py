"""`apex.parallel.optimized_sync_batchnorm`: Apex's fused-kernel SyncBatchNorm module path.

Apex had two classes (a CUDA-extension one here and a Python fallback in `sync_batchnorm`);
the shim has one, with the fused version's signature, importable from both paths.
"""

from .sync_batchnorm import SyncBatchNorm

__all__ = ["SyncBatchNorm"]
