"""Generate the codemod benchmark's corpus: realistic torch training and model code.

    python bench/codemod_corpus.py [--files 200] [--apex-share 0.05] [--seed 0] [--out bench/.corpus]

Files are built from templates of the code people write around torch (modules, datasets,
training and evaluation loops, schedulers, checkpoints, meters, argparse mains), with names,
sizes and layers drawn from a seeded RNG, so the same arguments always give byte-identical
files. Sizes run from 50 to 2,000 lines, heavy-tailed (median about 125, mean about 330). About `--apex-share` of the files
also use Apex in the patterns amp-migrate's rules support (`amp.initialize` + `amp.scale_loss`,
`amp.master_params` clipping, `amp.state_dict` checkpoints, fused optimizers and norms,
`apex.parallel`, `fp16_utils`), and every Python file of `fixtures/programs/` and
`fixtures/examples/` is copied in as well. Files without Apex never spell any of the texts
amp-migrate pre-filters on (`apex`, `cuda.amp`, ...), as real torch code without Apex
mostly does not.

Writes `manifest.json` beside the tree: every file with its line count and whether it uses
Apex. Takes a few seconds.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "bench" / ".corpus"
MIN_LINES, MAX_LINES = 50, 2000
FORBIDDEN = ("apex", "cuda.amp", "cpu.amp", "torch.cuda import", "torch.cpu import")

WORDS = [
    "encoder",
    "decoder",
    "block",
    "head",
    "stem",
    "proj",
    "fusion",
    "backbone",
    "neck",
    "classifier",
    "embed",
    "mixer",
    "adapter",
    "router",
    "pool",
    "stage",
    "tower",
    "bridge",
    "gate",
    "residual",
    "context",
    "query",
    "memory",
    "patch",
    "token",
    "spatial",
    "temporal",
]
ACTS = ["nn.ReLU()", "nn.GELU()", "nn.SiLU()", "nn.Tanh()", "nn.LeakyReLU(0.1)"]
FUNCS = ["F.relu", "F.gelu", "F.silu", "torch.tanh"]
LOSSES = [
    "F.cross_entropy(logits, target)",
    "F.mse_loss(logits, target)",
    "F.smooth_l1_loss(logits, target)",
    "F.nll_loss(F.log_softmax(logits, dim=-1), target)",
]
OPTIMS = [
    "torch.optim.SGD(model.parameters(), lr={lr}, momentum=0.9, weight_decay={wd})",
    "torch.optim.AdamW(model.parameters(), lr={lr}, weight_decay={wd})",
    "torch.optim.Adam(model.parameters(), lr={lr})",
    "torch.optim.RMSprop(model.parameters(), lr={lr}, alpha=0.99)",
]


class Gen:
    """Draws one file's pieces; `uid` keeps class and function names unique within a file."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.n = 0

    def name(self, kind: str = "") -> str:
        self.n += 1
        w = self.rng.choice(WORDS)
        return f"{w}_{kind}{self.n}" if kind else f"{w}{self.n}"

    def cls(self) -> str:
        self.n += 1
        a, b = self.rng.sample(WORDS, 2)
        return f"{a.title()}{b.title()}{self.n}"

    def dim(self) -> int:
        return self.rng.choice([16, 32, 64, 96, 128, 192, 256, 384, 512, 768, 1024])

    # -- blocks ---------------------------------------------------------------------------
    def mlp(self) -> str:
        name, depth = self.cls(), self.rng.randint(2, 6)
        dims = [self.dim() for _ in range(depth + 1)]
        act = self.rng.choice(ACTS)
        layers = "\n".join(
            f"            nn.Linear({dims[i]}, {dims[i + 1]}),\n            {act}," for i in range(depth)
        )
        drop = self.rng.choice([0.0, 0.1, 0.2])
        return f'''
class {name}(nn.Module):
    """A {depth}-layer perceptron ({dims[0]} -> {dims[-1]})."""

    def __init__(self, dropout: float = {drop}):
        super().__init__()
        self.net = nn.Sequential(
{layers}
        )
        self.dropout = nn.Dropout(dropout)
        self.out_features = {dims[-1]}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.net(x)
        return self.dropout(x)
'''

    def cnn(self) -> str:
        name, stages = self.cls(), self.rng.randint(2, 5)
        chans = [3] + [self.rng.choice([16, 32, 64, 128, 256]) for _ in range(stages)]
        body = []
        for i in range(stages):
            body.append(
                f"        self.conv{i} = nn.Conv2d({chans[i]}, {chans[i + 1]}, kernel_size=3, padding=1, bias=False)"
            )
            body.append(f"        self.bn{i} = nn.BatchNorm2d({chans[i + 1]})")
        fwd = "\n".join(
            f"        x = F.max_pool2d(F.relu(self.bn{i}(self.conv{i}(x))), 2)"
            if i % 2
            else f"        x = F.relu(self.bn{i}(self.conv{i}(x)))"
            for i in range(stages)
        )
        classes = self.rng.choice([10, 100, 1000])
        return f'''
class {name}(nn.Module):
    """A small convolutional network with batch norm ({stages} stages)."""

    def __init__(self, num_classes: int = {classes}):
        super().__init__()
{chr(10).join(body)}
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear({chans[-1]}, num_classes)

    def forward(self, x):
{fwd}
        x = self.pool(x).flatten(1)
        return self.fc(x)
'''

    def transformer(self) -> str:
        name, d = self.cls(), self.rng.choice([64, 128, 256, 512])
        heads = self.rng.choice([2, 4, 8])
        norm = self.rng.choice(["nn.LayerNorm", "nn.RMSNorm"])
        return f'''
class {name}(nn.Module):
    """Pre-norm transformer block: self-attention then a feed-forward network."""

    def __init__(self, d_model: int = {d}, n_heads: int = {heads}, ff_mult: int = 4, dropout: float = 0.1):
        super().__init__()
        assert d_model % n_heads == 0, "d_model must be divisible by n_heads"
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.norm1 = {norm}(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)
        self.norm2 = {norm}(d_model)
        self.ff = nn.Sequential(
            nn.Linear(d_model, ff_mult * d_model),
            nn.GELU(),
            nn.Linear(ff_mult * d_model, d_model),
        )
        self.dropout = nn.Dropout(dropout)

    def attention(self, x, mask=None):
        b, t, c = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q = q.view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = k.view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        v = v.view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)
        if mask is not None:
            scores = scores.masked_fill(mask == 0, float("-inf"))
        weights = self.dropout(scores.softmax(dim=-1))
        y = (weights @ v).transpose(1, 2).reshape(b, t, c)
        return self.out(y)

    def forward(self, x, mask=None):
        x = x + self.dropout(self.attention(self.norm1(x), mask))
        x = x + self.dropout(self.ff(self.norm2(x)))
        return x
'''

    def dataset(self) -> str:
        name, d = self.cls(), self.dim()
        return f'''
class {name}(torch.utils.data.Dataset):
    """Synthetic samples for smoke tests: features and a class label per item."""

    def __init__(self, size: int = {self.rng.choice([256, 1024, 4096])}, features: int = {d}, classes: int = 10, seed: int = {self.rng.randint(0, 99)}):
        generator = torch.Generator().manual_seed(seed)
        self.x = torch.randn(size, features, generator=generator)
        self.y = torch.randint(0, classes, (size,), generator=generator)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int):
        return self.x[index], self.y[index]


def {self.name("loader")}(batch_size: int = {self.rng.choice([16, 32, 64, 128])}, workers: int = 0, shuffle: bool = True):
    dataset = {name}()
    return torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=shuffle,
                                       num_workers=workers, drop_last=True)
'''

    def config(self) -> str:
        name = self.cls()
        fields = "\n".join(
            f"    {self.name()}: {t} = {v}"
            for t, v in self.rng.sample(
                [
                    ("int", self.rng.randint(1, 512)),
                    ("float", round(self.rng.random(), 4)),
                    ("str", repr(self.rng.choice(WORDS))),
                    ("bool", self.rng.choice(["True", "False"])),
                    ("int", self.rng.choice([1, 2, 4, 8])),
                    ("float", self.rng.choice([1e-3, 3e-4, 1e-4])),
                    ("Optional[str]", "None"),
                ],
                self.rng.randint(3, 7),
            )
        )
        return f'''
@dataclass
class {name}:
    """Hyperparameters, filled from the command line or a YAML file."""
    lr: float = {self.rng.choice([0.1, 0.01, 1e-3, 3e-4])}
    epochs: int = {self.rng.randint(1, 300)}
    batch_size: int = {self.rng.choice([16, 32, 64, 128, 256])}
{fields}

    def to_dict(self) -> Dict[str, Any]:
        return dict(self.__dict__)
'''

    def meter(self) -> str:
        name = self.cls()
        return f'''
class {name}:
    """Computes and stores the average and current value."""

    def __init__(self, name: str, fmt: str = ":f"):
        self.name = name
        self.fmt = fmt
        self.reset()

    def reset(self):
        self.val = 0.0
        self.avg = 0.0
        self.sum = 0.0
        self.count = 0

    def update(self, val, n=1):
        self.val = val
        self.sum += val * n
        self.count += n
        self.avg = self.sum / self.count

    def __str__(self):
        fmtstr = "{{name}} {{val" + self.fmt + "}} ({{avg" + self.fmt + "}})"
        return fmtstr.format(**self.__dict__)


def {self.name("accuracy")}(output, target, topk=(1,)):
    """Precision@k for the specified values of k."""
    with torch.no_grad():
        maxk = max(topk)
        batch_size = target.size(0)
        _, pred = output.topk(maxk, 1, True, True)
        pred = pred.t()
        correct = pred.eq(target.view(1, -1).expand_as(pred))
        res = []
        for k in topk:
            correct_k = correct[:k].reshape(-1).float().sum(0, keepdim=True)
            res.append(correct_k.mul_(100.0 / batch_size))
        return res
'''

    def train_loop(self, native_amp: bool) -> str:
        fn, loss = self.name("train"), self.rng.choice(LOSSES)
        clip = self.rng.random() < 0.5
        log_every = self.rng.choice([10, 20, 50, 100])
        if native_amp:
            body = f"""        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=use_amp):
            logits = model(inputs)
            loss = {loss}
        scaler.scale(loss).backward()
{"        scaler.unscale_(optimizer)" + chr(10) + "        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)" + chr(10) if clip else ""}        scaler.step(optimizer)
        scaler.update()"""
            extra = ", scaler=None, use_amp=False"
            pre = "    scaler = scaler or torch.amp.GradScaler(device.type, enabled=use_amp)\n"
        else:
            body = f"""        logits = model(inputs)
        loss = {loss}
        loss.backward()
{"        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)" + chr(10) if clip else ""}        optimizer.step()"""
            extra, pre = "", ""
        return f'''
def {fn}(model, loader, optimizer, epoch, device, scheduler=None, max_norm=1.0{extra}):
    """One epoch of training; returns the mean loss."""
{pre}    model.train()
    total, seen = 0.0, 0
    start = time.time()
    for step, (inputs, target) in enumerate(loader):
        inputs = inputs.to(device, non_blocking=True)
        target = target.to(device, non_blocking=True)
        optimizer.zero_grad(set_to_none=True)
{body}
        if scheduler is not None:
            scheduler.step()
        total += loss.item() * inputs.size(0)
        seen += inputs.size(0)
        if step % {log_every} == 0:
            elapsed = time.time() - start
            logger.info("epoch %d step %d loss %.4f (%.1f samples/s)", epoch, step, loss.item(), seen / max(elapsed, 1e-9))
    return total / max(seen, 1)
'''

    def evaluate(self) -> str:
        return f'''
@torch.no_grad()
def {self.name("evaluate")}(model, loader, device):
    """Accuracy and mean loss over a loader."""
    model.eval()
    correct, total, loss_sum = 0, 0, 0.0
    for inputs, target in loader:
        inputs, target = inputs.to(device), target.to(device)
        logits = model(inputs)
        loss_sum += F.cross_entropy(logits, target, reduction="sum").item()
        correct += (logits.argmax(dim=-1) == target).sum().item()
        total += target.numel()
    return {{"accuracy": correct / max(total, 1), "loss": loss_sum / max(total, 1)}}
'''

    def checkpoint(self) -> str:
        return f'''
def {self.name("save")}(path, model, optimizer, epoch, best=None, **extra):
    """Save a resumable checkpoint atomically."""
    state = {{"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch}}
    if best is not None:
        state["best"] = best
    state.update(extra)
    tmp = path + ".tmp"
    torch.save(state, tmp)
    os.replace(tmp, path)


def {self.name("load")}(path, model, optimizer=None, map_location="cpu"):
    state = torch.load(path, map_location=map_location)
    model.load_state_dict(state["model"])
    if optimizer is not None and "optimizer" in state:
        optimizer.load_state_dict(state["optimizer"])
    return state.get("epoch", 0)
'''

    def schedule(self) -> str:
        return f'''
def {self.name("schedule")}(optimizer, warmup_steps: int = {self.rng.choice([100, 500, 1000, 2000])}, total_steps: int = {self.rng.choice([10000, 50000, 100000])}):
    """Linear warmup, then cosine decay to zero."""

    def lr_lambda(step):
        if step < warmup_steps:
            return float(step) / float(max(1, warmup_steps))
        progress = float(step - warmup_steps) / float(max(1, total_steps - warmup_steps))
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)
'''

    def helper(self) -> str:
        kind = self.rng.randint(0, 3)
        fn = self.name("util")
        if kind == 0:
            return f"""
def {fn}(seed: int = {self.rng.randint(0, 9999)}) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)
"""
        if kind == 1:
            return f'''
def {fn}(model: nn.Module) -> int:
    """Trainable parameters."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
'''
        if kind == 2:
            return f"""
def {fn}(x: torch.Tensor, eps: float = {self.rng.choice(["1e-5", "1e-6", "1e-8"])}) -> torch.Tensor:
    mean = x.mean(dim=-1, keepdim=True)
    var = x.var(dim=-1, keepdim=True, unbiased=False)
    return (x - mean) / torch.sqrt(var + eps)
"""
        return f'''
def {fn}(named_parameters, weight_decay: float = {self.rng.choice([0.01, 0.05, 0.1])}):
    """Parameter groups without weight decay on biases and norms."""
    decay, no_decay = [], []
    for name, param in named_parameters:
        if not param.requires_grad:
            continue
        if param.ndim <= 1 or name.endswith(".bias"):
            no_decay.append(param)
        else:
            decay.append(param)
    return [{{"params": decay, "weight_decay": weight_decay}}, {{"params": no_decay, "weight_decay": 0.0}}]
'''

    def main(self, model_cls: str) -> str:
        optim = self.rng.choice(OPTIMS).format(
            lr=self.rng.choice([0.1, 0.01, 1e-3]), wd=self.rng.choice([0, 1e-4, 5e-4])
        )
        return f"""
def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default={self.rng.randint(1, 100)})
    parser.add_argument("--batch-size", type=int, default={self.rng.choice([32, 64, 128])})
    parser.add_argument("--output", default="checkpoints")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = {model_cls}().to(device)
    optimizer = {optim}
    os.makedirs(args.output, exist_ok=True)
    logger.info("model has %d parameters", sum(p.numel() for p in model.parameters()))
    return model, optimizer


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    main()
"""


