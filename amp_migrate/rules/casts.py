"""Casts: Apex's user cast registry, its cast decorators and `disable_casts` → `torch.autocast`.

What it does
    * `amp.register_half_function(mod, "f")`, `register_float_function` and
      `register_promote_function` become an assignment at the same place,
      `mod.f = _cast_inputs("cuda", torch.float16)(mod.f)`;
    * `@amp.half_function`, `@amp.float_function`, `@amp.promote_function` (and their call
      form `amp.half_function(f)`) become `@_cast_inputs(...)`, except on the `forward` of a
      `torch.autograd.Function`, where the half and float decorators become
      `@torch.amp.custom_fwd(device_type=..., cast_inputs=...)`;
    * `with amp.disable_casts():` becomes `with torch.autocast(device_type=..., enabled=False):`.

    `_cast_inputs` is a small function the rule writes once at module level (renamed if the
    file already uses the name). While autocast is on for the device it casts the floating-point
    tensors on that device among the arguments (also inside list and tuple arguments) to the
    dtype, or, for promote, to the widest floating dtype among them, and calls the function with
    autocast off; outside autocast it calls the function unchanged. "Half" is the autocast dtype:
    `torch.float16`, or `torch.bfloat16` under `--dtype bfloat16`.

Why
    Apex's O1 applies these casts by patching functions when `amp.initialize` runs. Native
    autocast has no user registry. `torch.amp.custom_fwd(cast_inputs=...)` has the right
    semantics but is written for `autograd.Function.forward`: its wrapper stores `_dtype` and
    `_fwd_used_autocast` on the first positional argument (the `ctx`), so around a plain
    function such as `torch.bmm` or a user function it would set attributes on the first input
    tensor, or raise when the first argument is not an object that takes attributes (an int,
    None). It is therefore used only where it was designed to be used; everywhere else the
    generated wrapper, built from public API only (`torch.is_autocast_enabled`,
    `torch.autocast`, `Tensor.to`, `torch.promote_types`), does the same job. Running the
    function with autocast off is what makes the cast stick: a float function called under
    autocast would otherwise have its inputs cast back to half by autocast's own op lists.

Soundness
    `_cast_inputs` casts the same floating tensors to the same dtype as Apex's registered
    wrappers did (half: the autocast dtype; float: fp32; promote: the widest present) and runs
    the function with autocast off, as Apex ran it with its patches bypassed; where autocast is
    off (O0, `enabled=False`) it calls the function unchanged, as Apex's registry did nothing
    there. `torch.amp.custom_fwd(cast_inputs=...)` is used only on `autograd.Function.forward`,
    where it is what Apex's decorator did. `with amp.disable_casts():` becomes
    `torch.autocast(enabled=False)`, which switches casting off for exactly that block.
    tests/codemod/test_casts_semantics.py runs both forms.

Fix safety
    Safe for the dtypes the registered function sees and returns: fp16 inputs of a float
    function are computed in fp32, any input of a half function in the autocast dtype, a mix
    of half and float in a promote function in float; with autocast off nothing is cast, as
    under Apex without O1. Differences: (1) the wrapped function's own body runs with autocast
    off, whereas Apex's patches stayed active inside it (this matters only for Python functions
    that call other listed ops); (2) the wrapper acts wherever autocast is on, whereas Apex
    registrations only took effect if made before an O1 `amp.initialize`; (3) `float64` tensors
    are cast too (as Apex did), but only tensors on the autocast device (Apex: only CUDA
    tensors); (4) `disable_casts` restores autocast when its body raises (Apex left casts off).
    Registrations whose arguments are not a module expression and a string literal, and
    registrations whose result is used, are not rewritten and send the file to the shim.

Example
    amp.register_half_function(torch, "bmm")      torch.bmm = _cast_inputs("cuda", torch.float16)(torch.bmm)

    @amp.float_function                           @_cast_inputs("cuda", torch.float32)
    def log_partition(x): ...                     def log_partition(x): ...

    with amp.disable_casts():                     with torch.autocast(device_type="cuda", enabled=False):
        y = exact_reduction(x)                        y = exact_reduction(x)
"""

from __future__ import annotations

from typing import Optional, Union

import libcst as cst
import libcst.matchers as m
from libcst.codemod.visitors import AddImportsVisitor
from libcst.metadata import QualifiedNameProvider

from ..diagnostics import Severity, define
from .base import Rule
from .facts import Fact

