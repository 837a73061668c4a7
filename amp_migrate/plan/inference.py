"""Plans for `initialize` calls that only prepare models for inference, and for a second
`initialize` that only prepares an EMA model beside the one that trains.

`model = amp.initialize(model, opt_level="O2")` (no optimizer, `None` or `[]`) builds no loss
scaler anyone uses: what it did was cast. At O1 Apex patched torch's functions from that call on,
process-wide; at O2/O3 it cast the model and patched its forward; at O0 or `enabled=False` it
did nothing. Natively the call goes (its assignment kept, so names bind the same objects) and
the statements after it in its block run under `torch.autocast(..., enabled=<amp on>)`.
Autocast is dynamically scoped, so the forward passes those statements run, in this module or
any other, are covered; what runs after the block is not, so the plan proves that nothing
needing casts does:

* O1 (or a level only known at run time): nothing runs after the region. The block is the last
  statement of each block around it (an `if` or a `with`) up to its function, and the function
  is called, in this file, only as the last statement of the script (the same test, recursively,
  up to the module's end).
* O2/O3: either the same, or the models stay in the region: they are bound to local names that
  are read nowhere else after `initialize`, not returned, not stored into an attribute, an item
  or a container, not declared global, and no nested function reads them.

A region holding a `backward()` falls back (Apex never cast backward), as do regions that nest
or hold another `initialize` or a training site. This module holds no rule: it is a part of
PlanTraining (rules/training_plan.py), which mixes it in.
"""

from __future__ import annotations

import ast
from dataclasses import replace
from typing import TYPE_CHECKING, Optional, Union

import libcst as cst

from ..analysis.statements import is_elif
from ..diagnostics import Severity, define
from .options import (
    OPTION_NOT_LITERAL,
    OptionReader,
    both,
    is_bool,
    is_expression,
    keyword,
    report_dropped,
    string,
)
from .sites import TrainingSites
from .types import INITIALIZE, InferenceRegion, bind_arguments, expression_codes, literal, pure

if TYPE_CHECKING:
    from ..analysis.source_index import SourceIndex

INFERENCE_OUT_OF_REACH = define(
    "AMP150",
    "inference-forward-out-of-reach",
    Severity.WARNING,
    "This `amp.initialize` only prepares a model for inference, and no autocast region placed "
    "after it provably covers everything Apex cast.",
    "The native rewrite puts the statements after `initialize` under `torch.autocast`. Apex's "
    "O1 casts stayed on for the rest of the process and O2/O3 cast the model object itself, "
    "so a model returned, stored in an attribute or read after the region (or, at O1, any "
    "code running after the function returns) would run uncast natively. The message names "
    "what escapes; the file uses the shim.",
    before='def load(path):\n    model = amp.initialize(Net(), opt_level="O2")\n    return model',
    after="# unchanged, imports point at amp_shim",
    falls_back=True,
    refusal="a model prepared for inference escapes every region autocast could cover",
    fallback_title="a model prepared for inference that escapes the region autocast could cover",
    shape=(
        "A retriever's `_prepare_model(self, encoder, ...)` that runs `encoder, _ = amp.initialize(encoder, "
        "None, opt_level=self.use_amp)` and `return encoder`; the encoder's forward runs later, in other "
        "methods (embedding queries and passages)."
    ),
    fallback_why=(
        "An `initialize` given no optimizer (none, `None`, `[]`) goes native as the statements after it "
        "under `torch.autocast(..., enabled=<amp on>)` (AMP151 for O2/O3): autocast is dynamically scoped, "
        "so every forward those statements run is covered. Apex's O1 casts stayed on for the rest of the "
        "process, and O2/O3 cast the model object itself; a model that is returned, stored in an attribute, "
        "kept by a container or read after the region (at O1: any code running after the function returns) "
        "would run uncast natively. The region is proven only where the block ends the script (each "
        "enclosing `if`/`with` the last statement, the function called only as the script's last statement) "
        "or, at O2/O3, where the models stay in local names read only inside it."
    ),
    by_hand=(
        "Drop the `initialize` and put each forward of the returned model under `with "
        'torch.autocast("cuda", dtype=torch.float16, enabled=<your flag>):` where it runs (or cast the '
        "model with `.half()` if you want Apex's O2/O3 fp16 weights for inference)."
    ),
)
INFERENCE_DTYPE = define(
    "AMP151",
    "inference-fp32-weights-under-autocast",
    Severity.INFO,
    "O2/O3 cast this model's weights to fp16 for inference and its outputs back to fp32; the "
    "native model keeps fp32 weights and runs under autocast, so its outputs may be float16.",
    "The native recipe for O2/O3 (AMP110) applies to inference as to training: fp32 weights, "
    "ops in reduced precision where autocast chooses, over a region (the statements after "
    "`initialize`) rather than one model. Apex's patched forward returned fp32 outputs; under "
    "autocast a model whose last op is a matmul returns float16, and the other ops of the "
    "region (on those outputs, or another model's forward) run under autocast too, where "
    "Apex's O2/O3 ran them in fp32. Call `.float()` on outputs that must stay fp32 (saved "
    "logits, metrics), or narrow the `with` to the forward.",
    before='model = amp.initialize(model, opt_level="O2")\nlogits = model(x)',
    after='with torch.autocast("cuda", dtype=torch.float16):\n    logits = model(x)  # float16',
)
SECOND_INITIALIZE = define(
    "AMP152",
    "second-initialize-same-options",
    Severity.INFO,
    "A second `amp.initialize` prepares a model whose optimizer is never scaled or stepped "
    "(an EMA or evaluation copy) with the options of the one before it; it is dropped.",
    "Apex rebuilt its loss scalers at every `initialize`. This one runs right after the one "
    "that trains (nothing between them scales, steps or calls this file's functions) and "
    "has the same options, so the rebuilt scaler is the one the first call built, and its "
    "casts are those of the first. Its model is treated as the trained model is: autocast "
    "covers it where it feeds the loss.",
    before='model, opt = amp.initialize(model, opt, opt_level="O1")\n'
    'ema, ema_opt = amp.initialize(ema, ema_opt, opt_level="O1")',
    after='scaler = torch.amp.GradScaler("cuda")',
)

