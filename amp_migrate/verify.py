"""The pipeline's own checks on every output, so that a rule bug never reaches a user's file.

Like a linter's undefined-name check, names are compared before and after: a name that the
input could resolve (or never used) must not become unresolvable in the output.
"""
from __future__ import annotations

import builtins

import libcst as cst
import libcst.matchers as m
from libcst.metadata import MetadataWrapper, ScopeProvider

_BUILTINS = set(dir(builtins)) | {"__file__", "__name__", "__doc__", "__spec__", "__loader__",
                                  "__package__", "__builtins__", "__path__", "__annotations__"}


def undefined_names(module: cst.Module) -> set[str]:
    """Names read somewhere that no scope on the way out assigns."""
    scopes = MetadataWrapper(module, unsafe_skip_copy=True).resolve(ScopeProvider)
    missing: set[str] = set()
    for scope in set(scopes.values()):
        if scope is None:
            continue
        for access in scope.accesses:
            name = access.node.value if isinstance(access.node, cst.Name) else None
            if name is None or name in _BUILTINS:
                continue
            if not access.referents:
                missing.add(name)
    # libcst's scope analysis misses names bound by a nested `for` when an `if` follows it
    # (`[i for v in vs for i in v if i]`); comprehension targets are never "undefined".
    return missing - _comprehension_targets(module)


def _comprehension_targets(module: cst.Module) -> set[str]:
    return {n.value for comp in m.findall(module, m.CompFor()) for n in m.findall(comp.target, m.Name())}


def _compiles(code: str) -> bool:
    try:
        compile(code, "<amp-migrate input>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return False
    return True


class VerificationError(Exception):
    pass


def verify_output(before: cst.Module, after_code: str) -> cst.Module:
    """Parse and compile the output and check its names; raise VerificationError if not."""
    try:
        after = cst.parse_module(after_code)
    except cst.ParserSyntaxError as exc:
        raise VerificationError(f"the output does not parse: {exc.message} at line {exc.raw_line}") from exc
    try:
        compile(after_code, "<amp-migrate output>", "exec", dont_inherit=True)
    except SyntaxError as exc:
        # Syntax newer than this interpreter (a 3.12 `type` alias on 3.11) is judged by
        # libcst's parser alone; only a compile error the input did not have is a failure.
        if _compiles(before.code):
            raise VerificationError(f"the output does not compile: {exc.msg} at line {exc.lineno}") from exc
    new = undefined_names(after)
    if new:  # only then is the input's own set worth computing
        new -= undefined_names(before)
    if new:
        raise VerificationError("the output reads names that nothing defines: " + ", ".join(sorted(new)))
    return after
