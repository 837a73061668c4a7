"""`python -m amp_migrate`: the `amp-migrate` command, where no console script is installed."""

from .cli.main import main

main(prog_name="amp-migrate")