_OPTIONS = (
    "enabled",
    "opt_level",
    "cast_model_type",
    "patch_torch_functions",
    "keep_batchnorm_fp32",
    "master_weights",
    "loss_scale",
    "cast_model_outputs",
    "num_losses",
    "min_loss_scale",
    "max_loss_scale",
)
#: Methods that keep what they are given (a container, a registry): a model passed to one
#: outlives the region.
_STORING = frozenset({"append", "extend", "insert", "add", "setdefault", "update", "put", "register"})
_NESTED = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)


def inference_only(args: Optional[dict]) -> bool:
    """`initialize` given no optimizer: none, `None`, or an empty list."""
    if args is None or "models" not in args:
        return False
    optimizers = args.get("optimizers")
    return (
        optimizers is None
        or literal(optimizers) is None
        or (isinstance(optimizers, (cst.List, cst.Tuple)) and not optimizers.elements)
    )


def _mentions(node: ast.AST, names: set[str]) -> Optional[str]:
    return next((n.id for n in ast.walk(node) if isinstance(n, ast.Name) and n.id in names), None)


def _holder(parent: Optional[ast.AST], node: ast.AST) -> Optional[list]:
    for field in ("body", "orelse", "finalbody"):
        block = getattr(parent, field, None)
        if isinstance(block, list) and any(s is node for s in block):
            return block
    return None


def _first_line(node: ast.stmt) -> int:
    return min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", ())])


def _own_nodes(scope: ast.AST):
    """The nodes of a scope's code, nested functions and classes reported but not entered."""
    stack = list(ast.iter_child_nodes(scope))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, _NESTED):
            stack.extend(ast.iter_child_nodes(node))


#: `nn.Module` methods that return the module itself.
_SELF_RETURNING = frozenset(
    {
        "eval",
        "train",
        "cuda",
        "cpu",
        "to",
        "half",
        "float",
        "double",
        "bfloat16",
        "requires_grad_",
        "apply",
        "type",
        "share_memory",
        "to_empty",
    }
)


def _holds(value: ast.AST, names: set[str]) -> bool:
    """Whether `value` may hold a model: it mentions one other than as the callee of a call
    (`model(x)`, `model.infer(x)` give outputs; `model.eval()` gives the model back)."""
    callees = set()
    for node in ast.walk(value):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name):
                callees.add(id(func))
            elif (
                isinstance(func, ast.Attribute)
                and isinstance(func.value, ast.Name)
                and func.attr not in _SELF_RETURNING
            ):
                callees.add(id(func.value))
    return any(isinstance(n, ast.Name) and n.id in names and id(n) not in callees for n in ast.walk(value))


