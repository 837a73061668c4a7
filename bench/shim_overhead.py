"""Shim step overhead against native torch.amp, host syncs per iteration, O2's master weights.

    OMP_NUM_THREADS=1 python bench/shim_overhead.py [--rounds 16] [--seconds 0.3]

Trains three models on CPU (a 3-layer MLP, a small CNN with BatchNorm, a small transformer
block), each three ways, in one run:

* native: `torch.autocast("cpu", dtype=torch.float16)` + `torch.amp.GradScaler("cpu")`, the
  recipe amp-migrate writes (float16, as the shim's O1 on CPU);
* Apex code through the shim at O1: `amp.initialize(..., opt_level="O1")`, `amp.scale_loss`;
* the same at O2 (fp16 model, fp32 master weights, BatchNorm kept in fp32).

Every (model, way) has a worker process of its own (the shim's O1 switches autocast on
process-wide, as Apex did), built and warmed up once; the driver then asks the workers in
turn, `--rounds` times, to time single steps for about `--seconds` (a slice), rotating which
way goes first, so that changes in the machine's load hit the three ways alike. The figure is
the median over every timed step of every slice. Host syncs are counted in separate
iterations (not timed, the 3rd of 5 overflowing) with a TorchFunctionMode that sees every
`item`/`__bool__`/`tolist`/`__float__`/`__int__`/`__index__` call, with the same SGD optimizer
and with fused ones: `torch.optim.AdamW(fused=True)` natively; under the shim Apex's default
`FusedAdam()` (its step count is a host int, so its skip is decided on the host, as in Apex),
`FusedAdam(capturable=True)` and `torch.optim.AdamW(fused=True)`, whose steps support amp scaling
and skip on the device. O2's master weights are measured as the bytes of storage the fp32
masters add per fp16 model parameter.

Prints a table and writes `bench/results/shim_overhead.json`; `bench/write_performance.py` puts it
into docs/results/performance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, describe, fmt, loadavg, machine, require_single_thread, save, table  # noqa: E402

MODELS = ("mlp", "cnn", "transformer")
WAYS = ("native", "O1", "O2")
LABELS = {"mlp": "3-layer MLP", "cnn": "small CNN + BatchNorm", "transformer": "transformer block"}
TARGETS = {"transformer": 1.03, "mlp": 1.10}
# Fused optimizers measured under the shim, in the order of the table's cells; the first is
# Apex's default FusedAdam, whose step does not support amp scaling.
SHIM_FUSED = ("apex_fused_adam", "apex_fused_adam_capturable", "fused_adamw")
AMP_SCALING = ("apex_fused_adam_capturable", "fused_adamw")


# -- worker side ------------------------------------------------------------------------------
def build(name: str):
    import torch
    import torch.nn.functional as F
    from torch import nn

    torch.manual_seed(0)
    if name == "mlp":
        model = nn.Sequential(
            nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10)
        )
        x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
        return model, x, y, F.cross_entropy
    if name == "cnn":
        model = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1, bias=False),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1, bias=False),
            nn.BatchNorm2d(32),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(32, 10),
        )
        x, y = torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,))
        return model, x, y, F.cross_entropy

    class Block(nn.Module):
        def __init__(self, d=128, heads=4):
            super().__init__()
            self.norm1 = nn.LayerNorm(d)
            self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
            self.norm2 = nn.LayerNorm(d)
            self.ff = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
            self.head = nn.Linear(d, 10)

        def forward(self, x):
            h = self.norm1(x)
            x = x + self.attn(h, h, h, need_weights=False)[0]
            x = x + self.ff(self.norm2(x))
            return self.head(x.mean(dim=1))

    model = Block()
    x, y = torch.randn(8, 32, 128), torch.randint(0, 10, (8,))
    return model, x, y, F.cross_entropy


def CountHostSyncs():
    """The shim's own host-sync counter (the same one its tests use)."""
    from amp_shim.engine.host_syncs import CountHostSyncs as counter

    return counter()


