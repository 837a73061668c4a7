"""amp_shim: NVIDIA Apex's mixed-precision API (`apex.amp` and friends) on native torch.amp.

Legacy training code keeps running unchanged while it is migrated; this package depends on
torch alone.
"""
__version__ = "0.1.0"
