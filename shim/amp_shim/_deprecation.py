"""`apex.DeprecatedFeatureWarning` and `apex.deprecated_warning` (apex_api.md §1).

Scripts and test suites filter on this category (`warnings.simplefilter("ignore",
DeprecatedFeatureWarning)`, `pytest.warns(DeprecatedFeatureWarning)`), so the shim keeps
Apex's class and emits it from the same entry points.
"""

from __future__ import annotations

import warnings

import torch


class DeprecatedFeatureWarning(FutureWarning):
    pass


def deprecated_warning(msg: str) -> None:
    """Warn once per job rather than once per rank.

    Apex tested `torch.distributed.is_available` without calling it; the intent (warn on rank 0,
    or always when not distributed) is what is kept here.
    """
    if (
        not torch.distributed.is_available()
        or not torch.distributed.is_initialized()
        or torch.distributed.get_rank() == 0
    ):
        warnings.warn(msg, DeprecatedFeatureWarning, stacklevel=1)
