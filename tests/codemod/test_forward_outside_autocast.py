"""AMP170 names, at their line, the forward calls Apex cast that the native file runs outside
every autocast region (an evaluation loop, an evaluation function, an EMA model), and only
those: never a call inside a region or in a function a region calls, never at O0, and never a
reason to fall back."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from amp_migrate import migrate_source

GOLDEN = Path(__file__).resolve().parents[2] / "fixtures" / "rules" / "eval_casts"
HEAD = "import copy\nimport torch\nimport torch.nn.functional as F\nfrom apex import amp\n"


def _outside(source: str, **options) -> list[tuple[int, str]]:
    result = migrate_source(source, target="auto", **options)
    assert result.target_used == "native", result.diagnostics
    return [(d.line, d.message) for d in result.diagnostics if d.code == "AMP170"]


def _lines(body: str, level: str = '"O1"', **options) -> list[int]:
    source = HEAD + textwrap.dedent(body).replace("LEVEL", level)
    return [line for line, _ in _outside(source, **options)]


def _line_of(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


@pytest.mark.parametrize(
    "case, spelled",
    [
        ("eval_loop_same_function", "total += F.cross_entropy(model(x), y"),
        ("eval_function", "correct += (model(x).argmax"),
        ("ema_model", "return F.cross_entropy(self.ema(x), y)"),
    ],
)
def test_each_golden_case_names_its_evaluation_forward_at_its_line(case, spelled):
    path = GOLDEN / f"{case}.py"
    found = _outside(path.read_text())
    assert [line for line, _ in found] == [_line_of(path, spelled)]
    assert "natively it runs in float32" in found[0][1]
    assert 'wrap it in `with torch.autocast("cuda", dtype=torch.float16):`' in found[0][1]


TRAIN = """
def train(model, optimizer, batches, test_batches):
    model, optimizer = amp.initialize(model, optimizer, opt_level=LEVEL)
    for x, y in batches:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()
    model.eval()
    for x, y in test_batches:
        print(F.cross_entropy(model(x), y).item())
"""
EVAL_LINE = HEAD.count("\n") + 12


def test_the_training_forward_under_autocast_is_not_named_and_the_evaluation_is():
    assert _lines(TRAIN) == [EVAL_LINE]


def test_o0_and_enabled_false_cast_nothing_so_nothing_is_named():
    assert _lines(TRAIN, '"O0"') == []
    assert _lines(TRAIN.replace("opt_level=LEVEL", 'opt_level="O1", enabled=False')) == []


def test_o2_names_the_initialized_model_as_cast_by_apex_itself():
    [(line, message)] = _outside(HEAD + textwrap.dedent(TRAIN).replace("LEVEL", '"O2"'))
    assert line == EVAL_LINE and "Apex O2 cast `model` to float16" in message


def test_a_run_time_level_says_at_which_levels_apex_cast():
    [(line, message)] = _outside(HEAD + textwrap.dedent(TRAIN).replace("LEVEL", "args.opt_level"))
    assert line == EVAL_LINE
    assert "when `opt_level` was O1" in message and "O2 or O3" in message
    assert 'enabled=args.opt_level != "O0"' in message  # the autocast the file itself uses


def test_the_autocast_named_is_the_one_written_for_the_device_and_dtype():
    [(_, message)] = _outside(
        HEAD + textwrap.dedent(TRAIN).replace("LEVEL", '"O1"'), device="cpu", dtype="bfloat16"
    )
    assert 'with torch.autocast("cpu", dtype=torch.bfloat16):' in message


def test_a_user_autocast_around_the_evaluation_covers_it():
    body = TRAIN.replace(
        "    for x, y in test_batches:\n        print(",
        '    with torch.autocast("cuda"):\n        for x, y in test_batches:\n            print(',
    )
    assert _lines(body) == []


def test_a_helper_called_inside_the_region_runs_under_autocast_and_is_not_named():
    body = """
    def forward_loss(model, x, y):
        return F.cross_entropy(model(x), y)

    def train(model, optimizer, batches):
        model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
        for x, y in batches:
            optimizer.zero_grad()
            loss = forward_loss(model, x, y)
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
            optimizer.step()
    """
    assert _lines(body) == []


def test_a_forward_before_initialize_in_its_function_ran_in_float32_under_apex_too():
    body = """
    def train(model, optimizer, batches, x0, y0):
        print(F.cross_entropy(model(x0), y0).item())
        model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
        for x, y in batches:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
            optimizer.step()
    """
    assert _lines(body) == []


MODULES = """
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(x)

    def logits(self, x):
        return self.fc(x)