HEADER = '''"""{doc}"""
import argparse
import logging
import math
import os
import random
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
{extra_imports}
logger = logging.getLogger(__name__)
'''

DOCS = [
    "Models and training utilities.",
    "Training entry point.",
    "Model zoo: building blocks.",
    "Experiment code for the ablations.",
    "Data pipeline and training loop.",
    "Layers shared by the encoder and the decoder.",
    "Fine-tuning script.",
]


# -- Apex patterns (each one a form the rules support) -------------------------------------
def apex_imports(rng: random.Random, uses: set) -> str:
    lines = ["from apex import amp"]
    if "fused_adam" in uses:
        lines.append("from apex.optimizers import FusedAdam")
    if "fused_ln" in uses:
        lines.append("from apex.normalization import FusedLayerNorm")
    if "ddp" in uses:
        lines.append("from apex.parallel import DistributedDataParallel as DDP")
    if "fp16_utils" in uses:
        lines.append("from apex.fp16_utils import FP16_Optimizer")
    return "\n".join(lines) + "\n"


def apex_block(g: Gen, model_cls: str, uses: set) -> str:
    rng = g.rng
    level = rng.choice(["O1", "O1", "O2"])
    loss = rng.choice(LOSSES)
    fn = g.name("train_amp")
    opt = (
        "FusedAdam(model.parameters(), lr={}, weight_decay=0.01)".format(rng.choice([1e-3, 3e-4]))
        if "fused_adam" in uses
        else rng.choice(OPTIMS).format(lr=rng.choice([0.1, 0.01]), wd=rng.choice([0, 1e-4]))
    )
    clip = (
        "        torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), max_norm)\n"
        if "clip" in uses
        else ""
    )
    ddp = "    model = DDP(model, delay_allreduce=True)\n" if "ddp" in uses else ""
    ckpt = (
        '    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), '
        '"amp": amp.state_dict()}, path)\n'
        if "ckpt" in uses
        else ""
    )
    out = f'''
def {fn}(steps: int = {rng.randint(10, 1000)}, max_norm: float = 1.0, path: str = "checkpoint.pt"):
    """Mixed-precision training with Apex AMP at {level}."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = {model_cls}().to(device)
    optimizer = {opt}
    model, optimizer = amp.initialize(model, optimizer, opt_level="{level}")
{ddp}    for step in range(steps):
        inputs = torch.randn(8, 16, device=device)
        target = torch.randint(0, 4, (8,), device=device)
        optimizer.zero_grad()
        logits = model(inputs)
        loss = {loss}
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
{clip}        optimizer.step()
        if step % 100 == 0:
            logger.info("step %d loss %.4f", step, loss.item())
{ckpt}    return model
'''
    if "fused_ln" in uses:
        out += f"""

class {g.cls()}(nn.Module):
    def __init__(self, width: int = {g.dim()}):
        super().__init__()
        self.norm = FusedLayerNorm(width, eps=1e-5)
        self.proj = nn.Linear(width, width)

    def forward(self, x):
        return self.proj(self.norm(x))
"""
    if "fp16_utils" in uses:
        out += f"""

def {g.name("finetune_fp16")}(model, steps: int = 10):
    model = model.half()
    optimizer = FP16_Optimizer(torch.optim.SGD(model.parameters(), lr=0.01), dynamic_loss_scale=True)
    for _ in range(steps):
        optimizer.zero_grad()
        loss = model(torch.randn(4, 16).half()).float().sum()
        optimizer.backward(loss)
        optimizer.step()
    return model
"""
    return out