def _aliases(scope: ast.AST, names: set[str]) -> set[str]:
    """`names` and every local name assigned a value that may hold one, to a fixpoint."""
    names = set(names)
    binds = []
    for node in _own_nodes(scope):
        if (
            isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.NamedExpr))
            and node.value is not None
        ):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            binds.append((node.value, targets))
        elif isinstance(node, (ast.For, ast.AsyncFor)):
            binds.append((node.iter, [node.target]))
        elif isinstance(node, ast.withitem) and node.optional_vars is not None:
            binds.append((node.context_expr, [node.optional_vars]))
    grown = True
    while grown:
        grown = False
        for value, targets in binds:
            if _holds(value, names):
                new = {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)} - names
                names |= new
                grown = grown or bool(new)
    return names


class InferencePlanning(TrainingSites):
    """PlanTraining's planning for `initialize` calls that only prepare models for inference."""

    def _source_index(self) -> SourceIndex:
        """The file's index: the plans that read Python's parse run only where it exists."""
        index = self.state.index
        assert index is not None
        return index

    def _ast_parents(self) -> dict[int, ast.AST]:
        found = getattr(self, "_inference_parents", None)
        if found is None:
            found = {
                id(child): node
                for node in ast.walk(self._source_index().tree)
                for child in ast.iter_child_nodes(node)
            }
            self._inference_parents = found
        return found

    def _ast_statement(self, node: cst.CSTNode) -> Optional[ast.stmt]:
        """Python's parse of a statement of the file as given (simple ones found by line)."""
        found = self._source_index().ast_of(node)
        if found is not None:
            return found
        lines = getattr(self, "_inference_lines", None)
        if lines is None:
            lines = self._inference_lines = {
                n.lineno: n for n in ast.walk(self._source_index().tree) if isinstance(n, ast.stmt)
            }
        return lines.get(self.position(node)[0])

    def _inference_shaped(self, call: cst.Call) -> bool:
        return self.apex_name(call.func) == INITIALIZE and inference_only(bind_arguments(call))

    def _refuse_inference(self, call: cst.Call, why: str) -> str:
        self.report(
            call,
            INFERENCE_OUT_OF_REACH,
            f"`amp.initialize` only prepares models for inference here, but {why}",
        )
        return ""

    def _plan_inference(self, module: cst.Module) -> None:
        """Every `initialize` of the file prepares models for inference: a region each."""
        regions = []
        for call, statement in self.inits:
            region = self._inference_region(call, statement)
            if not isinstance(region, InferenceRegion):
                return
            regions.append(region)
        if not self._regions_apart(regions, []):
            return
        self.state.inference = tuple(regions)

    def _regions_apart(self, regions: list[InferenceRegion], sites: list[int]) -> bool:
        """No region holds another `initialize` or a training site (reported)."""
        lines = [self.position(call)[0] for call, _ in self.inits] + sites
        for region in regions:
            if region.span is None:
                continue
            first, last = region.span
            inside = [line for line in lines if first <= line <= last]
            if inside:
                call = next(c for c, s in self.inits if self._lines_of(s)[0] == region.line)
                self._refuse_inference(
                    call,
                    f"the autocast region after it (lines {first}-{last}) "
                    f"holds another Apex call at line {inside[0]}",
                )
                return False
        return True

    def _inference_region(self, call: cst.Call, statement: cst.CSTNode) -> Union[InferenceRegion, str]:
        """The region after an inference `initialize`, or "" (refused, reported)."""
        if self.state.index is None or self.state.index.tree is None:
            return self._refuse_inference(call, "this file is beyond the parser that proves regions")
        args = bind_arguments(call)
        assert args is not None  # an inference-shaped call: its arguments bind
        names = self._model_names(statement, args)
        if isinstance(names, str):
            return self._refuse_inference(call, names)
        anchor, guard = self._inference_anchor(statement)
        amp_on, may_o1 = self._inference_switch(call, args, guard)
        if amp_on is None:
            return ""
        line, at = self._lines_of(statement)[0], self.position(anchor)[0]
        if amp_on is False:
            return InferenceRegion(line, at, None)
        tree = self._ast_statement(anchor)
        if tree is None:
            return self._refuse_inference(call, "its statement could not be placed")
        why, span = self._proof(tree, names, may_o1, self._lines_of(statement)[-1])
        if why:
            return self._refuse_inference(call, why)
        autocast = cst.Call(
            cst.parse_expression("torch.autocast"),
            [
                cst.Arg(string(self.options.device)),
                keyword("dtype", cst.parse_expression(f"torch.{self.options.dtype}")),
            ]
            + (
                [
                    keyword(
                        "enabled",
                        amp_on if is_bool(amp_on) else cst.Call(cst.Name("bool"), [cst.Arg(amp_on)]),
                    )
                ]
                if is_expression(amp_on)
                else []
            ),
        )
        return InferenceRegion(line, at, autocast if span is not None else None, span)

    def _proof(
        self, anchor: ast.stmt, names: set[str], may_o1: bool, init_end: int
    ) -> tuple[str, Optional[tuple]]:
        """Why the region after `anchor` does not cover what Apex cast ("" where it does), and
        its lines (None: empty)."""
        parents = self._ast_parents()
        block = _holder(parents[id(anchor)], anchor) if id(anchor) in parents else None
        if block is None:
            return "its statement could not be placed", None
        after = block[next(i for i, s in enumerate(block) if s is anchor) + 1 :]
        span = (_first_line(after[0]), after[-1].end_lineno) if after else None
        scope = self._scope_of(anchor, parents)
        if isinstance(scope, str):
            return scope, span
        backward = next(
            (
                n
                for s in after
                for n in ast.walk(s)
                if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "backward"
            ),
            None,
        )
        if backward is not None:
            return (
                f"the region after it runs a backward pass (line {backward.lineno}), which Apex never cast",
                span,
            )
        tail = self._tail(anchor, parents, 0, own=True)
        if not tail:
            return "", span
        confined = self._confined(scope, names, init_end, span)
        if may_o1:
            return f"Apex's O1 casts stayed on after it, and {tail}" + (
                f"; {confined}" if confined else ""
            ), span
        return confined, span

    def _scope_of(self, anchor: ast.stmt, parents: dict) -> Union[ast.AST, str]:
        node = anchor
        while True:
            parent = parents.get(id(node))
            if isinstance(parent, (ast.Module, ast.FunctionDef)):
                if isinstance(parent, ast.FunctionDef) and any(
                    isinstance(n, (ast.Yield, ast.YieldFrom)) for n in _own_nodes(parent)
                ):
                    return f"`{parent.name}` is a generator, whose suspended region would leak autocast"
                return parent
            if not isinstance(parent, (ast.If, ast.With)):
                kind = type(parent).__name__.lower().replace("asyncfunctiondef", "async def")
                return (
                    f"it runs inside a `{kind}` statement, which may run it again or leave the region early"
                )
            node = parent

    def _tail(self, node: ast.stmt, parents: dict, depth: int, own: bool = False) -> str:
        """Why code may run after `node` (`own`: after the statements of its block that
        follow it) ("" where none can)."""
        while True:
            parent = parents.get(id(node))
            block = _holder(parent, node) if parent is not None else None
            if block is None:
                return "its statement could not be placed"
            if block[-1] is not node and not own:
                return f"the statement at line {block[-1].lineno} runs after the region"
            own = False
            if isinstance(parent, ast.Module):
                return ""
            if isinstance(parent, ast.FunctionDef):
                return self._tail_calls(parent, parents, depth)
            if not isinstance(parent, (ast.If, ast.With)):
                return f"the `{type(parent).__name__.lower()}` around it may run code after the region"
            node = parent

    def _tail_calls(self, function: ast.FunctionDef, parents: dict, depth: int) -> str:
        """Every call of `function` in this file is the last thing the script does."""
        if not isinstance(parents.get(id(function)), ast.Module) or depth > 3:
            return f"code runs after `{function.name}` returns"
        uses = [
            n
            for n in ast.walk(self._source_index().tree)
            if isinstance(n, ast.Name) and n.id == function.name
        ]
        if not uses:
            return f"`{function.name}` is not called in this file, so what runs after it returns is unknown"
        for use in uses:
            call = parents.get(id(use))
            statement = parents.get(id(call))
            if not (
                isinstance(call, ast.Call)
                and call.func is use
                and isinstance(statement, (ast.Expr, ast.Assign))
                and statement.value is call
            ):
                return f"`{function.name}` is used at line {use.lineno} other than as a statement's call"
            why = self._tail(statement, parents, depth + 1)
            if why:
                return f"code runs after `{function.name}` returns (line {use.lineno}: {why})"
        return ""

    def _confined(self, scope: ast.AST, names: set[str], init_end: int, span: Optional[tuple]) -> str:
        """Why a model may run outside the region ("" where it cannot). Locals bound to
        anything built from a model (`wrapped = DataParallel(model)`) count as the model."""
        names = _aliases(scope, names)
        for node in _own_nodes(scope):
            if isinstance(node, _NESTED):
                name = _mentions(node, names)
                if name:
                    return f"a nested function or class at line {node.lineno} reads `{name}`"
            elif (
                isinstance(node, ast.Name)
                and node.id in names
                and node.lineno > init_end
                and (span is None or not span[0] <= node.lineno <= span[1])
            ):
                return f"`{node.id}` is used at line {node.lineno}, after the region"
            why = self._escape(node, names)
            if why:
                return why
        return ""

    def _escape(self, node: ast.AST, names: set[str]) -> str:
        if isinstance(node, (ast.Global, ast.Nonlocal)) and set(node.names) & names:
            return f"`{sorted(set(node.names) & names)[0]}` is declared global at line {node.lineno}"
        if isinstance(node, ast.Return) and node.value is not None and _holds(node.value, names):
            return f"`{_mentions(node.value, names)}` is returned at line {node.lineno}"
        if (
            isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign))
            and node.value is not None
            and _holds(node.value, names)
        ):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(
                isinstance(t, (ast.Attribute, ast.Subscript)) for target in targets for t in ast.walk(target)
            ):
                return f"`{_mentions(node.value, names)}` is stored at line {node.lineno}"
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _STORING:
            name = next(
                (
                    _mentions(a, names)
                    for a in [*node.args, *(k.value for k in node.keywords)]
                    if _holds(a, names)
                ),
                None,
            )
            if name:
                return f"`{name}` is handed to `.{node.func.attr}()` at line {node.lineno}, which may keep it"
        return ""

    def _model_names(self, statement: cst.CSTNode, args: dict) -> Union[set[str], str]:
        """The local names the prepared models are read through, or why they are not locals."""
        given = args.get("models")
        parts = [e.value for e in given.elements] if isinstance(given, (cst.List, cst.Tuple)) else [given]
        if not all(isinstance(p, (cst.Name, cst.Call)) for p in parts):
            return "its models are not plain local names (an attribute is read where no region follows)"
        small = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) else None
        names = {p.value for p in parts if isinstance(p, cst.Name)}
        if isinstance(small, cst.Assign):
            for target in small.targets:
                found = self._target_names(target.target)
                if found is None:
                    return f"it is assigned to `{self.code_of(target.target)}`, read where no region follows"
                names |= found
        elif not isinstance(small, cst.Expr):
            return "its models are returned or bound where no region follows"
        return names - {"_"}

    def _target_names(self, target: cst.BaseExpression) -> Optional[set[str]]:
        if isinstance(target, cst.Name):
            return {target.value}
        if isinstance(target, (cst.Tuple, cst.List)):
            found: set[str] = set()
            for element in target.elements:
                inner = self._target_names(element.value) if isinstance(element, cst.Element) else None
                if inner is None:
                    return None
                found |= inner
            return found
        return None

    def _inference_anchor(self, statement: cst.CSTNode) -> tuple[cst.CSTNode, Optional[cst.BaseExpression]]:
        """The `if cond:` whose body ends with `initialize` (its region starts after the `if`,
        enabled by `cond`), or the statement itself."""
        block = self.parent(statement)
        owner = self.parent(block) if block is not None else None
        if (
            isinstance(owner, cst.If)
            and owner.body is block
            and owner.orelse is None
            and not is_elif(owner, self.parent)
            and block.body
            and block.body[-1] is statement
        ):
            return owner, owner.test
        return statement, None

    def _inference_switch(self, call: cst.Call, args: dict, guard: Optional[cst.BaseExpression]):
        """(amp on, whether it may be O1); amp on is None where an option cannot be followed."""
        if guard is not None and not self._pure_guard(guard):
            self.report(call, OPTION_NOT_LITERAL, "`amp.initialize` runs under a condition with side effects")
            return None, False
        reader = OptionReader(args, call, self.report, self._free_builtins())
        level, enabled = reader.level(), reader.enabled()
        report_dropped(
            {k: v for k, v in args.items() if k not in ("min_loss_scale", "max_loss_scale")}, self.report
        )
        if not level.ok or enabled is None:
            return None, False
        amp_on = both(True if guard is None else guard.deep_clone(), level.amp_on, enabled)
        if amp_on is not False and {"O2", "O3"} & set(level.values):
            self.report(call, INFERENCE_DTYPE)
        return amp_on, amp_on is not False and "O1" in level.values

    def _pure_guard(self, guard: cst.BaseExpression) -> bool:
        return pure(guard, self._free_builtins())

    def _only_inference(self, shared) -> bool:
        """No training site here or in a module sharing a scaler, and every `initialize` is
        given no optimizer."""
        return (
            not self.scale_losses
            and not self.sites
            and all(self._inference_shaped(call) for call, _ in self.inits)
            and (shared is None or not (shared.owner or shared.user or shared.refused))
        )

    # -- a second `initialize` beside the one that trains -------------------------------------
    def _with_absorbed(self, absorbed: list[tuple[cst.Call, cst.CSTNode]]) -> None:
        """The plan drops the absorbed calls and treats their models as its own (reported)."""
        plan = self.state.training
        if plan is None or not absorbed:
            return
        models = set(plan.models)
        for call, _ in absorbed:
            self.report(call, SECOND_INITIALIZE)
            models |= set(expression_codes((bind_arguments(call) or {}).get("models")))
        lines = frozenset(self._lines_of(statement)[0] for _, statement in absorbed)
        self.state.training = replace(plan, models=models, absorbed=lines)

    def _absorb(self, scaled: set[str]) -> list[tuple[cst.Call, cst.CSTNode]]:
        """Take out of `self.inits` each later `initialize` that Apex ran right after the first
        with the same options, for a model whose optimizer is never scaled or stepped: the
        scalers it rebuilt were the first one's (reported). Returns them."""
        if len(self.inits) < 2 or self.state.index is None or self.state.index.tree is None:
            return []
        first, taken = self.inits[0], []
        options = self._scaler_options(first[0])
        for item in self.inits[1:]:
            call, statement = item
            args = bind_arguments(call)
            optimizers = set(expression_codes(args.get("optimizers"))) if args is not None else set()
            if (
                args is None
                or options is None
                or self._scaler_options(call) != options
                or (optimizers & scaled)
                or (not optimizers and not inference_only(args))
                or self._stepped(optimizers)
                or self._between(first[1], statement)
            ):
                continue
            taken.append(item)
        self.inits = [i for i in self.inits if not any(i is t for t in taken)]
        return taken

    def _scaler_options(self, call: cst.Call) -> Optional[dict[str, str]]:
        args = bind_arguments(call)
        return None if args is None else {k: self.code_of(v) for k, v in args.items() if k in _OPTIONS}

    def _stepped(self, optimizers: set[str]) -> bool:
        return any(
            isinstance(n, ast.Call)
            and isinstance(n.func, ast.Attribute)
            and n.func.attr == "step"
            and ast.unparse(n.func.value) in optimizers
            for n in ast.walk(self._source_index().tree)
        )

    def _between(self, first: cst.CSTNode, later: cst.CSTNode) -> str:
        """Why something may run between the two calls: `later` is not in the block holding
        `first` after it (only `if`/`with` between), or the code between them calls an Apex
        training site or a function or class of this file."""
        parents = self._ast_parents()
        start, end = self._ast_statement(first), self._ast_statement(later)
        if start is None or end is None:
            return "not after"
        start_end = start.end_lineno
        assert start_end is not None  # ast.parse sets it on every statement
        if end.lineno <= start_end:
            return "not after"
        holder = parents.get(id(start))
        node: Optional[ast.AST] = end
        while node is not None and parents.get(id(node)) is not holder:
            node = parents.get(id(node))
            if not isinstance(node, (ast.If, ast.With)):
                return "not in the block of the first"
        if node is None or _holder(holder, node) is not _holder(holder, start):
            return "not in the block of the first"
        tree = self._source_index().tree
        local = {
            n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        }
        sites = {self.position(site)[0] for site in self.sites}
        assert holder is not None  # a statement of the parsed file has a parent
        for n in ast.walk(holder):
            line = getattr(n, "lineno", 0)
            if start_end < line < end.lineno and (
                line in sites
                or isinstance(n, ast.Call)
                and isinstance(n.func, ast.Name)
                and n.func.id in local
            ):
                return f"line {line} runs code between them"
        return ""