REGISTERED = define(
    "AMP400",
    "cast-registration-to-wrapper",
    Severity.INFO,
    "`amp.register_*_function(mod, name)` became a cast wrapper installed on `mod.name`.",
    "Apex's O1 patched registered functions when `amp.initialize` ran. Native autocast has no "
    "registry, so the function is wrapped in place: while autocast is on for the device, its "
    "floating-point tensor arguments are cast (half: the autocast dtype; float: float32; "
    "promote: the widest dtype among them) and it runs with autocast off. Behaviour note: the "
    "wrapper acts in every autocast region from the moment the assignment runs (an Apex "
    "registration made after `amp.initialize` was silently ignored), and the function's body "
    "runs with autocast off (Apex's patches stayed active inside it).",
    before='amp.register_float_function(torch, "softmax")',
    after='torch.softmax = _cast_inputs("cuda", torch.float32)(torch.softmax)',
)
DECORATED = define(
    "AMP401",
    "cast-decorator-to-wrapper",
    Severity.INFO,
    "`@amp.half_function` / `float_function` / `promote_function` became `@_cast_inputs(...)`.",
    "Apex's decorators looked up the O1 handle at call time and cast the arguments when one was "
    "active. The generated `_cast_inputs` does the same with native autocast: it casts the "
    "floating-point tensor arguments on the autocast device when autocast is on and calls the "
    "function with autocast off; outside autocast it calls the function unchanged. Behaviour "
    "note: Apex's patches stayed active inside the decorated function's body; here the body "
    "runs with autocast off, so every op in it computes in the cast dtype. "
    "The message names the decorator (or the call `amp.half_function(f)`) and the dtype of the "
    "cast wrapper it became.",
    before="@amp.float_function\ndef log_partition(x):\n    return x.exp().sum().log()",
    after='@_cast_inputs("cuda", torch.float32)\ndef log_partition(x):\n    return x.exp().sum().log()',
    variants=("cast wrapper",),
)
CUSTOM_FWD = define(
    "AMP402",
    "cast-decorator-to-custom-fwd",
    Severity.INFO,
    "An Apex cast decorator on `autograd.Function.forward` became `torch.amp.custom_fwd`.",
    "`torch.amp.custom_fwd(device_type=..., cast_inputs=dtype)` is PyTorch's own form of this "
    "recipe for custom autograd functions: under autocast it casts the floating-point tensor "
    "inputs on the device to `dtype` and runs `forward` with autocast off. Behaviour note: "
    "`float64` inputs are left alone (Apex cast them too), and `forward`'s body runs with "
    "autocast off, where Apex's patches stayed active inside it. `backward` is unchanged, as "
    "Apex left it.",
    before="class Gelu(torch.autograd.Function):\n    @staticmethod\n    @amp.half_function\n"
    "    def forward(ctx, x): ...",
    after="class Gelu(torch.autograd.Function):\n    @staticmethod\n"
    '    @torch.amp.custom_fwd(device_type="cuda", cast_inputs=torch.float16)\n'
    "    def forward(ctx, x): ...",
)
DISABLE_CASTS = define(
    "AMP403",
    "disable-casts-to-autocast-off",
    Severity.INFO,
    "`with amp.disable_casts():` became `with torch.autocast(device_type=..., enabled=False):`.",
    "Inside `disable_casts` Apex's O1 patches pass every call through uncast; a disabled "
    "autocast region does the same for native autocast. Behaviour notes: autocast is "
    "restored when the body raises (Apex left casts disabled after an exception), and outside "
    "any autocast region the block is a no-op (Apex raised AttributeError without O1).",
    before="with amp.disable_casts():\n    y = exact_reduction(x)",
    after='with torch.autocast(device_type="cuda", enabled=False):\n    y = exact_reduction(x)',
)
REGISTRATION_NOT_UNDERSTOOD = define(
    "AMP410",
    "cast-registration-not-migrated",
    Severity.WARNING,
    'This `amp.register_*_function` call is not `register_*_function(module, "name")` as a '
    "statement; the file uses the shim.",
    "The native form assigns a wrapper to `module.name` at the place of the registration, "
    "which needs the module as an expression that can be assigned to (`torch`, "
    "`torch.nn.functional`, `my_ops`) and the name as a string literal. A name computed at run "
    "time (a variable, a loop over names) or a registration whose result is used cannot be "
    "rewritten safely, so the file keeps Apex's behaviour through the shim. Write the "
    "registrations out one per literal name, or migrate them by hand. "
    "The message says which case this is: the registration is used as a value (only a "
    "registration statement can become an assignment), or its module is not a dotted name or its "
    "function name not a string literal.",
    before='for name in ("bmm", "baddbmm"):\n    amp.register_half_function(torch, name)',
    after='from amp_shim import amp\nfor name in ("bmm", "baddbmm"):\n    amp.register_half_function(torch, name)',
    falls_back=True,
    refusal="a cast registration not in the one provable shape",
    variants=(
        "used as a value",
        "string literal",
    ),
    fallback_title="a cast registration that is not one statement with a literal name",
    shape=(
        "`for name in FP16_OPS: amp.register_half_function(torch, name)` (a name computed at run time), a "
        "registration on a module that is not a dotted name (`amp.register_float_function(get_module(), "
        '"softmax")`), or a registration whose result is used as a value.'
    ),
    by_hand=(
        "Write the registrations out as statements, one per literal name (`amp.register_half_function(torch, "
        '"bmm")`), then re-run: each becomes an assignment that wraps the function; or leave them to the '
        "shim."
    ),
)

