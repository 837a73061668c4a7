"""`apex.fp16_utils`."""
from .fp16util import BN_convert_float, convert_module, convert_network

__all__ = ["BN_convert_float", "convert_module", "convert_network"]
