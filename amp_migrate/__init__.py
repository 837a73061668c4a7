"""amp-migrate: move PyTorch code off NVIDIA Apex's mixed-precision API."""
__version__ = "0.1.0"
