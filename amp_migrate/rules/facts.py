"""The facts rules hand on to each other, which order the rules.

A rule declares, as data on its class, the facts it reads (`READS`) and the facts it produces
(`WRITES`); the registry (rules/__init__.py) derives the running order from them (order.py):
a rule that reads a fact runs after every other rule of the list that writes it. Two kinds:

* State facts: a value on `FileState` one rule leaves for later ones (`FIELDS` names the
  field). Two facts may share a field: Fp16OptimizerToGradScaler hands the GradScaler plan
  of an `FP16_Optimizer` flow on into `training` only where the planner left it empty, and
  the rules that carry out only Apex amp's plan must not see that one.
* Tree facts: what earlier rules must already have done to the tree (or to the requests in
  libcst's context) before a later rule looks, or what a later rule would destroy that an
  earlier one must read first. The latter is declared the same way: the later rule reads
  that the earlier one is done (`SCALER_STATE_REWRITTEN`).

The planner phase (plan/, `plan_file`) runs before every native rule: it binds the parse's
Apex names (`BINDING`), plans the GradScaler (`TRAINING`, `INFERENCE`, `CASTS`) and an
`FP16_Optimizer` flow (`FP16_OPTIMIZER`), and analyses the Apex code as given
(`APEX_ANALYSED`), so for the native rules these are the driver's, as the parse and the
project part are. Under the shim target nothing plans, and the first rule's
binder fills `BINDING`. This module holds no rule.
"""

from __future__ import annotations

import enum


class Fact(enum.Enum):
    """One fact a rule reads or writes."""

    # -- state facts (FileState fields) ---------------------------------------------------------
    #: The driver's parse of the text.
    PARSED = "parsed"
    #: The file's part in a scaler other modules share; the driver's, None outside project mode.
    PROJECT = "project"
    #: The file's Apex binding. A rule that reads it in `applies`, before its own binder exists,
    #: needs a rule before it that binds every file it may act on.
    BINDING = "binding"
    #: The GradScaler plan the planner (plan/training.py) made from Apex amp's calls.
    TRAINING = "training"
    #: The GradScaler plan an `FP16_Optimizer` flow implies, which Fp16OptimizerToGradScaler
    #: hands on (into `training`) as it rewrites the flow, where amp left none.
    FP16_PLAN = "fp16 plan"
    #: The plan the planner (plan/fp16_optimizer.py) made for the file's `FP16_Optimizer` flow.
    FP16_OPTIMIZER = "fp16 optimizer"
    #: The regions that only run models `initialize` prepared for inference.
    INFERENCE = "inference"
    #: What each `initialize` turned on.
    CASTS = "casts"
    #: The file's `FP16_Optimizer` flow was refused. The planner decides it on the parse, but
    #: it is final only once Fp16OptimizerToGradScaler ran: where rules before it rewrote the
    #: file, it plans the flow again on the tree it got. So it is that rule's to write.
    FP16_OPTIMIZER_REFUSED = "fp16 optimizer refused"

    # -- tree facts -------------------------------------------------------------------------------
    #: The analyses of the Apex code as given are made (the plan, the rebound names) before any
    #: rule rewrites that code.
    APEX_ANALYSED = "apex analysed"
    #: The reads of Apex's scaler state are rewritten while the `initialize` and `state_dict`
    #: calls they read still stand.
    SCALER_STATE_REWRITTEN = "scaler state rewritten"
    #: Apex's module used as a value (tested, bound to None, passed on) is the scaler, judged
    #: while the calls of the plan still stand, and before the rules that carry out the plan
    #: judge the tests around those calls.
    MODULE_VALUE_REWRITTEN = "module value rewritten"
    #: The rules that carry out Apex amp's plan (and only that one) are done.
    AMP_PLAN_CARRIED = "amp plan carried"
    #: Every rule that writes code reading the plan's scaler has written it.
    SCALER_CALLS_WRITTEN = "scaler calls written"
    #: `opt_cls = FusedAdam` aliases are rewritten before the optimizer rule refuses bare classes.
    OPTIMIZER_ALIASES_REWRITTEN = "optimizer aliases rewritten"
    #: Every Apex call and value a native rule rewrites is rewritten.
    APEX_CALLS_REWRITTEN = "apex calls rewritten"
    #: The tests of whether Apex is installed are decided.
    AVAILABILITY_SETTLED = "availability settled"
    #: Imports to add or remove, requested through libcst's `AddImportsVisitor` and
    #: `RemoveImportsVisitor` in the codemod context.
    IMPORT_REQUESTS = "import requests"
    #: The file's imports are final.
    IMPORTS_SETTLED = "imports settled"
    #: Every reason the file falls back is reported (the diagnostics that fall back).
    FALLBACK_REASONS = "fallback reasons"


#: Each state fact → the `FileState` field that holds it.
FIELDS: dict[Fact, str] = {
    Fact.PARSED: "parsed",
    Fact.PROJECT: "project",
    Fact.BINDING: "binding",
    Fact.TRAINING: "training",
    Fact.FP16_PLAN: "training",
    Fact.FP16_OPTIMIZER: "fp16_optimizer",
    Fact.INFERENCE: "inference",
    Fact.CASTS: "casts",
    Fact.FP16_OPTIMIZER_REFUSED: "fp16_optimizer_refused",
}

#: What the driver (migrate.py's `_run`) sets on `FileState` before any rule runs: the parse,
#: the project part, and what the planner phase (plan/, `plan_file`) decides from the parse.
DRIVER_PROVIDES = frozenset(
    {
        Fact.PARSED,
        Fact.PROJECT,
        Fact.BINDING,
        Fact.TRAINING,
        Fact.FP16_OPTIMIZER,
        Fact.INFERENCE,
        Fact.CASTS,
        Fact.APEX_ANALYSED,
    }
)
