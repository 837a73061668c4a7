"""Driver for the checkpoint-exact test: `train` runs every configuration uninterrupted and
also saves a checkpoint after N steps; `resume` (a fresh process) continues each checkpoint.

Each configuration is an Apex-style loop: O-level, num_losses, an early overflow storm (the
scale starts at 2**20) and a short growth window, so the saved scaler state is mid-window.
"""

import itertools
import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch
import torch.nn as nn
import torch.nn.functional as F

from amp_shim import amp
from amp_shim.amp import _amp_state

N, M = 9, 9
CONFIGS = [(level, n) for level, n in itertools.product(("O0", "O1", "O2", "O3"), (1, 2))]


def build(level):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 4))
    if level == "O3":
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    return model, opt


def initialize(level, num_losses):
    model, opt = build(level)
    model, opt = amp.initialize(model, opt, opt_level=level, num_losses=num_losses, verbosity=0)
    for scaler in _amp_state.loss_scalers:
        scaler.scale_window = 3
    return model, opt


def batch(step):
    gen = torch.Generator().manual_seed(1000 + step)
    return torch.randn(32, 8, generator=gen), torch.randn(32, 4, generator=gen)


def train_steps(model, opt, num_losses, steps):
    losses = []
    for step in steps:
        x, y = batch(step)
        opt.zero_grad()
        out = model(x)
        if num_losses == 1:
            parts = [F.mse_loss(out.float(), y)]
        else:
            parts = [F.mse_loss(out[:, :2].float(), y[:, :2]), F.mse_loss(out[:, 2:].float(), y[:, 2:])]
        for loss_id, loss in enumerate(parts):
            with amp.scale_loss(loss, opt, loss_id=loss_id) as scaled:
                scaled.backward(retain_graph=loss_id + 1 < len(parts))
            losses.append(loss.item())
        opt.step()
    return losses


def start(level, num_losses):
    model, opt = initialize(level, num_losses)
    if level in ("O1", "O2"):
        for scaler in _amp_state.loss_scalers:
            scaler._loss_scale = 2.0**20
    return model, opt


def final_state(model, opt, losses):
    return {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "amp": amp.state_dict(),
        "losses": losses,
    }


def finish(level):
    handle = getattr(_amp_state, "handle", None)
    if handle is not None:
        handle._deactivate()
        del _amp_state.handle


def train(out_dir):
    results = {}
    for level, num_losses in CONFIGS:
        model, opt = start(level, num_losses)
        losses = train_steps(model, opt, num_losses, range(N + M))
        results[(level, num_losses)] = final_state(model, opt, losses)
        finish(level)

        model, opt = start(level, num_losses)
        train_steps(model, opt, num_losses, range(N))
        torch.save(
            {"model": model.state_dict(), "optimizer": opt.state_dict(), "amp": amp.state_dict()},
            os.path.join(out_dir, f"{level}-{num_losses}.pt"),
        )
        finish(level)
    torch.save(results, os.path.join(out_dir, "uninterrupted.pt"))


def resume(out_dir):
    results = {}
    for level, num_losses in CONFIGS:
        checkpoint = torch.load(os.path.join(out_dir, f"{level}-{num_losses}.pt"), weights_only=False)
        model, opt = initialize(level, num_losses)
        model.load_state_dict(checkpoint["model"])
        opt.load_state_dict(checkpoint["optimizer"])
        amp.load_state_dict(checkpoint["amp"])
        losses = train_steps(model, opt, num_losses, range(N, N + M))
        results[(level, num_losses)] = final_state(model, opt, losses)
        finish(level)
    torch.save(results, os.path.join(out_dir, "resumed.pt"))


if __name__ == "__main__":
    {"train": train, "resume": resume}[sys.argv[1]](sys.argv[2])
