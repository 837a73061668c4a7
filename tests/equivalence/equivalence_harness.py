"""The equivalence harness: one legacy Apex program, three ways, compared.

For a case (a program from fixtures/programs/equivalence/ plus its arguments):

* ``shim``: the program unchanged, through ``python -m amp_shim`` (``import apex`` -> amp_shim);
* ``native``: ``migrate_source(target="native", device="cpu")`` of it, run with plain torch
  (apex and amp_shim blocked from import, and checked not imported);
* ``shim-target``: ``migrate_source(target="shim")`` of it (imports rewritten to amp_shim), run
  with plain ``python``.

A notebook program (`.ipynb`) runs as its code cells joined into a script, with the IPython
lines it uses played the way IPython runs them (notebook_programs.py); its migrations are the
notebook migrations (`amp_migrate.io.notebook`).

A project program is a directory (Apex set up in one module, used in others): it runs from its
`entry` script, and each migration migrates the whole tree as `amp-migrate DIR` does; the
native migration falls back when any file of the tree uses the shim.

Each run goes through recorder.py, which records losses, real optimizer steps, loss scales and
final parameters from outside the program. `compare` checks a pair of runs against the case's
expectation: "exact" (O0, O1, bf16: the shim's O1 is the native recipe) or a measured tolerance
(O2/O3, where native keeps fp32 weights; the bounds are documented in docs/differences.md).
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from forked_runs import RunFailed, launch, stop_zygotes
from forked_runs import base_env as _env

ROOT = Path(__file__).resolve().parents[2]
PROGRAMS = ROOT / "fixtures" / "programs" / "equivalence"
RECORDER = ROOT / "amp_migrate" / "runs" / "recorder.py"
MODES = ("shim", "native", "shim-target")


@dataclass(frozen=True)
class Tolerance:
    """Documented bounds for a native-vs-shim pair that cannot be bit-equal (docs/differences.md)."""

    loss_rel: float  # max |native - shim| / |shim| over the per-iteration losses
    param_rel: float  # ||native - shim|| / ||shim|| over all final parameters together
    converge: float  # both runs: mean of the last 5 losses <= converge * mean of the first 5


@dataclass(frozen=True)
class Case:
    id: str
    program: str
    args: tuple = ()
    covers: str = ""
    # "exact": losses, real steps, loss scales and final parameters equal bit for bit.
    # "static-overflow": exact until the first step with non-finite gradients, where the
    # difference AMP111 documents for a static loss scale starts (Apex applies the step and
    # keeps its scale, GradScaler skips it and halves its scale); `compare_static_overflow`
    # checks that difference, it does not waive it.
    expect: str = "exact"
    tolerance: Optional[Tolerance] = None
    # How the shim's loss scales relate to native's: "equal" (same list), "per_loss" (native's
    # single GradScaler equals the smallest of the shim's per-loss scalers: num_losses/loss_id),
    # "native_disabled" (bf16: native's GradScaler is disabled, get_scale() is 1.0), "newest"
    # (several `initialize` calls: the shim's scales equal native's newest GradScaler's), "own"
    # (scales not compared).
    scales: str = "equal"
    dtype: str = "float16"
    env: tuple = ()  # extra environment of the shim runs, e.g. (("AMP_SHIM_DTYPE", "bfloat16"),)
    # Several invocations in one working directory (checkpoint save, then resume); results are
    # concatenated. Each is a tuple of arguments; "{dir}" is replaced by the working directory.
    phases: tuple = ()
    # Expected fallback of the native migration (a known codemod limit): the diagnostic code.
    native_xfail: str = ""
    # The native migration is `--unsafe-fixes`'s and applies exactly these docs/differences.md
    # entries' fixes (ids separated by spaces; the default tier keeps the program on the
    # shim); "": a safe migration.
    unsafe: str = ""
    # The recorder's mode for the native run: "migrated" where the native code keeps a class
    # from `amp_shim` (AMP505), so the run may import `amp_shim` but never `apex`.
    native_mode: str = "native"
    # What the run must show besides equality (e.g. the storm must skip steps).
    min_skipped: int = 0
    # A project program (a directory): the script that runs it.
    entry: str = "main.py"
    # The program imports Apex only where it uses it (a provider's import under `if fp16:`), so
    # this run (fp16 off) never imports it, through the alias or otherwise.
    apex_unused: bool = False

    @property
    def path(self) -> Path:
        return PROGRAMS / self.program

    @property
    def entries(self) -> tuple:
        """The docs/differences.md entries of the unsafe fixes its migration applies."""
        from amp_migrate.differences import DIFFERENCES

        return tuple(DIFFERENCES[e] for e in self.unsafe.split())

    @property
    def is_project(self) -> bool:
        return self.path.is_dir()


class MigrationFellBack(Exception):
    def __init__(self, diagnostics):
        self.diagnostics = diagnostics
        super().__init__("; ".join(f"{d.code} line {d.line}: {d.message}" for d in diagnostics))


#: CPython 3.11 keeps the AST constructor's recursion depth in interpreter-wide state, so two
#: threads building ASTs at once can fail with "SystemError: AST constructor recursion depth
#: mismatch" (python/cpython#106905). The runner migrates from a thread pool: one at a time.
_MIGRATING = threading.Lock()


#: (kind, case, target) -> the migration's output or its MigrationFellBack: each program is
#: migrated once per process, whether a run, a test or the report asks first.
_MIGRATED: dict = {}


def _memo(kind: str, case: Case, target: str, migrate_once):
    with _MIGRATING:
        key = (kind, case, target)
        if key not in _MIGRATED:
            try:
                _MIGRATED[key] = migrate_once(case, target)
            except MigrationFellBack as exc:
                _MIGRATED[key] = exc
        found = _MIGRATED[key]
    if isinstance(found, MigrationFellBack):
        raise found
    return found


def migrate(case: Case, target: str) -> str:
    return _memo("source", case, target, _migrate)


def migrate_tree(case: Case, target: str) -> dict[str, str]:
    """A project program's files (relative path -> code) as `amp-migrate DIR` leaves them."""
    return dict(_memo("tree", case, target, _migrate_tree))


