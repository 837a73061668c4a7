"""Run one training program and record, from outside, what it did.

    python [-m amp_shim] recorder.py --mode shim|native RESULT.json PROGRAM.py [program args...]

The program runs unchanged (`runpy`, as `__main__`, with its own `sys.argv`). Nothing in it
reports to the harness; the recorder watches it through hooks installed before it starts:

* per-iteration losses: the lines the program prints (one line per iteration, holding
  `loss <value>`; several losses per line for the GAN), parsed as they are written;
* which optimizer really stepped in which iteration (the iteration is the number of loss lines
  printed so far): torch's global optimizer step hook; in native mode a `GradScaler.step` that
  found inf/NaN counts as skipped even when a fused optimizer ran its kernel (which then skips
  internally); in shim mode, a step that ran with a non-zero `optimizer.found_inf` (the shim's
  amp hands the skip to an optimizer that supports amp scaling that way, as GradScaler does)
  counts as skipped too;
* the loss scale(s) at every iteration: shim mode reads `_amp_state.loss_scalers` (and the
  scalers of the old API's `OptimWrapper`), native mode every `torch.amp.GradScaler` created
  (`get_scale()`, 1.0 when disabled);
* the final parameters: every optimizer's param groups in creation order (fp32 masters under
  the shim's O2), saved next to RESULT.json as RESULT.pt.

`--mode native` also makes `apex` and `amp_shim` unimportable and checks at exit that neither
was imported. `--mode shim` expects the shim: either the `apex` alias (`python -m amp_shim
recorder.py ...`) or code that imports `amp_shim` itself (the codemod's `--target shim` output).
"""

from __future__ import annotations

import argparse
import importlib.abc
import io
import json
import math
import os
import re
import runpy
import sys

LOSS = re.compile(
    r"\b[Ll]oss(?!_scale)(?:_\w+)?\s*[:=]?\s+([-+]?(?:inf|nan|\d+(?:\.\d*)?(?:[eE][-+]?\d+)?))\b"
)
BLOCKED = ("apex", "amp_shim")


