"""The `amp-migrate` command line."""
from __future__ import annotations

import os
import subprocess
import sys

import click

from . import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="amp-migrate")
def main() -> None:
    """Move PyTorch code off NVIDIA Apex mixed precision (apex.amp, fp16_utils, parallel)."""


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--force", is_flag=True, help="Use the shim even where a real Apex is installed.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED, required=True)
def run(force: bool, command: tuple[str, ...]) -> None:
    """Run a legacy Apex script unchanged on the shim: amp-migrate run -- python train.py ARGS."""
    program = os.path.basename(command[0])
    if not program.startswith("python") or len(command) < 2 or command[1].startswith("-"):
        raise click.UsageError("run takes a Python script: amp-migrate run -- python SCRIPT [ARGS]...")
    args = [command[0], "-m", "amp_shim"] + (["--force"] if force else []) + list(command[1:])
    sys.exit(subprocess.call(args))