def _migrate_tree(case: Case, target: str) -> dict[str, str]:
    from amp_migrate import migrate_source

    files = {str(p.relative_to(case.path)): p.read_text() for p in sorted(case.path.rglob("*.py"))}
    try:
        from amp_migrate.project import migrate_project
    except ImportError:  # no project pass: each file alone
        results = {
            name: migrate_source(
                text, target=target, device="cpu", dtype=case.dtype, unsafe_fixes=bool(case.unsafe)
            )
            for name, text in files.items()
        }
    else:
        results = migrate_project(
            files, target=target, device="cpu", dtype=case.dtype, unsafe_fixes=bool(case.unsafe)
        )
    fell_back = [d for r in results.values() if r.changed and r.target_used != target for d in r.diagnostics]
    if fell_back or not any(r.changed for r in results.values()):
        raise MigrationFellBack(fell_back or [d for r in results.values() for d in r.diagnostics])
    if target == "native":
        _check_unsafe(case, [d for r in results.values() for d in r.diagnostics])
    return {name: results[name].code for name in files}


def _check_unsafe(case: Case, diagnostics) -> None:
    """A case's native migration applies the unsafe fixes of its entry and no other."""
    from amp_migrate.diagnostics import CODES

    entries = {CODES[d.code].unsafe for d in diagnostics if d.unsafe}
    expected = set(case.unsafe.split())
    assert entries == expected, (
        f"{case.id}: the native migration applies unsafe fixes of {entries or 'no entry'}"
    )


def _migrate(case: Case, target: str) -> str:
    from amp_migrate import migrate_source

    if case.is_project:
        return "".join(f"# {name}\n{code}" for name, code in _migrate_tree(case, target).items())

    if case.program.endswith(".ipynb"):  # the migrated cells, as a script (notebook_programs.py)
        from notebook_programs import migrated

        code, used, findings = migrated(case.path, target, "cpu", case.dtype)
        if used != target:
            raise MigrationFellBack([f.diagnostic for f in findings])
        return code
    result = migrate_source(
        case.path.read_text(), target=target, device="cpu", dtype=case.dtype, unsafe_fixes=bool(case.unsafe)
    )
    if result.target_used != target:
        raise MigrationFellBack([d for d in result.diagnostics])
    if target == "native":
        _check_unsafe(case, result.diagnostics)
    return result.code


