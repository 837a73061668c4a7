"""`apex.DeprecatedFeatureWarning` and `apex.deprecated_warning` (from Apex's `apex/__init__.py`),
and the shim's own notice where Apex said that `apex.amp` is deprecated.

Scripts and test suites filter on this category (`warnings.simplefilter("ignore",
DeprecatedFeatureWarning)`, `pytest.warns(DeprecatedFeatureWarning)`), so the shim keeps
Apex's class and emits it from the same entry points.
"""

from __future__ import annotations

import warnings

import torch

#: What a program on the shim is told once, in place of Apex's "apex.amp is deprecated and will
#: be removed by the end of February 2023": what it runs on, and the way off it. Free of the
#: word "loss", so no log scraper (`amp-migrate verify`'s recorder among them) counts it as a step.
SHIM_NOTICE = (
    "this program runs Apex's amp API on amp_shim over torch.amp; "
    "to migrate it to torch.amp itself, run `amp-migrate PATH`"
)

_notice_given = False


class DeprecatedFeatureWarning(FutureWarning):
    pass


def _reports_here() -> bool:
    """Warn once per job rather than once per rank.

    Apex tested `torch.distributed.is_available` without calling it; the intent (warn on rank 0,
    or always when not distributed) is what is kept here.
    """
    return (
        not torch.distributed.is_available()
        or not torch.distributed.is_initialized()
        or torch.distributed.get_rank() == 0
    )


def deprecated_warning(msg: str) -> None:
    if _reports_here():
        warnings.warn(msg, DeprecatedFeatureWarning, stacklevel=1)


def shim_notice() -> None:
    """Give `SHIM_NOTICE` the first time an amp entry point runs in this process, never again.

    It stays a `DeprecatedFeatureWarning` (stderr, Apex's category) so that the filters scripts
    set against Apex's deprecation silence it too; it is issued under a location of its own,
    which Python prints as a single line, and a process-wide flag rather than the warning
    registry keeps it to one, since any change to the warning filters (`catch_warnings` in
    library code) resets that registry. `verbosity` does not silence it, as it never silenced
    Apex's deprecation warning.
    """
    global _notice_given
    if _notice_given:
        return
    _notice_given = True
    if _reports_here():
        warnings.warn_explicit(SHIM_NOTICE, DeprecatedFeatureWarning, "amp_shim", 0, module="amp_shim")
