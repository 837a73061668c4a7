"""What the passes over one file share besides the tree: the options, the diagnostics so far,
the file as given and the facts one pass hands on to later ones."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, AbstractSet, Iterable, Mapping, Optional, Union

import libcst as cst
from libcst.metadata import CodeRange

from .analysis.binding import NOTHING, ApexBinder
from .analysis.source_index import SourceIndex
from .diagnostics import Diagnostic
from .options import Options

if TYPE_CHECKING:
    import ast

    from .plan.switch_flow import _Stores
    from .plan.types import CastSource, Fp16OptimizerPlan, InferenceRegion, SharedScaler, TrainingPlan


@dataclass
class FileState:
    """Everything the rules of one file share, besides the tree itself. The fields from
    `parsed` to `fp16_optimizer_refused` are the facts one rule (or the driver) hands on to
    later ones: each is a `Fact`, and a rule's READS and WRITES name the ones it uses, which is
    how the registry orders the rules (rules/order.py)."""

    options: Options
    diagnostics: list[Diagnostic] = field(default_factory=list)
    original: str = ""
    index: Optional[SourceIndex] = None
    #: What a statement must spell to touch Apex (None: unknown, every statement matters).
    apex_words: Optional[frozenset[str]] = None
    #: The driver's parse of `original`, which the first binder may read as text.
    parsed: Optional[cst.Module] = None
    #: The driver's: this file's part in a scaler several modules share (None: it has none).
    project: Optional[SharedScaler] = None
    #: The first binder of the file (the rule that ran first), which every later rule reuses.
    binding: Optional[ApexBinder] = None
    #: The plan for the file's GradScaler: the planner's for Apex amp, or, once
    #: Fp16OptimizerToGradScaler has run, the one its `FP16_Optimizer` flow implies.
    training: Optional[TrainingPlan] = None
    #: Regions that only run models `initialize` prepared for inference (None: not planned).
    inference: Optional[tuple[InferenceRegion, ...]] = None
    #: What each `initialize` of the file turned on, for the eval-time autocast checks.
    casts: tuple[CastSource, ...] = ()
    #: The planner's plan for the file's `FP16_Optimizer` flow (None: none, or refused).
    fp16_optimizer: Optional[Fp16OptimizerPlan] = None
    #: The file's FP16_Optimizer flow was refused (it uses the shim): by the planner, or by
    #: Fp16OptimizerToGradScaler where it planned again on a tree earlier rules rewrote.
    fp16_optimizer_refused: bool = False
    #: Not a fact (no order): the file's `ast` and its stores, found once by whoever asks first
    #: (switch_flow.file_stores); `()` where the file does not parse, None until asked.
    file_stores: Union[tuple[ast.Module, _Stores], tuple[()], None] = None
    #: Not a fact: each original statement laid out alone (FileReader.position), by id, with the
    #: statement itself (which keeps the id its own): the same for every pass that asks.
    layouts: dict[int, tuple[cst.CSTNode, Mapping[cst.CSTNode, CodeRange]]] = field(default_factory=dict)

    @property
    def falls_back(self) -> bool:
        return any(d.falls_back for d in self.diagnostics)

    def skipping(
        self, words: Optional[Iterable[str]], also: Optional[Iterable[str]] = None
    ) -> AbstractSet[int]:
        """Ids of the original statements that spell none of `words` (with one of `also` on
        the same line, if given)."""
        if self.index is None or words is None or self.apex_words is None:
            return NOTHING  # unknown Apex words (a star import): every statement matters
        return self.index.skipped(words, also)