def _run_once(case: Case, mode: str, workdir: Path, source: Path, args, tag: str, fresh=False) -> dict:
    result = workdir / f"{tag}.json"
    argv = [RECORDER, "--mode", case.native_mode if mode == "native" else "shim", result, source, *args]
    env = _env(case.env if mode != "native" else ())
    rc, stdout, stderr = launch(argv, shim=mode == "shim", env=env, cwd=workdir, fresh=fresh)
    if rc != 0 or not result.exists():
        raise RunFailed(f"{case.id} [{mode}] exited {rc}\n{stdout[-2000:]}\n{stderr[-4000:]}")
    data = json.loads(result.read_text())
    data["stdout"] = stdout
    data["stderr"] = stderr
    return data


def run(case: Case, mode: str, base: Path, fresh: bool = False) -> dict:
    """Run `case` in `mode` (all its phases) under `base`; the combined record."""
    import torch

    workdir = base / case.id / (mode + ("-fresh" if fresh else ""))
    workdir.mkdir(parents=True, exist_ok=True)
    if case.is_project:
        tree = case.path if mode == "shim" else workdir / "src"
        if mode != "shim":
            for name, code in migrate_tree(case, "native" if mode == "native" else "shim").items():
                (tree / name).parent.mkdir(parents=True, exist_ok=True)
                (tree / name).write_text(code)
        source = tree / case.entry
    elif mode == "shim":
        source = case.path
        if case.program.endswith(".ipynb"):
            from notebook_programs import cell_sources, script

            source = workdir / (case.path.stem + ".py")
            source.write_text(script(cell_sources(case.path.read_bytes())))
    else:
        source = workdir / (Path(case.program).stem + ".py")
        source.write_text(migrate(case, "native" if mode == "native" else "shim"))
    phases = case.phases or (case.args,)
    combined = {
        "losses": [],
        "scales": [],
        "steps": [],
        "step_records": [],
        "imported": [],
        "stdout": "",
        "stderr": "",
    }
    for n, phase in enumerate(phases):
        args = [a.replace("{dir}", str(workdir)) for a in phase]
        data = _run_once(case, mode, workdir, source, args, f"phase{n}", fresh)
        offset = len(combined["losses"])
        combined["losses"] += [[float(v) for v in line] for line in data["losses"]]
        combined["scales"] += data["scales"]
        combined["step_records"] += data["step_records"]
        combined["precision"] = sorted(set(combined.get("precision", [])) | set(data["precision"]))
        combined["steps"] += [[it + offset, opt] for it, opt in data["steps"]]
        combined["imported"] = sorted(set(combined["imported"]) | set(data["imported"]))
        combined["apex_installed"] = combined.get("apex_installed", False) or data["apex_installed"]
        combined["stdout"] += data["stdout"]
        combined["stderr"] += data["stderr"]
        combined["num_optimizers"] = data["num_optimizers"]
        combined["params"] = torch.load(data["params"])
    return combined


# -- running many at once ---------------------------------------------------------------------
class Runner:
    """Runs cases' modes in a small pool and caches the records (one per case and mode).

    With `shared` (a folder every pytest-xdist worker of the session sees), each case and mode
    runs once for all the workers: whoever takes its lock first runs it and leaves the record
    there, and the others read that record. Queued runs that another worker has taken are left
    to it; `get` then waits for its record.
    """

    def __init__(
        self, base: Optional[Path] = None, workers: Optional[int] = None, shared: Optional[Path] = None
    ) -> None:
        self.base = Path(base or tempfile.mkdtemp(prefix="amp-equivalence-"))
        self.shared = shared
        self.pool = ThreadPoolExecutor(max_workers=workers or max(2, os.cpu_count() or 2))
        self.futures: dict = {}
        self.lock = threading.Lock()

    def submit(self, case: Case, modes=MODES) -> None:
        with self.lock:
            for mode in modes:
                key = (case.id, mode)
                if key not in self.futures:
                    self.futures[key] = self.pool.submit(self._obtain, case, mode, False)

    def get(self, case: Case, mode: str) -> dict:
        self.submit(case, MODES)  # start the siblings too: the tests of one case want all three
        record = self.futures[(case.id, mode)].result()
        return record if record is not None else self._obtain(case, mode, True)

    def _obtain(self, case: Case, mode: str, wait: bool) -> Optional[dict]:
        """The record, run here or read from `shared`; None if another worker holds it and
        `wait` is false."""
        if self.shared is None:
            return run(case, mode, self.base)
        import fcntl

        import torch

        record = self.shared / f"{case.id}.{mode}.pt"
        with open(self.shared / f"{case.id}.{mode}.lock", "a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            except BlockingIOError:
                return None
            if record.exists():
                return torch.load(record)
            data = run(case, mode, self.base)
            partial = record.with_name(f"{record.name}.{os.getpid()}")
            torch.save(data, partial)
            os.replace(partial, record)
            return data

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)
        stop_zygotes()


