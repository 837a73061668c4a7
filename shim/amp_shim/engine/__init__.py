"""The loss-scaling engine: tensor-resident scaler state and the per-tensor ops it runs."""

from .loss_scaler import DeviceLossScaler

__all__ = ["DeviceLossScaler"]
