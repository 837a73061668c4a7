"""A rebound Apex name: each read is Apex's only where the Apex import is the one binding that
can reach it; where another binding can reach it too, the file falls back (AMP020) at that read."""

from __future__ import annotations

import textwrap

import libcst as cst
import libcst.matchers as m
import pytest

from amp_migrate import migrate_source
from amp_migrate.analysis.binding import ApexBinder
from amp_migrate.analysis.reaching import Reaching


def verdicts(source: str, names=("amp",)) -> dict[str, str]:
    """`amp.rN()` probe reads → "apex" (only Apex's import reaches), "other" (no Apex binding
    reaches) or "mixed"."""
    module = cst.parse_module(textwrap.dedent(source))
    reads = Reaching(module, names).reads
    out = {}
    for call in m.findall(module, m.Call(func=m.Attribute(value=m.Name(), attr=m.Name()))):
        probe = call.func.attr.value
        if not (probe[0] == "r" and probe[1:].isdigit()):
            continue
        reaching = reads[call.func.value]
        apex = any(b.apex for b in reaching)
        other = any(b.apex is None and not b.harmless for b in reaching)
        out[probe] = "mixed" if apex and other else "apex" if apex else "other"
    return out


def test_module_level_rebinding_splits_reads_before_and_after():
    assert verdicts("""
        from apex import amp
        amp.r1()
        amp = Helper()
        amp.r2()
    """) == {"r1": "apex", "r2": "other"}


def test_conditional_rebinding_makes_the_join_ambiguous():
    assert verdicts("""
        from apex import amp
        if debug:
            amp = Other()
            amp.r1()
        else:
            amp.r2()
        amp.r3()
    """) == {"r1": "other", "r2": "apex", "r3": "mixed"}


def test_global_rebinding_in_a_function_reaches_every_module_read():
    assert verdicts("""
        from apex import amp
        def use(recorder):
            global amp
            amp = recorder
            amp.r1()
        amp.r2()
        def later():
            amp.r3()
    """) == {"r1": "mixed", "r2": "mixed", "r3": "mixed"}


def test_a_function_sees_every_binding_of_the_module_name():
    assert verdicts("""
        from apex import amp
        def save():
            amp.r1()
        amp.r2()
        amp = Profiler()
    """) == {"r1": "mixed", "r2": "apex"}
    assert verdicts("""
        from apex import amp
        def save():
            amp.r1()
        def local(amp):
            amp.r2()
        def imports_its_own():
            import logging as amp
            amp.r3()
    """) == {"r1": "apex", "r2": "other", "r3": "other"}


def test_import_error_guards_are_harmless_but_other_try_bodies_are_not():
    assert verdicts("""
        try:
            from apex import amp
        except ImportError:
            amp = None
        amp.r1()
    """) == {"r1": "apex"}
    assert verdicts("""
        try:
            from apex import amp
        except ImportError:
            amp = FallbackAmp()
            amp.r1()
        amp.r2()
    """) == {"r1": "other", "r2": "apex"}
    # the handler can run with Apex installed (the probe may fail): its binding is real
    assert verdicts("""
        try:
            from apex import amp
            amp.r1()
        except Exception:
            amp = FallbackAmp()
        amp.r2()
    """) == {"r1": "apex", "r2": "mixed"}


def test_loop_variables():
    assert verdicts("""
        from apex import amp
        amp.r1()
        for amp in meters:
            amp.r2()
        amp.r3()
    """) == {"r1": "apex", "r2": "other", "r3": "mixed"}
    assert verdicts("""
        from apex import amp
        while running:
            amp.r1()
            amp = Other()
    """) == {"r1": "mixed"}


def test_break_carries_the_state_it_leaves_with():
    assert verdicts("""
        from apex import amp
        for x in xs:
            amp = Other()
            if x:
                break
            amp = Third()
        amp.r1()
    """) == {"r1": "mixed"}
    assert verdicts("""
        from apex import amp
        amp = Other()
        for x in xs:
            from apex import amp
            if x:
                break
            amp = Other()
        else:
            amp = Other()
        amp.r1()
    """) == {"r1": "mixed"}


