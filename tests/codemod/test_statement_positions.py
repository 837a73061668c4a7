"""`initialize`, `scale_loss` and the step in every statement position a block can hold.

The planner reads where a statement stands (its block, the `if` around it, the arm it is in);
each kind of block is a shape it must either plan or refuse with a located reason, never an
internal error. An `elif` arm once reached an assertion: its `if` stands in the chain, not in a
block. Each native result also runs, so a plan placed in a block that does not run it, or that
runs it twice, shows.
"""

from __future__ import annotations

import textwrap

import pytest

from amp_migrate.migrate import migrate_source

HEAD = """import torch
from apex import amp

torch.manual_seed(0)
model = torch.nn.Linear(4, 4)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
flag = other = True
steps = []
"""
INIT = 'model, optimizer = amp.initialize(model, optimizer, opt_level="O1")'
TRAIN = """for x in [torch.randn(2, 4), torch.randn(2, 4)]:
    loss = model(x).sum()
    optimizer.zero_grad()
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
    optimizer.step()
    steps.append(loss.item())"""


def _in(text: str, depth: int = 1) -> str:
    return textwrap.indent(text, "    " * depth)


#: name -> (wrap the statements in the position, whether the wrapped statements run)
POSITIONS = {
    "module": (lambda b: b, True),
    "if": (lambda b: "if flag:\n" + _in(b), True),
    "else arm": (lambda b: "if not flag:\n    pass\nelse:\n" + _in(b), True),
    "elif arm": (lambda b: "if not flag:\n    pass\nelif other:\n" + _in(b), True),
    "elif arm before else": (
        lambda b: "if not flag:\n    pass\nelif other:\n" + _in(b) + "\nelse:\n    pass",
        True,
    ),
    "try": (lambda b: "try:\n" + _in(b) + "\nexcept ImportError:\n    raise", True),
    "except": (lambda b: "try:\n    raise KeyError\nexcept KeyError:\n" + _in(b), True),
    "try else": (lambda b: "try:\n    pass\nexcept KeyError:\n    raise\nelse:\n" + _in(b), True),
    "finally": (lambda b: "try:\n    pass\nfinally:\n" + _in(b), True),
    "with": (lambda b: "with torch.no_grad():\n    pass\nwith open(__file__):\n" + _in(b), True),
    "match case": (
        lambda b: "match flag:\n    case True:\n" + _in(b, 2) + "\n    case _:\n        pass",
        True,
    ),
    "function": (lambda b: "def main():\n" + _in(b) + "\n\nmain()", True),
    "nested function": (
        lambda b: "def outer():\n    def main():\n" + _in(b, 2) + "\n    main()\n\nouter()",
        True,
    ),
    "method": (lambda b: "class Trainer:\n    def run(self):\n" + _in(b, 2) + "\n\nTrainer().run()", True),
    "nested class": (
        lambda b: (
            "class Outer:\n    class Trainer:\n        def run(self):\n"
            + _in(b, 3)
            + "\n\nOuter.Trainer().run()"
        ),
        True,
    ),
    "for else": (lambda b: "for _ in []:\n    pass\nelse:\n" + _in(b), True),
    "while else": (lambda b: "while False:\n    pass\nelse:\n" + _in(b), True),
    "while body": (lambda b: "while True:\n" + _in(b) + "\n    break", True),
    "async function": (lambda b: "async def main():\n" + _in(b), False),
}
#: which statements the position holds: `initialize` alone, the training loop alone, or both
PARTS = {
    "initialize": lambda wrap: wrap(INIT) + "\n" + TRAIN,
    "training": lambda wrap: INIT + "\n" + wrap(TRAIN),
    "both": lambda wrap: wrap(INIT + "\n" + TRAIN),
}


@pytest.mark.parametrize("part", PARTS)
@pytest.mark.parametrize("position", POSITIONS)
def test_every_statement_position_is_planned_or_refused_with_a_reason_and_runs(position, part):
    wrap, runs = POSITIONS[position]
    text = HEAD + PARTS[part](wrap) + "\n"
    result = migrate_source(text, device="cpu")
    compile(result.code, "<migrated>", "exec")
    for diagnostic in result.diagnostics:
        assert diagnostic.line >= 1 and "internal error" not in diagnostic.message, diagnostic
    if "amp_shim" in result.code or "apex" in result.code:
        assert not (part == "both" and runs), (
            f"a whole training in one block keeps the shim: {result.diagnostics}"
        )
        assert any(d.falls_back for d in result.diagnostics), result.diagnostics
        return
    assert "GradScaler" in result.code and "torch.autocast" in result.code, result.code
    namespace: dict = {"__file__": __file__, "__name__": "__main__"}
    exec(compile(result.code, "<migrated>", "exec"), namespace)
    if runs:
        assert len(namespace["steps"]) == 2, result.code
    elif part != "initialize":  # (an `initialize` that never runs: Apex raised at `scale_loss`)
        assert namespace["steps"] == [], result.code