def make_step(model_name: str, way: str, optimizer: str = "sgd"):
    """(step function, model, optimizer) for one way of training one model."""
    import torch

    model, x, y, loss_fn = build(model_name)
    if optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    elif optimizer == "fused_adamw":
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    elif optimizer == "apex_fused_adam":
        from amp_shim.optimizers import FusedAdam

        opt = FusedAdam(model.parameters(), lr=1e-3)
    elif optimizer == "apex_fused_adam_capturable":
        from amp_shim.optimizers import FusedAdam

        opt = FusedAdam(model.parameters(), lr=1e-3, capturable=True)
    else:
        raise ValueError(optimizer)

    if way == "native":
        scaler = torch.amp.GradScaler("cpu")

        def step(overflow=False):
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.float16):
                loss = loss_fn(model(x), y)
            if overflow:
                loss = loss * float("inf")
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            return loss

        return step, model, opt

    from amp_shim import amp

    model, opt = amp.initialize(model, opt, opt_level=way, verbosity=0)

    def step(overflow=False):
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        if overflow:
            loss = loss * float("inf")
        with amp.scale_loss(loss, opt) as scaled_loss:
            scaled_loss.backward()
        opt.step()
        return loss

    return step, model, opt


def count_syncs(model_name: str, way: str, optimizer: str, iterations: int = 5) -> float:
    """Host syncs per iteration over `iterations` iterations, the 3rd of which overflows."""
    step, _, _ = make_step(model_name, way, optimizer)
    for _ in range(3):  # past lazy initialisation (masters, optimizer state)
        step()
    counter = CountHostSyncs()
    with counter:
        for i in range(iterations):
            step(overflow=i == 2)
    return len(counter.calls) / iterations


def master_weight_bytes(model, opt) -> dict:
    import torch

    fp16 = [p for p in model.parameters() if p.dtype == torch.float16]
    masters = list(getattr(opt._amp_stash, "all_fp32_from_fp16_params", []))
    model_ptrs = {p.untyped_storage().data_ptr() for p in model.parameters()}
    storages = {}
    for m in masters:
        s = m.untyped_storage()
        if s.data_ptr() not in model_ptrs:
            storages[s.data_ptr()] = s.nbytes()
    n16 = sum(p.numel() for p in fp16)
    extra = sum(storages.values())
    return {
        "fp16_params": n16,
        "fp16_tensors": len(fp16),
        "masters": len(masters),
        "master_dtypes": sorted({str(m.dtype) for m in masters}),
        "master_bytes": extra,
        "bytes_per_fp16_param": extra / n16 if n16 else None,
        "fp32_params_kept": sum(p.numel() for p in model.parameters() if p.dtype == torch.float32),
    }


def serve(model_name: str, way: str) -> None:
    """A worker: builds its model, then answers one command per stdin line with one JSON line:
    `time SECONDS` (single-step times for about SECONDS, at least 3 steps), `extra` (host
    syncs and, at O2, the master weights' bytes), `quit`."""
    import warnings

    import torch

    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    step, model, opt = make_step(model_name, way)
    for _ in range(10):
        step()
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if not cmd or cmd[0] == "quit":
            break
        if cmd[0] == "time":
            times = []
            deadline = time.perf_counter() + float(cmd[1])
            while len(times) < 3 or time.perf_counter() < deadline:
                t0 = time.perf_counter()
                step()
                times.append(time.perf_counter() - t0)
            out = {"times": times}
        else:
            fused = ("fused_adamw",) if way == "native" else SHIM_FUSED
            out = {"syncs": {k: count_syncs(model_name, way, k) for k in ("sgd",) + fused}}
            if way == "O2":
                out["master_weights"] = master_weight_bytes(model, opt)
        print(json.dumps(out), flush=True)