def main(batches, x_test):
    model = Net()
    teacher = Net().eval()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = amp.initialize(model, optimizer, opt_level=LEVEL)
    for x, y in batches:
        loss = F.cross_entropy(model(x), teacher(x).argmax(1))
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()
    print(teacher(x_test))
"""


def test_at_o1_another_module_of_the_file_is_named_but_not_a_modules_own_internals():
    source = (HEAD + textwrap.dedent(MODULES)).splitlines()
    assert _lines(MODULES) == [source.index("    print(teacher(x_test))") + 1]


def test_at_o2_a_module_initialize_did_not_cast_ran_in_float32_under_apex_too():
    assert _lines(MODULES, '"O2"') == []


def test_an_ema_wrapper_and_a_dataparallel_copy_are_followed_from_the_model():
    body = """
    def train(model, optimizer, batches, x_test):
        model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
        ema = ModelEMA(model, decay=0.999)
        parallel = torch.nn.DataParallel(model)
        for x, y in batches:
            loss = F.cross_entropy(parallel(x), y)
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
            optimizer.step()
            ema.update(model)
        print(ema.ema(x_test), parallel.module(x_test), ema.update(model))
    """
    found = _outside(HEAD + textwrap.dedent(body))
    assert [line for line, _ in found] == [HEAD.count("\n") + 12] * 2
    assert {message.split("(...)")[0] for _, message in found} == {"`ema.ema", "`parallel.module"}


def test_the_diagnostic_never_sends_a_file_to_the_shim():
    result = migrate_source(HEAD + textwrap.dedent(TRAIN).replace("LEVEL", '"O1"'), target="auto")
    [found] = [d for d in result.diagnostics if d.code == "AMP170"]
    assert result.target_used == "native" and not found.falls_back and found.severity == "info"


def test_a_file_that_falls_back_does_not_report_it():
    body = TRAIN.replace(
        "scaled_loss.backward()", "scaled_loss.backward()\n        amp._amp_state.handle = None"
    )
    result = migrate_source(HEAD + textwrap.dedent(body).replace("LEVEL", '"O1"'), target="auto")
    assert result.target_used == "shim"
    assert "AMP170" not in {d.code for d in result.diagnostics}


def test_a_function_away_from_initialize_gets_the_autocast_without_the_switch_it_cannot_read():
    body = """
    def evaluate(model, x):
        return model(x)

    def main(args, model, optimizer, batches, x_test):
        model, optimizer = amp.initialize(model, optimizer, opt_level=args.opt_level)
        for x, y in batches:
            loss = F.cross_entropy(model(x), y)
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
            optimizer.step()
        print(evaluate(model, x_test))
    """
    [(line, message)] = _outside(HEAD + textwrap.dedent(body))
    assert line == HEAD.count("\n") + 3
    assert 'wrap it in `with torch.autocast("cuda", dtype=torch.float16):`' in message
    assert 'the training region has `enabled=args.opt_level != "O0"`' in message


def test_a_function_decorated_with_autocast_runs_under_it_and_is_not_named():
    body = TRAIN.replace(
        "def train(", '@torch.autocast("cuda")\ndef evaluate(model, x):\n    return model(x)\n\n\ndef train('
    )
    assert _lines(body) == [EVAL_LINE + 5]