class _Blocker(importlib.abc.MetaPathFinder):
    """Native mode: `import apex` / `import amp_shim` fail as on a machine without them."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(
                f"No module named {fullname!r} (blocked by the recorder)", name=fullname
            )
        return None


class Recorder:
    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.losses: list[list[float]] = []
        self.scales: list[list[float]] = []
        self.steps: list[list[int]] = []  # [iteration, optimizer index] of every real step
        self.optimizers: list = []
        self.grad_scalers: list = []
        self.optim_wrappers: list = []
        self._in_scaler_step = 0

    # -- clock: the loss lines ----------------------------------------------------------------
    def on_line(self, line: str) -> None:
        values = LOSS.findall(line)
        if not values:
            return
        self.losses.append([float(v) for v in values])
        self.scales.append(self.current_scales())

    @property
    def iteration(self) -> int:
        return len(self.losses)

    def current_scales(self) -> list[float]:
        if self.mode == "native":
            return [float(s.get_scale()) for s in self.grad_scalers]
        from amp_shim.amp._amp_state import _amp_state

        scales = [float(s.loss_scale()) for s in getattr(_amp_state, "loss_scalers", [])]
        for wrapper in self.optim_wrappers:
            scales.extend(float(s.loss_scale()) for s in wrapper._loss_scaler)
        return scales

    # -- hooks ------------------------------------------------------------------------------
    def optimizer_index(self, optimizer) -> int:
        for i, known in enumerate(self.optimizers):
            if known is optimizer:
                return i
        self.optimizers.append(optimizer)
        return len(self.optimizers) - 1

    def install(self) -> None:
        import torch

        recorder = self
        original_init = torch.optim.Optimizer.__init__

        def init(self, *args, **kwargs):
            original_init(self, *args, **kwargs)
            recorder.optimizer_index(self)

        setattr(torch.optim.Optimizer, "__init__", init)  # noqa: B010 - a patch, not an assignment mypy should check

        def post_hook(optimizer, args, kwargs):
            if recorder._in_scaler_step:
                return
            found_inf = getattr(optimizer, "found_inf", None)
            if isinstance(found_inf, torch.Tensor) and float(found_inf.sum()) != 0:
                return  # the kernel skipped the update on the device
            recorder.steps.append([recorder.iteration, recorder.optimizer_index(optimizer)])

        from torch.optim.optimizer import register_optimizer_step_post_hook

        register_optimizer_step_post_hook(post_hook)

        if self.mode == "native":
            self._install_native(torch)
        else:
            self._install_shim()

    def _install_native(self, torch) -> None:
        recorder = self
        scaler_cls = torch.amp.GradScaler
        original_init = scaler_cls.__init__
        original_step = scaler_cls.step

        def init(self, *args, **kwargs):
            original_init(self, *args, **kwargs)
            recorder.grad_scalers.append(self)

        def step(self, optimizer, *args, **kwargs):
            recorder._in_scaler_step += 1
            try:
                retval = original_step(self, optimizer, *args, **kwargs)
            finally:
                recorder._in_scaler_step -= 1
            state = self._per_optimizer_states.get(id(optimizer), {}) if self._enabled else {}
            found = sum(float(v.item()) for v in state.get("found_inf_per_device", {}).values())
            if not found:
                recorder.steps.append([recorder.iteration, recorder.optimizer_index(optimizer)])
            return retval

        scaler_cls.__init__ = init
        scaler_cls.step = step

    def _install_shim(self) -> None:
        from amp_shim.amp import opt

        recorder = self
        original_init = opt.OptimWrapper.__init__

        def init(self, *args, **kwargs):
            original_init(self, *args, **kwargs)
            recorder.optim_wrappers.append(self)

        setattr(opt.OptimWrapper, "__init__", init)  # noqa: B010 - a patch, not an assignment mypy should check

    # -- the result ---------------------------------------------------------------------------
    def final_params(self):
        return [
            [p.detach().float().cpu().clone() for group in o.param_groups for p in group["params"]]
            for o in self.optimizers
        ]


class _Tee(io.TextIOBase):
    """stdout that also feeds complete lines to the recorder."""

    def __init__(self, stream, recorder: Recorder) -> None:
        self.stream = stream
        self.recorder = recorder
        self.pending = ""

    def write(self, text: str) -> int:
        self.stream.write(text)
        self.pending += text
        while "\n" in self.pending:
            line, self.pending = self.pending.split("\n", 1)
            self.recorder.on_line(line)
        return len(text)

    def flush(self) -> None:
        self.stream.flush()

    def fileno(self) -> int:
        return self.stream.fileno()

    @property
    def encoding(self):
        return self.stream.encoding


def _finite(values):
    return [v if math.isfinite(v) else repr(v) for v in values]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=("shim", "native"), required=True)
    parser.add_argument("result")
    parser.add_argument("program")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    ns = parser.parse_args(argv)

    import importlib.util

    # Whether a real Apex could be imported here at all (the alias, if any, is not a real Apex).
    apex_installed = (
        not any(name.split(".")[0] in BLOCKED for name in sys.modules)
        and importlib.util.find_spec("apex") is not None
    )
    if ns.mode == "native":
        assert not any(name.split(".")[0] in BLOCKED for name in sys.modules), "shim already imported"
        sys.meta_path.insert(0, _Blocker())

    recorder = Recorder(ns.mode)
    recorder.install()
    stdout = sys.stdout
    sys.stdout = _Tee(stdout, recorder)
    sys.argv = [ns.program, *ns.args]
    sys.path[0] = os.path.dirname(os.path.abspath(ns.program))
    exit_code = 0
    try:
        runpy.run_path(ns.program, run_name="__main__")
    except SystemExit as exc:
        exit_code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.stdout.flush()
        sys.stdout = stdout

    import torch

    params_path = os.path.splitext(ns.result)[0] + ".pt"
    torch.save(recorder.final_params(), params_path)
    imported = sorted({name.split(".")[0] for name in sys.modules} & set(BLOCKED))
    with open(ns.result, "w") as f:
        json.dump(
            {
                "mode": ns.mode,
                "exit_code": exit_code,
                "losses": [_finite(v) for v in recorder.losses],
                "scales": recorder.scales,
                "steps": recorder.steps,
                "num_optimizers": len(recorder.optimizers),
                "params": params_path,
                "imported": imported,
                "apex_installed": apex_installed,
            },
            f,
        )
    if ns.mode == "native" and imported:
        print(f"recorder: native run imported {imported}", file=sys.stderr)
        return 3
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