# -- driver -----------------------------------------------------------------------------------
class Worker:
    def __init__(self, model_name: str, way: str) -> None:
        env = dict(os.environ, OMP_NUM_THREADS="1")
        env.pop("AMP_SHIM_DTYPE", None)  # the shim's default on CPU: float16, as native here
        self.name = f"{model_name} {way}"
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--worker", model_name, way],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.ask(None)  # wait until ready

    def ask(self, command):
        if command is not None:
            self.proc.stdin.write(command + "\n")
            self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"worker {self.name} died (exit {self.proc.wait()})")
        return json.loads(line)

    def close(self) -> None:
        try:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.close()
        except OSError:
            pass
        self.proc.wait()


def main(argv=None) -> int:
    require_single_thread()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=0.3, help="timed seconds per slice")
    parser.add_argument("--no-save", action="store_true")
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        serve(*args.worker)
        return 0

    start_all = time.perf_counter()
    info = machine()
    load_before = loadavg()
    print(f"machine: {describe(info)}\nload average before: {load_before}", flush=True)
    times = {m: {w: [] for w in WAYS} for m in MODELS}
    slices = {m: {w: [] for w in WAYS} for m in MODELS}  # per round: that slice's median
    extra: dict = {m: {} for m in MODELS}
    workers = {}
    try:
        for m in MODELS:
            for w in WAYS:
                workers[m, w] = Worker(m, w)
        for r in range(args.rounds):
            for m in MODELS:
                order = WAYS[r % 3 :] + WAYS[: r % 3]  # each way goes first, second, third in turn
                for w in order:
                    got = workers[m, w].ask(f"time {args.seconds}")["times"]
                    times[m][w].extend(got)
                    slices[m][w].append(statistics.median(got))
            print(f"round {r + 1}/{args.rounds} done", flush=True)
        for m in MODELS:
            for w in WAYS:
                out = workers[m, w].ask("extra")
                extra[m].setdefault("syncs", {})[w] = out["syncs"]
                if "master_weights" in out:
                    extra[m]["master_weights"] = out["master_weights"]
    finally:
        for worker in workers.values():
            worker.close()
    load_after = loadavg()

    res = {
        "machine": info,
        "load_before": load_before,
        "load_after": load_after,
        "rounds": args.rounds,
        "seconds_per_slice": args.seconds,
        "models": {},
    }
    for m in MODELS:
        med = {w: statistics.median(times[m][w]) for w in WAYS}
        res["models"][m] = {
            "label": LABELS[m],
            "median_ms": {w: round(1000 * med[w], 4) for w in WAYS},
            "steps": {w: len(times[m][w]) for w in WAYS},
            "ratio": {w: round(med[w] / med["native"], 4) for w in WAYS},
            # the same ratio from neighbouring slices only (median over rounds), less sensitive
            # to the machine's load drifting during the run
            "paired_ratio": {
                w: round(statistics.median(a / b for a, b in zip(slices[m][w], slices[m]["native"])), 3)
                for w in WAYS
            },
            "syncs": extra[m].get("syncs", {}),
            "master_weights": extra[m].get("master_weights"),
        }
    targets = []
    for m, limit in TARGETS.items():
        ratio = statistics.median(times[m]["O1"]) / statistics.median(times[m]["native"])  # unrounded
        targets.append(
            {
                "target": f"shim O1 <= {limit:.2f}x native step time ({LABELS[m]})",
                "measured": f"{ratio:.3f}x",
                "met": ratio <= limit,
            }
        )
    worst_sgd = max(res["models"][m]["syncs"][w]["sgd"] for m in MODELS for w in WAYS)
    targets.append(
        {
            "target": "host syncs per iteration <= 1 (SGD, every model and way)",
            "measured": f"max {worst_sgd:g}",
            "met": worst_sgd <= 1,
        }
    )
    fused = {
        w: max(
            res["models"][m]["syncs"][w][k]
            for m in MODELS
            for k in res["models"][m]["syncs"][w]
            if k in AMP_SCALING
        )
        for w in WAYS
    }
    targets.append(
        {
            "target": "0 host syncs per iteration with a fused optimizer whose step supports amp "
            "scaling (AdamW(fused=True); also FusedAdam(capturable=True) under the shim)",
            "measured": ", ".join(f"{w} {fused[w]:g}" for w in WAYS),
            "met": all(v == 0 for v in fused.values()),
        }
    )
    default = {w: max(res["models"][m]["syncs"][w]["apex_fused_adam"] for m in MODELS) for w in ("O1", "O2")}
    targets.append(
        {
            "target": "host syncs per iteration <= 1 with Apex's default FusedAdam() (its int step "
            "count cannot follow a skip decided on the device)",
            "measured": ", ".join(f"{w} {v:g}" for w, v in default.items()),
            "met": all(v <= 1 for v in default.values()),
        }
    )
    per = [res["models"][m]["master_weights"]["bytes_per_fp16_param"] for m in MODELS]
    targets.append(
        {
            "target": "O2 master weights cost exactly 4 bytes per fp16 parameter",
            "measured": ", ".join(f"{LABELS[m]} {b:g}" for m, b in zip(MODELS, per)),
            "met": all(b == 4 for b in per),
        }
    )
    res["targets"] = targets
    res["total_s"] = round(time.perf_counter() - start_all, 1)
    print()
    print(render_text(res))
    if not args.no_save:
        print(f"\nwrote {save('shim_overhead', res).relative_to(ROOT)}")
    return 0