_AMP_INTERNAL_MODULES = ("apex.amp.amp.", "apex.amp.handle.", "apex.amp.frontend.")
_REGISTER = {
    "apex.amp.register_half_function": "half",
    "apex.amp.register_float_function": "float",
    "apex.amp.register_promote_function": "promote",
}
_DECORATOR = {
    "apex.amp.half_function": "half",
    "apex.amp.float_function": "float",
    "apex.amp.promote_function": "promote",
}
_DISABLE_CASTS = "apex.amp.disable_casts"
_AUTOGRAD_FUNCTION = {"torch.autograd.Function", "torch.autograd.function.Function"}
HELPER_NAME = "_cast_inputs"

_HELPER = '''
def {name}(device_type, dtype):
    """Cast a function's inputs the way a registered Apex O1 function did, on top of autocast.

    Returns a decorator. While autocast is on for `device_type`, the wrapped function gets its
    floating-point tensors on that device (also inside list and tuple arguments) cast to `dtype`,
    or with "widest" to the widest floating dtype among them, and runs with autocast off.
    Outside autocast it is called unchanged.
    """

    def eligible(value):
        return (isinstance(value, torch.Tensor) and value.is_floating_point()
                and value.device.type == device_type)

    def cast(value, to):
        if eligible(value):
            return value.to(to)
        if type(value) in (list, tuple):
            return type(value)(cast(item, to) for item in value)
        return value

    def widest(values):
        dtypes = set()
        for value in values:
            for item in value if type(value) in (list, tuple) else (value,):
                if eligible(item):
                    dtypes.add(item.dtype)
        return functools.reduce(torch.promote_types, dtypes) if dtypes else None

    def decorate(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if not torch.is_autocast_enabled(device_type):
                return fn(*args, **kwargs)
            to = widest((*args, *kwargs.values())) if dtype == "widest" else dtype
            with torch.autocast(device_type, enabled=False):
                if to is None:
                    return fn(*args, **kwargs)
                args = [cast(a, to) for a in args]
                kwargs = {{k: cast(v, to) for k, v in kwargs.items()}}
                return fn(*args, **kwargs)

        return wrapper

    return decorate
'''


def _amp_api(name: Optional[str]) -> Optional[str]:
    """`apex.amp.amp.register_half_function` and friends under their public name."""
    if name is None:
        return None
    for internal in _AMP_INTERNAL_MODULES:
        if name.startswith(internal):
            return "apex.amp." + name[len(internal) :]
    return name


def _module_expression(node: cst.BaseExpression) -> bool:
    """A dotted name (`torch`, `torch.nn.functional`, `ops`) that an assignment can target."""
    if isinstance(node, cst.Name):
        return True
    return isinstance(node, cst.Attribute) and _module_expression(node.value)


def _registration_arguments(call: cst.Call) -> Optional[tuple[cst.BaseExpression, str]]:
    """`(module, "name")` of a registration call, or None if it is not that simple shape."""
    by_position: list[cst.BaseExpression] = []
    by_keyword: dict[str, cst.BaseExpression] = {}
    for arg in call.args:
        if arg.star:
            return None
        if arg.keyword is None:
            by_position.append(arg.value)
        else:
            by_keyword[arg.keyword.value] = arg.value
    params = dict(zip(("module", "name"), by_position))
    if len(by_position) > 2 or set(params) & set(by_keyword):
        return None
    params.update(by_keyword)
    if set(params) != {"module", "name"}:
        return None
    module, name = params["module"], params["name"]
    if not _module_expression(module) or not isinstance(name, cst.SimpleString):
        return None
    value = name.evaluated_value
    if not isinstance(value, str) or not value.isidentifier():
        return None
    return module, value