def generate_file(rng: random.Random, target_lines: int, apex: bool) -> str:
    g = Gen(rng)
    uses: set = set()
    if apex:
        uses = {
            u
            for u in ("clip", "ckpt", "fused_adam", "fused_ln", "ddp", "fp16_utils")
            if rng.random()
            < {"clip": 0.5, "ckpt": 0.5, "fused_adam": 0.3, "fused_ln": 0.25, "ddp": 0.2, "fp16_utils": 0.1}[
                u
            ]
        }
    header = HEADER.format(doc=rng.choice(DOCS), extra_imports=apex_imports(rng, uses) if apex else "")
    parts = [header, g.config()]
    model_cls = None
    makers = [
        g.mlp,
        g.cnn,
        g.transformer,
        g.dataset,
        g.meter,
        g.evaluate,
        g.checkpoint,
        g.schedule,
        g.helper,
        g.helper,
    ]
    native_amp = rng.random() < 0.3
    lines = header.count("\n") + 20
    while lines < target_lines - 20:
        maker = rng.choice(makers + [lambda: g.train_loop(native_amp)])
        block = maker()
        if model_cls is None and maker in (g.mlp, g.cnn, g.transformer):
            model_cls = block.split("class ", 1)[1].split("(", 1)[0]
        parts.append(block)
        lines += block.count("\n") + 1
    if model_cls is None:
        block = g.mlp()
        model_cls = block.split("class ", 1)[1].split("(", 1)[0]
        parts.append(block)
    if apex:
        parts.append(apex_block(g, model_cls, uses))
    parts.append(g.main(model_cls))
    return "\n".join(parts)


