"""An `initialize` that only prepares models for inference goes native only where the autocast
region after it provably covers what Apex cast (plan/inference.py); each escape falls back with
AMP150 naming it. A second `initialize` beside the training one is dropped only where Apex's
rebuilt scalers were the first call's (AMP152)."""

from __future__ import annotations

import textwrap

import pytest

from amp_migrate import migrate_source

HEAD = "import torch\nfrom apex import amp\n\n\n"


def _migrate(body: str):
    return migrate_source(HEAD + textwrap.dedent(body), target="native")


def _codes(result) -> set[str]:
    return {d.code for d in result.diagnostics}


ESCAPES = {
    "wrapper returned": (
        """
        def load(path):
            model = amp.initialize(torch.load(path), opt_level="O2")
            wrapped = torch.nn.DataParallel(model)
            return wrapped
        """,
        "`wrapped` is returned",
    ),
    "kept by a container": (
        """
        def load(path, registry):
            model = torch.load(path)
            model = amp.initialize(model, opt_level="O2")
            registry.append(model)
        """,
        "handed to `.append()`",
    ),
    "stored on an object": (
        """
        def load(path, holder):
            model = torch.load(path)
            model = amp.initialize(model, opt_level="O3")
            holder.model = model
        """,
        "is stored at line",
    ),
    "read by a closure": (
        """
        def serve(path):
            model = torch.load(path)
            model = amp.initialize(model, opt_level="O2")
            def predict(x):
                return model(x)
            register(predict)
        """,
        "nested function",
    ),
    "generator": (
        """
        def predictions(path, batches):
            model = torch.load(path)
            model = amp.initialize(model, opt_level="O2")
            for x in batches:
                yield model(x)
        """,
        "generator",
    ),
    "backward in the region": (
        """
        def tune(path, x):
            model = torch.load(path)
            model = amp.initialize(model, opt_level="O2")
            model(x).sum().backward()
        """,
        "backward pass",
    ),
    "inside a loop": (
        """
        def score_all(paths, x):
            for path in paths:
                model = torch.load(path)
                model = amp.initialize(model, opt_level="O2")
                print(model(x))
        """,
        "`for` statement",
    ),
    "O1 in a function called mid-script": (
        """
        def score(path, x):
            model = torch.load(path)
            model = amp.initialize(model, opt_level="O1")
            print(model(x))

        if __name__ == "__main__":
            score("a.pt", torch.ones(2))
            print(torch.ones(2, 2) @ torch.ones(2, 2))
        """,
        "runs after the region",
    ),
}


@pytest.mark.parametrize("body, reason", ESCAPES.values(), ids=list(ESCAPES))
def test_a_model_escaping_the_region_falls_back_with_the_escape_named(body, reason):
    result = _migrate(body)
    assert result.target_used is None
    found = [d for d in result.diagnostics if d.code == "AMP150"]
    assert found and reason in found[0].message


def test_o1_inference_as_the_scripts_last_step_covers_the_rest_of_the_script():
    result = _migrate("""
        def score(path, x):
            model = torch.load(path)
            model = amp.initialize(model, opt_level="O1")
            logits = model(x)
            return logits.softmax(-1) @ logits.t()

        if __name__ == "__main__":
            score("a.pt", torch.ones(2))
        """)
    assert result.target_used == "native"
    assert (
        'with torch.autocast("cuda", dtype=torch.float16):\n        logits = model(x)\n'
        "        return logits.softmax(-1) @ logits.t()" in result.code
    )


def test_o0_inference_initialize_only_goes_away():
    result = _migrate("""
        def score(path, x):
            model = amp.initialize(torch.load(path), opt_level="O0")
            return model(x)
        """)
    assert result.target_used == "native"
    assert "autocast" not in result.code and "amp" not in result.code.replace("import torch", "")


TRAIN = """
    def main(args):
        model, ema = build(), build()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
        {between}
        ema_optimizer = torch.optim.SGD(ema.parameters(), lr=0)
        ema, ema_optimizer = amp.initialize(ema, ema_optimizer, opt_level="{level}")
        for x in loader():
            loss = (model(x) - ema(x).detach()).pow(2).mean()
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
            optimizer.step()
            {ema_step}
    """


@pytest.mark.parametrize(
    "between, level, ema_step, dropped",
    [
        ("pass", "O1", "pass", True),
        ("pass", "O2", "pass", False),  # other options: Apex's rebuilt scaler and casts differ
        ("pass", "O1", "ema_optimizer.step()", False),  # the EMA optimizer is stepped
        ("warm_up(model, optimizer)", "O1", "pass", False),  # code of this file runs in between
    ],
    ids=["same-options", "other-options", "ema-stepped", "call-between"],
)
def test_second_initialize_is_dropped_only_where_apex_rebuilt_the_same_unused_scaler(
    between, level, ema_step, dropped
):
    source = TRAIN.format(between=between, level=level, ema_step=ema_step)
    if "warm_up" in between:
        source = "\ndef warm_up(model, optimizer):\n    pass\n" + source
    result = _migrate(source)
    assert ("AMP152" in _codes(result)) is dropped
    assert (result.target_used == "native") is dropped