HEADERS = [
    "model",
    "native ms",
    "shim O1 ms",
    "O1/native",
    "shim O2 ms",
    "O2/native",
    "syncs/iter native · O1 · O2 (SGD)",
    "syncs/iter fused: native · O1 · O2",
    "O2 master bytes / fp16 param",
]


def rows(res: dict) -> list[list[str]]:
    out = []
    for r in res["models"].values():
        s = r["syncs"]

        def fused(w, s=s):
            order = ("fused_adamw",) if w == "native" else SHIM_FUSED
            return "/".join(f"{s[w][k]:g}" for k in order if k in s[w])

        mw = r["master_weights"]
        out.append(
            [
                r["label"],
                fmt(r["median_ms"]["native"], 3),
                fmt(r["median_ms"]["O1"], 3),
                f"{r['ratio']['O1']:.3f}",
                fmt(r["median_ms"]["O2"], 3),
                f"{r['ratio']['O2']:.3f}",
                " · ".join(f"{s[w]['sgd']:g}" for w in WAYS),
                " · ".join(fused(w) for w in WAYS),
                f"{mw['bytes_per_fp16_param']:g} ({mw['master_bytes']:,} B for {mw['fp16_params']:,})",
            ]
        )
    return out


def render_text(res: dict) -> str:
    lines = [
        f"machine: {describe(res['machine'])}",
        f"load average before/after: {res['load_before']} / {res['load_after']}",
        f"median of single steps over {res['rounds']} interleaved slices of ~{res['seconds_per_slice']:g} s "
        "per (model, way), CPU, float16",
        "",
        table(HEADERS, rows(res)),
        "",
        "fused syncs (5 iterations, the 3rd overflowing): native = torch.optim.AdamW(fused=True); "
        "shim = Apex FusedAdam() / FusedAdam(capturable=True) / AdamW(fused=True)",
        "paired ratios (median over rounds of slice-median ratios): "
        + "; ".join(
            f"{r['label']} O1 {r['paired_ratio']['O1']:.3f}x, O2 {r['paired_ratio']['O2']:.3f}x"
            for r in res["models"].values()
        ),
        "",
        table(
            ["target", "measured", "met"],
            [[t["target"], t["measured"], "yes" if t["met"] else "NO"] for t in res["targets"]],
        ),
        f"\ntotal {res['total_s']:.0f} s",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
