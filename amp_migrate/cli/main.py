"""The `amp-migrate` command line: click commands only; the work is in discover, runner and
report.

`amp-migrate PATH...` is short for `amp-migrate migrate PATH...`, as `ruff check`/`black`
users expect a path to be enough.
"""

from __future__ import annotations

import json
import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, NoReturn, Optional, cast

import click

from .. import __version__

# Each command imports what it uses (rich, the codemod, torch): `--version`, and `--check` on
# files without Apex, start fast enough for pre-commit and editors to call on every save.
if TYPE_CHECKING:
    from rich.console import Console

EXIT_OK, EXIT_CHANGES, EXIT_ERRORS, EXIT_INTERRUPTED = 0, 1, 2, 130
_PROGRESS_FROM = 20  # files; fewer finish before a bar would be worth drawing


class _PathsOrCommand(click.Group):
    """Sends `amp-migrate PATH...` (a first argument that names no subcommand) to `migrate`."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if (
            args
            and args[0] not in self.commands
            and args[0] not in ctx.help_option_names
            and args[0] != "--version"
        ):
            args = ["migrate", *args]
        return super().parse_args(ctx, args)

    def format_usage(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        formatter.write_usage(ctx.command_path, "[MIGRATE OPTIONS] PATH...")
        formatter.write_usage(ctx.command_path, "COMMAND [ARGS]...", prefix="   or: ")


@click.group(
    cls=_PathsOrCommand, no_args_is_help=True, context_settings={"help_option_names": ["-h", "--help"]}
)
@click.version_option(__version__, prog_name="amp-migrate")
def main() -> None:
    """Move PyTorch code off NVIDIA Apex mixed precision (apex.amp, fp16_utils, parallel).

    `amp-migrate PATH...` migrates files in place (the `migrate` command);
    `amp-migrate migrate --help` lists its options. Exit codes: 0 ok, 1 `--check` found
    files to change, 2 errors (usage, or files that could not be migrated), 130 interrupted.
    """


def _stdin_is_terminal() -> bool:
    return sys.stdin.isatty()


def _existing(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> tuple[str, ...]:
    for value in values:
        if not os.path.lexists(value):
            raise click.BadParameter(f"'{value}' does not exist.", ctx, param)
    return values


@contextmanager
def _progress(total: int, enabled: bool) -> Iterator[Callable[[], None]]:
    if not enabled:
        yield lambda: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("migrating"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as progress:
        task = progress.add_task("migrating", total=total)
        yield lambda: progress.advance(task)


def _review(results: list, console: Console, answer: str = "n") -> tuple[list, str]:
    """Ask about each changed file, as bowler does: y apply, n skip, a apply all, q quit; the
    last answer goes on to the next batch (the install files, judged after the Python files)."""
    from rich.text import Text

    from . import report, runner
    from .quoting import quote_path

    reviewed = []
    for result in results:
        if result.changed and result.error is None and answer not in ("a", "q"):
            console.print(Text(quote_path(result.path), style="bold"))
            report.print_diff(console, result.diff)
            answer = click.prompt(
                "Apply this change? [y]es, [n]o, [a]ll, [q]uit",
                type=click.Choice(["y", "n", "a", "q"]),
                show_choices=False,
            )
        if result.changed and result.error is None and answer in ("y", "a"):
            result = runner.write(result)
        reviewed.append(result)
    return reviewed, answer


@main.command()
@click.argument("paths", nargs=-1, required=True, callback=_existing, type=click.Path(path_type=str))
@click.option(
    "--target",
    type=click.Choice(["auto", "native", "shim"]),
    help="native torch.amp, the amp_shim runtime, or native where provably right "
    "and the shim otherwise.  [default: auto]",
)
@click.option("--device", help="Device type the native code autocasts on.  [default: cuda]")
@click.option(
    "--dtype",
    type=click.Choice(["float16", "bfloat16"]),
    help="Autocast dtype of the native code.  [default: float16]",
)
@click.option(
    "--unsafe-fixes/--no-unsafe-fixes",
    "unsafe_fixes",
    default=None,
    help="Also apply native rewrites that differ from Apex only as docs/differences.md documents "
    "(each named in its diagnostic); without it those files keep the shim.  [default: no]",
)
@click.option(
    "--diff",
    "--dry-run",
    "diff",
    is_flag=True,
    help="Write nothing; print a unified diff per file and a summary.",
)
@click.option(
    "-i", "--interactive", is_flag=True, help="Show each file's diff and ask: apply, skip, apply all, quit."
)
@click.option(
    "--check", is_flag=True, help="Write nothing; exit 1 if any file would change (for CI and pre-commit)."
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="json: one document on stdout for tools (docs/cli.md).",
)
@click.option(
    "--exclude", multiple=True, metavar="GLOB", help="Skip files and folders matching GLOB (repeatable)."
)
@click.option("--include", multiple=True, metavar="GLOB", help="Only take files matching GLOB (repeatable).")
@click.option(
    "--force-exclude",
    is_flag=True,
    help="Apply excludes to files named on the command line too (for pre-commit).",
)
@click.option("--no-gitignore", is_flag=True, help="Do not skip files that git ignores.")
@click.option(
    "--follow-symlinks",
    is_flag=True,
    help="Follow symlinks to files and folders found in folders (otherwise they are reported and skipped).",
)
@click.option("-j", "--jobs", type=click.IntRange(min=1), help="Worker processes.  [default: CPU count]")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar and no summary.")
@click.option("--no-color", is_flag=True, help="Plain text even on a terminal.")
def migrate(
    paths: tuple[str, ...],
    target: Optional[str],
    device: Optional[str],
    dtype: Optional[str],
    unsafe_fixes: Optional[bool],
    diff: bool,
    interactive: bool,
    check: bool,
    fmt: str,
    exclude: tuple[str, ...],
    include: tuple[str, ...],
    force_exclude: bool,
    no_gitignore: bool,
    follow_symlinks: bool,
    jobs: Optional[int],
    quiet: bool,
    no_color: bool,
) -> None:
    """Rewrite Apex-using Python files and notebooks under PATHS in place."""
    from rich.console import Console

    from . import report
    from .run_notes import run_notes

    if interactive and (diff or check or fmt == "json"):
        raise click.UsageError("--interactive cannot be combined with --diff, --check or --format json")
    if interactive and not _stdin_is_terminal():
        raise click.UsageError("--interactive asks questions, but stdin is not a terminal")
    asked = (target, device, dtype, unsafe_fixes)
    walk = (exclude, include, force_exclude, no_gitignore, follow_symlinks)
    options, files = _options_and_files(paths, asked, walk)
    mode = "interactive" if interactive else "check" if check else "diff" if diff else "fix"
    console = Console(
        file=sys.stdout, no_color=True if no_color else None, highlight=False, soft_wrap=True, emoji=False
    )
    start = time.perf_counter()
    results = _migrate_files(files, options, mode, diff or interactive, jobs, quiet, console)
    summary = report.Summary.of(results, time.perf_counter() - start)
    notes = run_notes(results, options, mode)
    if summary.failed:
        code = EXIT_ERRORS
    elif check and (summary.changed or summary.kept_apex):
        code = EXIT_CHANGES
    else:
        code = EXIT_OK
    if fmt == "json":
        document = report.json_document(
            results, summary, mode=mode, options=options, include_diff=diff, exit_code=code, notes=notes
        )
        click.echo(json.dumps(document, indent=2))
    else:
        report.print_report(console, results, summary, mode=mode, show_diff=diff, quiet=quiet, notes=notes)
    sys.exit(code)


def _options_and_files(paths: tuple[str, ...], asked: tuple, walk: tuple) -> tuple:
    """The run's Options (flags over the config file's settings) and the files it covers:
    `asked` is (target, device, dtype, unsafe_fixes), `walk` (exclude, include, force_exclude,
    no_gitignore, follow_symlinks), as the flags gave them."""
    target, device, dtype, unsafe_fixes = asked
    exclude, include, force_exclude, no_gitignore, follow_symlinks = walk
    from ..options import Options, Target
    from . import config, discover

    try:
        settings = config.find(paths)
    except config.ConfigError as exc:
        raise click.UsageError(str(exc)) from None
    try:
        options = Options(
            # Options checks the target against TARGETS at run time.
            cast(Target, target or settings.target or "auto"),
            device or settings.device or "cuda",
            dtype or settings.dtype or "float16",
            unsafe_fixes if unsafe_fixes is not None else bool(settings.unsafe_fixes),
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    filters = discover.Filters(
        exclude=tuple(discover.Glob(g, settings.folder) for g in settings.exclude)
        + tuple(discover.Glob(g) for g in exclude),
        include=tuple(discover.Glob(g) for g in include)
        or tuple(discover.Glob(g, settings.folder) for g in settings.include),
        gitignore=not no_gitignore,
        force_exclude=force_exclude,
        follow_symlinks=follow_symlinks,
    )
    return options, discover.discover(paths, filters)


def _migrate_files(
    files: list, options, mode: str, want_diff: bool, jobs: Optional[int], quiet: bool, console: Console
) -> list:
    """Every file's result, sorted by path: migrated by the workers, settled across modules by
    the project pass, written in fix mode (each group whole or not at all), reviewed in
    interactive mode. An interrupt leaves every file and group written in full or not at all."""
    from ..project import Tree
    from . import runner
    from .file_result import FileResult

    # What discovery could not take is reported as it is; nothing reads it.
    results: list = [
        FileResult(f.path, f.kind, error=f.error, notes=(f.note,) if f.note else ())
        for f in files
        if not f.taken
    ]
    from ..install.kinds import KINDS

    install_files = [(f.path, f.kind) for f in files if f.taken and f.kind in KINDS]
    install_files += [
        (f.path, "setup-py") for f in files if f.taken and os.path.basename(f.path) == "setup.py"
    ]
    files = [f for f in files if f.taken and f.kind not in KINDS]
    completed = _complete_interrupted(files) if mode == "fix" else _interrupted(files)
    left = {path for path, r in completed.items() if r.error is not None}  # kept out of the run
    results += [completed[path] for path in sorted(left)]
    files = [f for f in files if os.path.abspath(f.path) not in left]
    show_progress = not quiet and sys.stderr.isatty() and len(files) >= _PROGRESS_FROM
    jobs_ = [runner.Job(f.path, f.kind, options, want_diff=want_diff) for f in files]
    try:
        with (
            runner.Workers(jobs or runner.default_jobs(), len(jobs_)) as workers,
            _progress(len(jobs_), show_progress) as advance,
        ):
            stream = workers.results(jobs_)
            tree = Tree([f.path for f in files if f.kind == "python"], options, want_diff)
            for result in stream:
                _keep(results, tree.feed(result), mode)
                advance()
        results = [_with_notes(r, completed) for r in results]
        results.sort(key=lambda r: r.path)
        answer = "n"
        if mode == "interactive":
            results, answer = _review(results, console)
        if install_files:
            results += _install_results(install_files, results, mode, want_diff, console, answer, workers)
            results.sort(key=lambda r: (r.path, r.kind))
    except (KeyboardInterrupt, click.Abort):
        written = sum(r.written for r in results)
        click.echo(
            f"\nInterrupted: {written} file(s) written in full; every other file is as it was.", err=True
        )
        sys.exit(EXIT_INTERRUPTED)
    return results


def _install_results(
    install_files: list, results: list, mode: str, want_diff: bool, console: Console, answer: str, workers
) -> list:
    """The dependency files' results, judged by what the Python files import once migrated;
    none migrated where a worker died (the run stopped)."""
    from . import runner
    from .file_result import FileResult

    if workers.stopped:
        return [FileResult(path, kind, error=runner.STOPPED) for path, kind in install_files]
    from ..install.run import migrate_install_files

    installs = migrate_install_files(sorted(install_files), results, mode, want_diff)
    if mode == "interactive":
        installs, _ = _review(installs, console, answer)
    return [runner.write(r) if mode == "fix" else r for r in installs]


def _keep(results: list, finals: list, mode: str) -> None:
    """Add the final results to `results`, written in fix mode: a group all or none, and
    Ctrl-C taking effect once the whole group is written and counted."""
    if mode != "fix":
        results.extend(finals)
        return
    from ..io import group_write
    from ..io.atomic_write import interrupts_deferred

    with interrupts_deferred():
        results.extend(group_write.write_group(finals))


def _complete_interrupted(files: list) -> dict:
    """Finish the groups an earlier run was killed while writing (journal.py), before this run
    reads any file: each member's result as a note, or as the error that keeps it out of this
    run (it changed since, so its group cannot be completed and it must not be settled alone)."""
    from ..io.journal import complete_interrupted
    from .file_result import FileResult

    done = complete_interrupted(f.path for f in files)
    names = {os.path.abspath(f.path): f.path for f in files}
    kinds = {os.path.abspath(f.path): f.kind for f in files}
    results = {}
    for item in done:
        path = names.get(item.path, item.path)
        if item.state == "left":
            message = (
                "left as it is: an earlier run was stopped while writing its group, and completing "
                f"the group failed here: {item.reason}; compare it with the rest of its group by hand"
            )
            results[item.path] = FileResult(path, kinds.get(item.path, "python"), error=message)
            continue
        how = "written now" if item.state == "written" else "the earlier run had written it"
        note = f"an earlier run was stopped while writing this file's group; this run completed it ({how})"
        if item.path not in names:
            from .quoting import quote_path

            click.echo(f"{quote_path(path)}: {note}", err=True)
        results[item.path] = FileResult(path, kinds.get(item.path, "python"), notes=(note,))
    return results


def _interrupted(files: list) -> dict:
    """Without writing: a note on each member of a group an earlier run was stopped while
    writing, since what this run shows of it is the half-written state."""
    from ..io.journal import pending
    from .file_result import FileResult

    note = (
        "an earlier run began writing this file's group and had not finished when this run "
        "started; what is shown may be the group half written: a run that writes "
        "(`amp-migrate PATH`) completes it first"
    )
    return {path: FileResult(path, "python", notes=(note,)) for path in pending(f.path for f in files)}


def _with_notes(result, completed: dict):
    """`result` with the note of the interrupted group write this run completed, if any."""
    from dataclasses import replace

    done = completed.get(os.path.abspath(result.path))
    if done is None or done.error is not None:
        return result
    return replace(result, notes=result.notes + done.notes)


@main.command()
@click.argument("code", required=False)
def explain(code: Optional[str]) -> None:
    """Say what diagnostic CODE means, why, with a before/after example (no CODE: list all)."""
    from rich.console import Console

    from .. import docs
    from ..diagnostics import CODES
    from . import report

    docs.register_all_codes()
    console = Console(highlight=False, soft_wrap=False)
    if code is None:
        console.print(report.code_table())
        return
    if code.upper() not in CODES:
        raise click.BadParameter(
            f"no diagnostic {code!r}; `amp-migrate explain` lists them", param_hint="CODE"
        )
    report.explain(console, code.upper())


@main.command("convert-checkpoint")
@click.argument("source", type=click.Path(path_type=Path))  # checked by checkpoints, in one line
@click.argument("target", type=click.Path(path_type=Path))
@click.option(
    "--key",
    default="amp",
    show_default=True,
    help="Entry that holds amp.state_dict(); other entries are searched too.",
)
@click.option(
    "--to",
    "to",
    type=click.Choice(["torch", "apex"]),
    default="torch",
    show_default=True,
    help="torch: Apex formats → what migrated code loads; apex: GradScaler state → Apex's.",
)
@click.option(
    "--index",
    type=click.IntRange(min=0),
    default=None,
    help="With num_losses > 1: which loss scaler becomes the GradScaler.",
)
@click.option("--in-place", is_flag=True, help="Allow TARGET to be SOURCE.")
@click.option(
    "--unsafe-load",
    is_flag=True,
    help="Unpickle Python objects beyond tensors (FP16_Optimizer's state): runs code from the file.",
)
def convert_checkpoint(
    source: Path, target: Path, key: str, to: str, index: Optional[int], in_place: bool, unsafe_load: bool
) -> None:
    """Convert a checkpoint saved by Apex code so the migrated code can resume from it.

    Rewrites Apex amp scaler state to torch.amp.GradScaler state (or back with --to apex),
    FusedAdam/FusedAdagrad optimizer state to torch's layout, and FP16_Optimizer state to the
    wrapped optimizer's; every other entry is written back untouched, atomically.
    """
    from ..checkpoints import convert as checkpoints  # torch is imported only by this command

    if source.resolve() == target.resolve() and not in_place:
        _fail(f"{target}: TARGET is SOURCE; pass --in-place to overwrite it")
    try:
        checkpoints.check_target(target)
        loaded = checkpoints.load(source, unsafe=unsafe_load)
        try:
            converted, changes = checkpoints.convert(loaded, key=key, to=to, index=index)
        except checkpoints.CheckpointError as exc:  # its message starts with the entry: [name]
            raise checkpoints.CheckpointError(f"{source}{exc}") from None
        if changes:
            checkpoints.save_atomically(converted, target)
    except checkpoints.CheckpointError as exc:
        _fail(str(exc))
    if not changes:
        click.echo(f"{source}: nothing to convert (no Apex state found); {target} not written", err=True)
        sys.exit(1)
    for change in changes:
        click.echo(f"{source}{change.where}: {change.what}", err=True)
    click.echo(f"wrote {target}", err=True)


def _fail(message: str) -> NoReturn:
    """One line on stderr and exit 2: scripts read the line, and no traceback hides it."""
    click.echo("error: " + " ".join(message.split()), err=True)
    sys.exit(EXIT_ERRORS)


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--force", is_flag=True, help="Use the shim even where a real Apex is installed.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED, required=True)
def run(force: bool, command: tuple[str, ...]) -> None:
    """Run legacy Apex code unchanged on the shim: amp-migrate run -- python train.py ARGS.

    Any command works (`torchrun --nproc-per-node 2 train.py`, `python -m pkg.train`): it runs
    as written, and every Python process it starts imports `apex` as the shim.
    """
    from amp_shim.launch import run_command

    sys.exit(run_command(list(command), force=force))


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option(
    "--steps",
    type=click.IntRange(min=1),
    default=20,
    show_default=True,
    help="Optimizer steps to record in each run; both runs stop there.",
)
@click.option(
    "--device",
    help="Device type the copy's native code autocasts on, as for `migrate`.  [default: the tree's "
    "(pyproject.toml [tool.amp-migrate], else cuda) where torch can run it, else cpu]",
)
@click.option(
    "--dtype",
    type=click.Choice(["float16", "bfloat16"]),
    help="Autocast dtype of the copy's native code, as for `migrate`.  [default: the tree's, else float16]",
)
@click.option(
    "--target",
    type=click.Choice(["auto", "native", "shim"]),
    help="The migration's target, as for `migrate`.  [default: the tree's, else auto]",
)
@click.option(
    "--unsafe-fixes/--no-unsafe-fixes",
    "unsafe_fixes",
    default=None,
    help="Migrate the copy with `migrate --unsafe-fixes` and accept, in the quantities its applied "
    "fixes' docs/differences.md entries name, the differences they document.  [default: the tree's, else no]",
)
@click.option(
    "--rtol",
    type=click.FloatRange(min=0.0),
    default=None,
    help="Largest relative difference per recorded quantity that still passes. Default: 0 (bit for "
    "bit), or 0.05 where the legacy program computes in another precision (O2/O3, FP16_Optimizer).",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="json: one document on stdout for CI (docs/cli.md, verify).",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0.0),
    default=900.0,
    show_default=True,
    help="Seconds each run may take; a run still going then is killed and fails (0: no limit).",
)
@click.option(
    "--allow-no-amp",
    is_flag=True,
    help="Let a run pass in which the legacy program made no Apex amp call (amp.initialize, "
    "amp.scale_loss, an amp or FP16_Optimizer step): such runs do not exercise the migration.",
)
@click.option(
    "--show-output",
    is_flag=True,
    help="Stream each run's stdout and stderr as it goes, after a [legacy] or [migrated] prefix "
    "(they are saved to files either way).",
)
@click.argument("command", nargs=-1, type=click.UNPROCESSED, required=True)
def verify(
    steps: int,
    device: Optional[str],
    dtype: Optional[str],
    target: Optional[str],
    unsafe_fixes: Optional[bool],
    rtol: Optional[float],
    fmt: str,
    timeout: float,
    allow_no_amp: bool,
    show_output: bool,
    command: tuple[str, ...],
) -> None:
    """Prove a migration on your own script: amp-migrate verify -- python train.py ARGS.

    Also `-- torchrun --nproc-per-node N train.py ARGS`: every rank is compared.

    Copies the current directory twice, migrates one copy, runs the original on the shim in the
    other and the migrated copy, each recorded for --steps optimizer steps with the same seed,
    and compares them step by step; your files are left as they are (a run that changed one
    fails the verify). Exit 0: identical, within the tolerance, or different only where the
    migration is documented to differ; 1: diverged, failed, never stepped, no amp call ran in
    the legacy run (--allow-no-amp accepts that), or a run changed your files.
    """
    from rich.console import Console
    from rich.text import Text

    from ..runs import progress, tree_migration, verify_report, verify_run

    try:
        parsed = verify_run.parse_command(command, Path.cwd())
        choice = tree_migration.choose(Path.cwd(), target, device, dtype, unsafe_fixes)
    except (verify_run.UsageProblem, tree_migration.SettingsProblem) as exc:
        raise click.UsageError(str(exc)) from None
    settings = verify_run.Settings.of(choice, steps, rtol, timeout or None, allow_no_amp)
    console = Console(highlight=False, emoji=False, stderr=fmt == "json")
    if not console.is_terminal:
        console.width = 160  # the table's nine columns, readable in a log
    watch: progress.Watch = progress.Watch()
    if console.is_terminal and fmt == "text":
        watch = progress.Live(console, show_output)
    elif show_output:
        watch = progress.Lines(console)
    if fmt == "text":
        for line in tree_migration.note_lines(choice):
            console.print(Text(line))
    try:
        outcome = verify_run.verify(parsed, Path.cwd(), settings, watch)
    except verify_run.UsageProblem as exc:
        raise click.UsageError(str(exc)) from None
    finally:
        watch.close()
    code = 0 if outcome.verdict.passed else 1
    if fmt == "json":
        click.echo(json.dumps(verify_report.json_document(outcome, code, choice), indent=2))
    else:
        verify_report.print_text(console, outcome)
    sys.exit(code)


if __name__ == "__main__":
    main(prog_name="amp-migrate")
