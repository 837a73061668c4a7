"""Time the engine's ops on a GPU: torch path vs the CuPy kernels, with CUDA events.

Needs a CUDA GPU, CuPy (`pip install -e '.[cuda]'`) and a CUDA build of torch; on a machine
without one it says so and exits with status 2, having measured nothing. Parameter sets are
bench/kernels_bytes.py's (ResNet-50- and BERT-large-sized lists of tensors). For each op it
runs `--warmup` untimed iterations, then times `--iters` iterations between two CUDA events
on the current stream, for AMP_SHIM_KERNELS=torch and =cupy, and prints the mean time per call,
the effective bandwidth (bytes from kernels_bytes.py's accounting / time), and whether one call
of each path from the same inputs agrees (bit for bit, or only to rounding where the norm's
summation order differs).

Usage:
    python bench/kernels_gpu.py [--model resnet50|bert-large|all] [--ops unscale,o2,accumulate,clip,update]
                                [--iters 50] [--warmup 10] [--device cuda:0] [--grad-dtype float32|float16|bfloat16]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import kernels_bytes  # noqa: E402

MODELS = {"resnet50": "ResNet-50", "bert-large": "BERT-large"}
OPS = ("unscale", "o2", "accumulate", "clip", "update")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Time torch-path vs CuPy-kernel engine ops with CUDA events."
    )
    parser.add_argument("--model", choices=sorted(MODELS) + ["all"], default="all")
    parser.add_argument(
        "--ops", default=",".join(OPS), help="comma-separated subset of: %s (default: all)" % ", ".join(OPS)
    )
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument(
        "--grad-dtype",
        choices=["float32", "float16", "bfloat16"],
        default="float32",
        help="gradient dtype for the unscale and clip ops (O2 ops always use float16)",
    )
    args = parser.parse_args(argv)
    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    unknown = sorted(set(ops) - set(OPS))
    if unknown:
        parser.error("unknown op(s): %s (choose from %s)" % (", ".join(unknown), ", ".join(OPS)))
    if args.iters < 1 or args.warmup < 0:
        parser.error("--iters must be >= 1 and --warmup >= 0")
    args.ops = ops
    args.models = list(MODELS) if args.model == "all" else [args.model]
    return args


def _time(torch, fn, iters: int, warmup: int) -> float:
    """Mean milliseconds per call, between CUDA events on the current stream."""
    for _ in range(warmup):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters


def _cases(torch, ops_mod, device, shapes, grad_dtype, wanted):
    """name -> (make state, run op on state, bytes per call)."""
    numel = sum(kernels_bytes._numel(s) for s in shapes)
    inv = torch.tensor(2.0**-16, device=device)

    def grads(dtype):
        return [torch.randn(s, device=device).to(dtype) for s in shapes]

    gsize = torch.empty((), dtype=grad_dtype).element_size()
    cases = {}
    if "unscale" in wanted:
        cases["unscale"] = (
            lambda: (grads(grad_dtype), torch.zeros(1, device=device)),
            lambda st: ops_mod.unscale_(st[0], st[1], inv),
            2 * gsize * numel,
        )
    if "o2" in wanted:
        cases["o2"] = (
            lambda: (
                grads(torch.float16),
                torch.zeros(1, device=device),
                [torch.empty(s, device=device, dtype=torch.float16) for s in shapes],
            ),
            lambda st: ops_mod.copy_(st[2], ops_mod.unscale_to_fp32_(st[0], [None] * len(st[0]), st[1], inv)),
            12 * numel,
        )
    if "accumulate" in wanted:
        cases["accumulate"] = (
            lambda: (grads(torch.float16), torch.zeros(1, device=device), grads(torch.float32)),
            lambda st: ops_mod.unscale_to_fp32_(st[0], st[2], st[1], inv),
            10 * numel,
        )
    if "clip" in wanted:
        cases["clip"] = (
            lambda: (grads(grad_dtype), torch.zeros(1, device=device)),
            lambda st: ops_mod.unscale_clip_(st[0], st[1], inv, 1.0),
            3 * gsize * numel,
        )
    if "update" in wanted:
        cases["update"] = (
            lambda: (
                torch.tensor(65536.0, dtype=torch.float64, device=device),
                torch.zeros((), dtype=torch.int64, device=device),
                torch.zeros(1, device=device),
            ),
            lambda st: ops_mod.update_scale_(
                st[0],
                st[1],
                st[2],
                dynamic=True,
                min_loss_scale=None,
                max_loss_scale=2.0**24,
                scale_window=2000,
            ),
            0,
        )
    return cases


def _flat(obj) -> list:
    if hasattr(obj, "dtype") and hasattr(obj, "shape"):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for o in obj for t in _flat(o)]
    return []


def _agreement(torch, a, b) -> str:
    """'bit for bit', 'to rounding' (float32: 1e-5 relative, fp16/bf16: 1e-2), or 'NO', over the
    tensors of two (state, result) pairs."""
    xs, ys = _flat(a), _flat(b)
    if len(xs) != len(ys):
        return "NO (different outputs)"
    exact = True
    for x, y in zip(xs, ys):
        if x.dtype != y.dtype or x.shape != y.shape:
            return "NO (dtype/shape)"
        if x.dtype.is_floating_point:
            same = torch.equal(x.isnan(), y.isnan()) and torch.equal(x.nan_to_num(), y.nan_to_num())
            if not same:
                exact = False
                rtol = 1e-5 if x.dtype in (torch.float32, torch.float64) else 1e-2  # one fp16/bf16 ulp
                if not torch.allclose(x.float(), y.float(), rtol=rtol, atol=0, equal_nan=True):
                    return "NO"
        elif not torch.equal(x, y):
            return "NO"
    return "bit for bit" if exact else "to rounding"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print(
            "kernels_gpu.py needs a CUDA GPU and a CUDA build of torch; none here, nothing measured.",
            file=sys.stderr,
        )
        return 2
    try:
        import cupy
    except ImportError:
        print("kernels_gpu.py needs CuPy: pip install -e '.[cuda]'; nothing measured.", file=sys.stderr)
        return 2
    if not cupy.is_available():
        print("CuPy finds no usable CUDA device; nothing measured.", file=sys.stderr)
        return 2
    from amp_shim.engine import ops as ops_mod

    device = torch.device(args.device)
    grad_dtype = getattr(torch, args.grad_dtype)
    print(
        "| model | op | torch path | CuPy kernels | speed-up | kernels' effective bandwidth | paths agree |"
    )
    print("|---|---|---|---|---|---|---|")
    for key in args.models:
        shapes = kernels_bytes.PARAMETER_SETS[MODELS[key]]()
        for name, (make, run, nbytes) in _cases(torch, ops_mod, device, shapes, grad_dtype, args.ops).items():
            times, once = {}, {}
            for mode in ("torch", "cupy"):
                os.environ["AMP_SHIM_KERNELS"] = mode
                torch.manual_seed(0)
                state = make()
                once[mode] = (state, run(state))  # one call from the same inputs, to compare
                state = make()
                times[mode] = _time(torch, lambda run=run, state=state: run(state), args.iters, args.warmup)
            bw = "%.0f GB/s" % (nbytes / (times["cupy"] * 1e-3) / 1e9) if nbytes else "-"
            print(
                "| %s | %s | %.3f ms | %.3f ms | %.2fx | %s | %s |"
                % (
                    MODELS[key],
                    name,
                    times["torch"],
                    times["cupy"],
                    times["torch"] / times["cupy"],
                    bw,
                    _agreement(torch, once["torch"], once["cupy"]),
                )
            )
    print(
        "\n%s (%s), %d timed iterations after %d warm-up, CUDA events on the current stream."
        % (torch.cuda.get_device_name(device), device, args.iters, args.warmup)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