def draw_size(rng: random.Random) -> int:
    """Lines of one file: MIN_LINES * (MAX_LINES / MIN_LINES) ** (u * u), u uniform in [0, 1):
    heavy-tailed like real repositories (median about 125 lines, mean about 330, a few files
    near 2,000)."""
    u = rng.random()
    return int(MIN_LINES * (MAX_LINES / MIN_LINES) ** (u * u))


def fixture_programs() -> list[Path]:
    return sorted(p for d in ("fixtures/programs", "fixtures/examples") for p in (ROOT / d).rglob("*.py"))


def build(out: Path, files: int, apex_share: float, seed: int) -> dict:
    rng = random.Random(seed)
    if out.exists():
        shutil.rmtree(out)
    n_apex = round(files * apex_share)
    apex_idx = set(rng.sample(range(files), n_apex))
    entries = []
    for i in range(files):
        target = draw_size(rng)
        apex = i in apex_idx
        text = generate_file(random.Random(rng.getrandbits(64)), target, apex)
        if not apex:
            bad = [m for m in FORBIDDEN if m in text]
            assert not bad, (i, bad)
        rel = Path(f"project{i // 100:02d}") / f"{'pkg' if i % 3 else 'scripts'}" / f"module_{i:05d}.py"
        path = out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        entries.append({"path": str(rel), "lines": text.count("\n"), "apex": apex, "source": "generated"})
    for src in fixture_programs():
        rel = Path("fixtures") / src.relative_to(ROOT / "fixtures")
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, out / rel)
        text = src.read_text()
        entries.append(
            {"path": str(rel), "lines": text.count("\n"), "apex": "apex" in text, "source": "fixtures"}
        )
    manifest = {
        "seed": seed,
        "files": files,
        "apex_share": apex_share,
        "entries": entries,
        "total_files": len(entries),
        "total_lines": sum(e["lines"] for e in entries),
        "apex_files": sum(e["apex"] for e in entries),
        "apex_lines": sum(e["lines"] for e in entries if e["apex"]),
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return manifest


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=200, help="generated files (fixtures come on top)")
    parser.add_argument("--apex-share", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    m = build(args.out, args.files, args.apex_share, args.seed)
    print(
        f"{args.out}: {m['total_files']} files, {m['total_lines']} lines; "
        f"{m['apex_files']} use Apex ({m['apex_lines']} lines)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