# -- comparing ----------------------------------------------------------------------------------
def skipped(record: dict) -> list:
    """(iteration, optimizer) pairs where an optimizer that steps in some iteration did not.

    Computed over the iterations up to the last loss line; an optimizer that steps only every
    k-th iteration (accumulation) shows its off-iterations in both runs alike.
    """
    taken = {tuple(s) for s in record["steps"]}
    n = len(record["losses"])
    return sorted((i, o) for o in range(record["num_optimizers"]) for i in range(n) if (i, o) not in taken)


def _same_float(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def _same_tensor(p, q) -> bool:
    """Bit for bit, NaN where the other has NaN (a step Apex applied on inf/NaN gradients)."""
    import torch

    nan = p.isnan()
    return torch.equal(nan, q.isnan()) and torch.equal(p.masked_fill(nan, 0), q.masked_fill(nan, 0))


def compare_exact(case: Case, ref: dict, other: dict, scales: str = "equal") -> list:
    """Every difference between two runs that must be identical; [] when they are."""

    problems = []
    if len(ref["losses"]) != len(other["losses"]):
        problems.append(f"{len(ref['losses'])} vs {len(other['losses'])} iterations")
    for i, (a, b) in enumerate(zip(ref["losses"], other["losses"])):
        if len(a) != len(b) or not all(_same_float(x, y) for x, y in zip(a, b)):
            problems.append(f"loss at iteration {i}: {a} vs {b}")
            break
    if sorted(map(tuple, ref["steps"])) != sorted(map(tuple, other["steps"])):
        problems.append(f"skipped steps: {skipped(ref)} vs {skipped(other)}")
    problems += compare_scales(ref, other, scales)
    if ref["num_optimizers"] != other["num_optimizers"]:
        problems.append(f"{ref['num_optimizers']} vs {other['num_optimizers']} optimizers")
    for k, (ps, qs) in enumerate(zip(ref["params"], other["params"])):
        if len(ps) != len(qs):
            problems.append(f"optimizer {k}: {len(ps)} vs {len(qs)} params")
            continue
        for j, (p, q) in enumerate(zip(ps, qs)):
            if p.shape != q.shape or not _same_tensor(p, q):
                diff = (p - q).abs().max().item() if p.shape == q.shape else "shape"
                problems.append(f"optimizer {k} param {j} differs (max abs {diff})")
                break
    return problems


def compare_scales(ref: dict, other: dict, how: str) -> list:
    a, b = ref["scales"], other["scales"]
    if how == "equal":
        return [] if a == b else [f"loss scales: {a} vs {b}"]
    if how == "newest":
        # Apex's scalers are those of the newest `initialize`; the recorder lists every
        # GradScaler created, so the newest one (the last) is Apex's counterpart.
        if len(a) != len(b):
            return [f"{len(a)} iterations of loss scales vs {len(b)}"]
        bad = [i for i, (s, n) in enumerate(zip(a, b)) if s != n[-1:]]
        return [f"loss scales at iterations {bad[:5]}: {a[bad[0]]} vs {b[bad[0]]}"] if bad else []
    if how == "per_loss":
        # ref: the shim's per-loss scalers; other: native's one GradScaler, which backs off for
        # every loss when any overflows. With isolated overflows it is the smallest per-loss scale.
        bad = [i for i, (s, n) in enumerate(zip(a, b)) if len(n) != 1 or min(s) != n[0]]
        return [f"loss scales at iterations {bad[:5]}: {a[bad[0]]} vs {b[bad[0]]}"] if bad else []
    if how == "native_disabled":  # native bf16: disabled GradScaler (scale 1.0), shim constant
        problems = []
        if any(s != [1.0] for s in b):
            problems.append(f"native scales {b[:3]}... are not a disabled GradScaler's")
        if len({tuple(s) for s in a}) > 1:
            problems.append(f"shim bf16 scale changed: {a}")
        return problems
    if how == "own":
        return []
    raise ValueError(how)


def compare_static_overflow(shim: dict, native: dict) -> list:
    """A static loss scale (AMP111): the runs agree bit for bit up to the first iteration whose
    gradients are not finite, where Apex applies the step and keeps its scale while GradScaler
    skips the step and halves its scale, which then never grows back. Every departure from that
    is reported."""
    import torch

    problems = []
    if len(shim["losses"]) != len(native["losses"]):
        problems.append(f"{len(shim['losses'])} vs {len(native['losses'])} iterations")
    native_skips = skipped(native)
    if not native_skips:
        return problems + ["no step with non-finite gradients: nothing tells the two runs apart"]
    k = native_skips[0][0]
    for i, (a, b) in enumerate(zip(shim["losses"][: k + 1], native["losses"][: k + 1])):
        if len(a) != len(b) or not all(_same_float(x, y) for x, y in zip(a, b)):
            problems.append(f"loss at iteration {i} (before the overflow at {k}): {a} vs {b}")
            break

    def before(record):
        return sorted(tuple(s) for s in record["steps"] if s[0] < k)

    if before(shim) != before(native):
        problems.append(f"steps before the overflow at {k} differ")
    if skipped(shim):
        problems.append(f"the shim skipped {skipped(shim)[:3]}: Apex's static scale never skips")
    static = shim["scales"][0][0]
    if any(s != [static] for s in shim["scales"]):
        problems.append(f"the shim's static scale changed: {sorted({s[0] for s in shim['scales']})}")
    if native["scales"][:k] != shim["scales"][:k]:
        problems.append("native scales differ before the overflow")
    after = [s[0] for s in native["scales"][k + 1 :]]
    if not after or after[0] != static / 2 or max(after) > static / 2:
        problems.append(
            f"native scales after the overflow {after[:3]}...: not halved to {static / 2} for good"
        )
    if all(torch.isfinite(p).all() for ps in shim["params"] for p in ps):
        problems.append("the shim's parameters are finite: Apex applied no non-finite step")
    if not all(torch.isfinite(p).all() for ps in native["params"] for p in ps):
        problems.append("native parameters are not finite: GradScaler applied a non-finite step")
    return problems


def relative_gaps(ref: dict, other: dict) -> tuple[float, float]:
    """(max relative loss gap, max relative parameter gap) between two runs."""

    loss_gap = 0.0
    for a, b in zip(ref["losses"], other["losses"]):
        for x, y in zip(a, b):
            if math.isfinite(x) and math.isfinite(y):
                loss_gap = max(loss_gap, abs(x - y) / max(abs(x), 1e-12))
            elif not (_same_float(x, y)):
                loss_gap = math.inf
    diff = norm = 0.0
    for ps, qs in zip(ref["params"], other["params"]):
        for p, q in zip(ps, qs):
            diff += (p.double() - q.double()).pow(2).sum().item()
            norm += p.double().pow(2).sum().item()
    return loss_gap, math.sqrt(diff) / max(math.sqrt(norm), 1e-30)


def convergence(record: dict) -> float:
    """mean of the last 5 iterations' first loss / mean of the first 5."""
    first = [line[0] for line in record["losses"][:5]]
    last = [line[0] for line in record["losses"][-5:]]
    return (sum(last) / len(last)) / (sum(first) / len(first))


def compare_tolerance(case: Case, shim: dict, native: dict) -> list:
    tol = case.tolerance
    problems = []
    if len(shim["losses"]) != len(native["losses"]):
        problems.append(f"{len(shim['losses'])} vs {len(native['losses'])} iterations")
    loss_gap, param_gap = relative_gaps(shim, native)
    if loss_gap > tol.loss_rel:
        problems.append(f"loss gap {loss_gap:.3g} > documented {tol.loss_rel:g}")
    if param_gap > tol.param_rel:
        problems.append(f"parameter gap {param_gap:.3g} > documented {tol.param_rel:g}")
    for name, record in (("shim", shim), ("native", native)):
        ratio = convergence(record)
        if not ratio <= tol.converge:
            problems.append(f"{name} does not converge: last/first loss {ratio:.3f} > {tol.converge}")
    if skipped(shim) != skipped(native):
        problems.append(f"skipped steps: {skipped(shim)} vs {skipped(native)}")
    problems += compare_scales(shim, native, case.scales)
    return problems