def test_with_targets_imports_and_del():
    assert verdicts("""
        from apex import amp
        with open(p) as amp:
            amp.r1()
        amp.r2()
    """) == {"r1": "other", "r2": "other"}
    assert verdicts("""
        from apex import amp
        amp.r1()
        import logging as amp
        amp.r2()
    """) == {"r1": "apex", "r2": "other"}
    assert verdicts("""
        from apex import amp
        if c:
            del amp
        amp.r1()
        del amp
        amp.r2()
    """) == {"r1": "mixed", "r2": "other"}


def test_try_handler_sees_every_state_its_body_passed_through():
    assert verdicts("""
        from apex import amp
        try:
            amp = Other()
            risky()
            from apex import amp
        except ValueError:
            amp.r1()
        finally:
            amp.r2()
    """) == {"r1": "mixed", "r2": "mixed"}
    assert verdicts("""
        from apex import amp
        try:
            pass
        except ValueError as amp:
            amp.r1()
        amp.r2()
    """) == {"r1": "other", "r2": "mixed"}


def test_comprehension_and_class_scopes_do_not_leak():
    assert verdicts("""
        from apex import amp
        values = [amp.r1() for amp in meters]
        amp.r2()
        class Config:
            amp = Other()
            amp.r3()
            def method(self):
                amp.r4()
        amp.r5()
    """) == {"r1": "other", "r2": "apex", "r3": "other", "r4": "apex", "r5": "apex"}


def test_walrus_and_match_captures_may_rebind():
    assert verdicts("""
        from apex import amp
        if (amp := pick()):
            pass
        amp.r1()
    """) == {"r1": "mixed"}
    assert verdicts("""
        from apex import amp
        match value:
            case Point(x=amp):
                amp.r1()
        amp.r2()
    """) == {"r1": "mixed", "r2": "mixed"}


def test_closure_reads_see_every_binding_of_the_enclosing_function():
    assert verdicts("""
        def train():
            from apex import amp
            def log():
                amp.r1()
            amp.r2()
            amp = Logger()
    """) == {"r1": "mixed", "r2": "apex"}


def test_binder_answers_from_the_flow_when_a_name_is_rebound():
    module = cst.parse_module(
        "from apex import amp\namp.initialize(m, o)\namp = Helper()\namp.initialize(m, o)\n"
    )
    binder = ApexBinder(module, lambda *a, **k: set())
    first, second = m.findall(module, m.Call(func=m.Attribute(attr=m.Name("initialize"))))
    assert binder.table is None
    assert binder.name_of(first.func) == "apex.amp.initialize"
    assert binder.name_of(second.func) is None


def test_the_diagnostic_names_the_read_and_the_other_binding():
    source = textwrap.dedent("""\
        import torch
        from apex import amp
        if args.dry_run:
            amp = DryRunAmp()
        model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    """)
    result = migrate_source(source, target="auto")
    assert result.target_used == "shim"
    (found,) = [d for d in result.diagnostics if d.code == "AMP020"]
    assert (found.line, found.col) == (5, 20)
    assert "`amp = DryRunAmp()` (line 4)" in found.message
    assert "`from apex import amp` (line 2)" in found.message


@pytest.mark.parametrize("rebinding", ["amp = None", "amp = Helper()"])
def test_reads_that_only_the_other_binding_reaches_are_left_alone(rebinding):
    source = textwrap.dedent(f"""\
        import torch
        from apex import amp
        model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
        loss = model(x).sum()
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()
        {rebinding}
        print(amp)
    """)
    result = migrate_source(source, target="native")
    assert result.target_used == "native", result.diagnostics
    assert "apex" not in result.code
    assert result.code.endswith(f"{rebinding}\nprint(amp)\n")
