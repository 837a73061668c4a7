"""amp_shim: NVIDIA Apex's mixed-precision API (`apex.amp` and friends) on native torch.amp.

Legacy training code keeps running unchanged while it is migrated; this package depends on
torch alone.
"""

import importlib

__version__ = "0.1.0"

# `import apex` made `apex.amp`, `apex.fp16_utils`, ... reachable as attributes; code migrated
# to `import amp_shim as apex` keeps that, importing each submodule on first use.
_SUBMODULES = ("amp", "fp16_utils", "optimizers", "parallel", "normalization", "multi_tensor_apply")


def __getattr__(name: str):
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