def _leading_imports_end(module: cst.Module) -> int:
    """Index after the module docstring and the import statements (and guards) that open it."""
    end = 0
    for index, stmt in enumerate(module.body):
        if m.matches(stmt, m.SimpleStatementLine(body=[m.Expr(m.SimpleString())])) and index == 0:
            end = 1
        elif isinstance(stmt, cst.SimpleStatementLine) and all(
            isinstance(s, (cst.Import, cst.ImportFrom)) for s in stmt.body
        ):
            end = index + 1
        elif isinstance(stmt, (cst.Try, cst.If)) and all(
            m.matches(s, m.SimpleStatementLine(body=[m.Import() | m.ImportFrom()])) for s in stmt.body.body
        ):
            end = index + 1
        else:
            break
    return end


class CastRegistrationToAutocast(Rule):
    """Apex's cast registry, cast decorators and `disable_casts` as native autocast code."""

    HANDLES = (*_REGISTER, *_DECORATOR, _DISABLE_CASTS)
    EMITS = (REGISTERED, DECORATED, CUSTOM_FWD, DISABLE_CASTS, REGISTRATION_NOT_UNDERSTOOD)
    READS = frozenset({Fact.APEX_ANALYSED})
    WRITES = frozenset({Fact.APEX_CALLS_REWRITTEN, Fact.FALLBACK_REASONS, Fact.IMPORT_REQUESTS})

    MARKERS = ("_function", "disable_casts")
    APEX_ON_THE_LINE = True

    def interest(self):
        return self.words_for(*_REGISTER, *_DECORATOR, _DISABLE_CASTS)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._helper = HELPER_NAME
        self._helper_used = False
        self._first_use: Optional[int] = None
        self._top_index: dict[int, int] = {}

    # -- the file ---------------------------------------------------------------------------
    def visit_Module(self, node: cst.Module) -> None:
        taken = self.names_in_use(node)
        suffix = 0
        while self._helper in taken:
            suffix += 1
            self._helper = f"{HELPER_NAME}_{suffix}"
        self._top_index = {id(stmt): i for i, stmt in enumerate(node.body)}

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        tree = super().transform_module_impl(tree)
        if not self._helper_used:
            return tree
        AddImportsVisitor.add_needed_import(self.context, "functools")
        AddImportsVisitor.add_needed_import(self.context, "torch")
        at = _leading_imports_end(tree)
        if self._first_use is not None:
            at = min(at, self._first_use)
        helper = cst.parse_module(_HELPER.format(name=self._helper)).body[0]
        helper = helper.with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine()])
        body = list(tree.body)
        if at < len(body):
            following = body[at]
            body[at] = following.with_changes(
                leading_lines=[cst.EmptyLine(), cst.EmptyLine()]
                + [line for line in following.leading_lines if line.comment is not None]
            )
        body.insert(at, helper)
        return tree.with_changes(body=body)

    # -- helpers ----------------------------------------------------------------------------
    def _api(self, node: cst.CSTNode) -> Optional[str]:
        return _amp_api(self.apex_name(node))

    def _use_helper(self, original: cst.CSTNode) -> None:
        self._helper_used = True
        top = original
        for ancestor in self.ancestors(original):
            if isinstance(ancestor, cst.Module):
                break
            top = ancestor
        index = self._top_index.get(id(top))
        if index is not None and (self._first_use is None or index < self._first_use):
            self._first_use = index

    def _dtype(self, kind: str) -> cst.BaseExpression:
        AddImportsVisitor.add_needed_import(self.context, "torch")
        if kind == "promote":
            return cst.SimpleString('"widest"')
        if kind == "float":
            return cst.parse_expression("torch.float32")
        return cst.parse_expression("torch.bfloat16" if self.options.dtype == "bfloat16" else "torch.float16")

    def _device(self) -> cst.SimpleString:
        return cst.SimpleString(f'"{self.options.device}"')

    def _cast_inputs(self, kind: str) -> cst.Call:
        return cst.Call(cst.Name(self._helper), [cst.Arg(self._device()), cst.Arg(self._dtype(kind))])

    # -- registrations ----------------------------------------------------------------------
    def leave_Expr(self, original_node: cst.Expr, updated_node: cst.Expr) -> Union[cst.Expr, cst.Assign]:
        call = original_node.value
        if not isinstance(call, cst.Call):
            return updated_node
        kind = _REGISTER.get(self._api(call.func) or "")
        if kind is None:
            return updated_node
        found = _registration_arguments(call)
        if found is None:
            self.report(
                call,
                REGISTRATION_NOT_UNDERSTOOD,
                f"`{self.code_of(call)}`: the module must be a dotted name and the "
                "function name a string literal; the file uses the shim",
            )
            return updated_node
        module, name = found
        target = cst.Attribute(value=module, attr=cst.Name(name))
        self._use_helper(original_node)
        self.report(
            call,
            REGISTERED,
            f"`{self.code_of(call)}` became a {kind} cast wrapper on "
            f"`{self.code_of(target)}`; it casts under autocast, with autocast off inside",
        )
        return cst.Assign(
            targets=[cst.AssignTarget(target)],
            value=cst.Call(self._cast_inputs(kind), [cst.Arg(target)]),
            semicolon=updated_node.semicolon,
        )

    # -- decorators -------------------------------------------------------------------------
    def _autograd_forward(self, decorator: cst.Decorator) -> bool:
        """The decorator sits under `@staticmethod` on `forward(ctx, ...)` of an autograd Function."""
        func = self.parent(decorator)
        if not isinstance(func, cst.FunctionDef) or func.name.value != "forward":
            return False
        params = func.params.posonly_params or func.params.params
        if not params or params[0].name.value != "ctx":
            return False
        above = func.decorators[: func.decorators.index(decorator)]
        if not any(m.matches(d.decorator, m.Name("staticmethod")) for d in above):
            return False
        block = self.parent(func)
        cls = self.parent(block) if block is not None else None
        if not isinstance(cls, cst.ClassDef):
            return False
        if any(isinstance(s, cst.FunctionDef) and s.name.value == "setup_context" for s in cls.body.body):
            return False
        for base in cls.bases:
            names = {q.name for q in self.get_metadata(QualifiedNameProvider, base.value, set())}
            if names & _AUTOGRAD_FUNCTION:
                return True
        return False

    def leave_Decorator(self, original_node: cst.Decorator, updated_node: cst.Decorator) -> cst.Decorator:
        kind = _DECORATOR.get(self._api(original_node.decorator) or "")
        if kind is None:
            return updated_node
        if kind != "promote" and self._autograd_forward(original_node):
            dtype = self._dtype(kind)
            replacement = cst.Call(
                cst.parse_expression("torch.amp.custom_fwd"),
                [
                    cst.Arg(
                        self._device(),
                        keyword=cst.Name("device_type"),
                        equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")),
                    ),
                    cst.Arg(
                        dtype,
                        keyword=cst.Name("cast_inputs"),
                        equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")),
                    ),
                ],
            )
            self.report(
                original_node,
                CUSTOM_FWD,
                f"`@{self.code_of(original_node.decorator)}` on `forward` became "
                f"`@torch.amp.custom_fwd(..., cast_inputs={self.code_of(dtype)})`",
            )
            return updated_node.with_changes(decorator=replacement)
        self._use_helper(original_node)
        self.report(
            original_node,
            DECORATED,
            f"`@{self.code_of(original_node.decorator)}` became a {kind} cast wrapper",
        )
        return updated_node.with_changes(decorator=self._cast_inputs(kind))

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        """The call form of the decorators: `f = amp.half_function(f)`."""
        api = self._api(original_node.func) or ""
        if api in _REGISTER and not isinstance(self.parent(original_node), cst.Expr):
            self.report(
                original_node,
                REGISTRATION_NOT_UNDERSTOOD,
                f"`{self.code_of(original_node)}` is used as a value; only a registration "
                "statement can become an assignment; the file uses the shim",
            )
            return updated_node
        kind = _DECORATOR.get(api)
        if kind is None:
            return updated_node
        if len(original_node.args) != 1 or original_node.args[0].keyword or original_node.args[0].star:
            return updated_node  # not Apex's signature: RemainingApexUses reports it
        self._use_helper(original_node)
        self.report(
            original_node,
            DECORATED,
            f"`{self.code_of(original_node.func)}(...)` became a {kind} cast wrapper",
        )
        return updated_node.with_changes(func=self._cast_inputs(kind))

    # -- disable_casts ----------------------------------------------------------------------
    def leave_WithItem(self, original_node: cst.WithItem, updated_node: cst.WithItem) -> cst.WithItem:
        call = original_node.item
        if not isinstance(call, cst.Call) or call.args or original_node.asname is not None:
            return updated_node
        if self._api(call.func) != _DISABLE_CASTS:
            return updated_node
        AddImportsVisitor.add_needed_import(self.context, "torch")
        replacement = cst.parse_expression(
            f'torch.autocast(device_type="{self.options.device}", enabled=False)'
        )
        self.report(
            original_node, DISABLE_CASTS, f"`{self.code_of(call)}` became `{self.code_of(replacement)}`"
        )
        return updated_node.with_changes(item=replacement)
