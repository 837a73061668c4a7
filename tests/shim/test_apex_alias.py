"""Legacy code that says `from apex import amp` runs unchanged through `python -m amp_shim`."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "fixtures" / "examples" / "legacy_project" / "train.py"


def run(args, cwd, extra_env=None):
    env = dict(os.environ, OMP_NUM_THREADS="1", **(extra_env or {}))
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True)


@pytest.mark.slow
def test_bundled_legacy_example_trains_through_the_shim(tmp_path):
    proc = run(["-m", "amp_shim", str(EXAMPLE), "--steps", "30"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "running with the Apex-compatible shim" in proc.stderr
    losses = [float(v) for v in re.findall(r"step +\d+  loss (\d+\.\d+)", proc.stdout)]
    assert len(losses) == 4 and losses[-1] < 0.5 * losses[0]
    assert re.search(r"held-out loss \d+\.\d+  accuracy 0\.\d+", proc.stdout)
    assert "'loss_scaler0': {'loss_scale': 65536.0, 'unskipped': 30}" in proc.stdout


@pytest.mark.slow
def test_alias_resolves_apex_modules_to_the_shim(tmp_path):
    script = tmp_path / "probe.py"
    script.write_text(
        "import sys\n"
        "import apex\n"
        "from apex import amp\n"
        "import apex.amp.scaler as S\n"
        "from apex.amp import _amp_state\n"
        "import amp_shim.amp, amp_shim.amp.scaler\n"
        "assert amp is amp_shim.amp and S is amp_shim.amp.scaler\n"
        "assert _amp_state is amp_shim.amp._amp_state\n"
        "assert sys.argv == [sys.argv[0], 'x', '--y'] and __name__ == '__main__'\n"
        "print('ok')\n"
    )
    proc = run(["-m", "amp_shim", str(script), "x", "--y"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


@pytest.mark.slow
def test_a_real_apex_wins_unless_forced(tmp_path):
    fake = tmp_path / "site" / "apex" / "amp"
    fake.mkdir(parents=True)
    (fake.parent / "__init__.py").write_text("REAL = True\n")
    (fake / "__init__.py").write_text("")
    script = tmp_path / "probe.py"
    script.write_text("import apex\nprint(getattr(apex, 'REAL', False))\n")
    env = {"PYTHONPATH": str(tmp_path / "site")}
    assert run(["-m", "amp_shim", str(script)], tmp_path, env).stdout.strip() == "True"
    forced = run(["-m", "amp_shim", "--force", str(script)], tmp_path, env)
    assert forced.stdout.strip() == "False", forced.stderr


# -- the alias in this process ----------------------------------------------------------------
import importlib  # noqa: E402
import textwrap  # noqa: E402
import types  # noqa: E402

from amp_shim import alias, launch  # noqa: E402

ANNOUNCEMENT = alias.ANNOUNCEMENT


@pytest.fixture
def installed_alias():
    assert alias.install(force=True)
    yield
    alias.uninstall()


def test_importing_a_submodule_by_its_apex_name_keeps_the_amp_state_object(installed_alias):
    import amp_shim

    importlib.import_module("apex.amp._amp_state")
    importlib.import_module("apex.amp.scaler")
    apex_amp = importlib.import_module("apex.amp")
    assert not isinstance(apex_amp._amp_state, types.ModuleType)
    assert apex_amp._amp_state is importlib.import_module("amp_shim.amp")._amp_state
    assert amp_shim.__spec__.name == "amp_shim" and amp_shim.amp.__spec__.name == "amp_shim.amp"


def test_alias_covers_apex_module_layout(installed_alias):
    from apex.amp import half_function, init, register_half_function  # noqa: F401
    from apex.amp.frontend import O1, Properties, opt_levels  # noqa: F401
    from apex.amp.handle import AmpHandle, NoOpHandle  # noqa: F401
    from apex.amp.lists import functional_overrides, tensor_overrides, torch_overrides  # noqa: F401
    from apex.amp.opt import OptimWrapper  # noqa: F401
    from apex.amp.scaler import LossScaler, master_params  # noqa: F401
    from apex.multi_tensor_apply import multi_tensor_applier

    assert multi_tensor_applier.chunk_size == 2048 * 32
    with pytest.raises(ImportError):
        importlib.import_module("apex.contrib")


def test_real_apex_check_does_not_run_apex_code(tmp_path, monkeypatch):
    site_dir = tmp_path / "site"
    (site_dir / "apex" / "amp").mkdir(parents=True)
    (site_dir / "apex" / "__init__.py").write_text("raise RuntimeError('apex was executed')\n")
    (site_dir / "apex" / "amp" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(site_dir))
    assert alias.real_apex_available()
    assert not alias.install()
    assert "apex" not in __import__("sys").modules


def test_env_setting_reads_the_variable():
    assert alias.env_setting({}) is None
    assert alias.env_setting({"AMP_SHIM_ALIAS": "0"}) is None
    assert alias.env_setting({"AMP_SHIM_ALIAS": "1"}) == "auto"
    assert alias.env_setting({"AMP_SHIM_ALIAS": "FORCE"}) == "force"


def test_the_start_up_hook_is_installed_in_this_interpreter():
    assert launch.hook_installed(), (
        "amp_shim_alias.pth is missing from site-packages: reinstall (pip install -e .)"
    )


# -- child processes ------------------------------------------------------------------------------
def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("AMP_SHIM_ALIAS")}
    env.update(OMP_NUM_THREADS="1", **extra)
    return env


def run_clean(args, cwd, **extra):
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=clean_env(**extra), capture_output=True, text=True, timeout=120
    )


def write(path, source):
    path.write_text(textwrap.dedent(source))
    return path


@pytest.mark.slow
def test_subprocesses_of_a_legacy_script_get_the_alias_and_the_line_appears_once(tmp_path):
    script = write(
        tmp_path / "parent.py",
        """
        import subprocess, sys
        import apex
        child = subprocess.run([sys.executable, "-c", "import apex; print(apex.__name__)"],
                               capture_output=True, text=True)
        sys.stderr.write(child.stderr)
        print("parent", apex.__name__, "child", child.stdout.strip())
        clean = {k: v for k, v in __import__("os").environ.items() if not k.startswith("AMP_SHIM")}
        bare = subprocess.run([sys.executable, "-c", "import apex"], env=clean, capture_output=True)
        print("bare child rc", bare.returncode)
    """,
    )
    proc = run_clean(["-m", "amp_shim", str(script)], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["parent amp_shim child amp_shim", "bare child rc 1"]
    assert proc.stderr.splitlines() == [ANNOUNCEMENT]


@pytest.mark.slow
def test_multiprocessing_spawn_workers_get_the_alias(tmp_path):
    script = write(
        tmp_path / "spawner.py",
        """
        import multiprocessing as mp

        def worker(_):
            import apex
            return apex.__name__

        if __name__ == "__main__":
            with mp.get_context("spawn").Pool(1) as pool:
                print(pool.map(worker, [0]))
    """,
    )
    proc = run_clean(["-m", "amp_shim", str(script)], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "['amp_shim']"
    assert proc.stderr.count(ANNOUNCEMENT) == 1


@pytest.mark.slow
def test_the_variable_alone_aliases_a_plain_python_process_and_announces_once(tmp_path):
    code = (
        "import subprocess, sys, apex; print(apex.__name__); "
        "subprocess.run([sys.executable, '-c', 'import apex'], check=True)"
    )
    proc = run_clean(["-c", code], tmp_path, AMP_SHIM_ALIAS="1")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "amp_shim"
    assert proc.stderr.splitlines() == [ANNOUNCEMENT]


@pytest.mark.slow
def test_without_the_variable_nothing_is_aliased(tmp_path):
    proc = run_clean(["-c", "import apex"], tmp_path)
    assert proc.returncode == 1 and "No module named 'apex'" in proc.stderr
    assert ANNOUNCEMENT not in proc.stderr


@pytest.mark.slow
def test_a_real_apex_wins_in_children_unless_forced(tmp_path):
    fake = tmp_path / "site" / "apex" / "amp"
    fake.mkdir(parents=True)
    (fake.parent / "__init__.py").write_text("REAL = True\n")
    (fake / "__init__.py").write_text("")
    code = "import apex; print(getattr(apex, 'REAL', False))"
    env = {"PYTHONPATH": str(tmp_path / "site")}
    assert run_clean(["-c", code], tmp_path, AMP_SHIM_ALIAS="1", **env).stdout.strip() == "True"
    assert run_clean(["-c", code], tmp_path, AMP_SHIM_ALIAS="force", **env).stdout.strip() == "False"
    launched = run_clean(["-m", "amp_shim", "--", sys.executable, "-c", code], tmp_path, **env)
    assert launched.stdout.strip() == "True"
    assert launched.stderr.strip() == launch.REAL_APEX_NOTICE
    forced = run_clean(["-m", "amp_shim", "--force", "--", sys.executable, "-c", code], tmp_path, **env)
    assert forced.stdout.strip() == "False" and forced.stderr.splitlines() == [ANNOUNCEMENT]


@pytest.mark.slow
def test_script_runs_as_if_run_directly_path_and_traceback(tmp_path):
    pkg_dir = tmp_path / "proj"
    pkg_dir.mkdir()
    write(pkg_dir / "helper.py", "VALUE = 42\n")
    script = write(
        pkg_dir / "train.py",
        """
        import sys, os
        import helper  # found through sys.path[0] == the script's directory
        assert sys.path[0] == os.path.dirname(os.path.realpath(__file__)), sys.path[:2]
        assert __name__ == "__main__" and sys.argv[1:] == ["--lr", "1"]

        def fail():
            raise ValueError("boom")

        fail()
    """,
    )
    proc = run_clean(["-m", "amp_shim", str(script), "--lr", "1"], tmp_path)
    assert proc.returncode == 1
    lines = proc.stderr.splitlines()
    assert lines[0] == ANNOUNCEMENT and lines[1] == "Traceback (most recent call last):"
    assert lines[2].startswith('  File "%s", line 10, in <module>' % script)
    assert "runpy" not in proc.stderr and "launch.py" not in proc.stderr
    assert lines[-1] == "ValueError: boom"


@pytest.mark.slow
def test_exit_codes_and_missing_scripts_behave_as_python_does(tmp_path):
    script = write(tmp_path / "exits.py", "import sys\nsys.exit(3)\n")
    assert run_clean(["-m", "amp_shim", str(script)], tmp_path).returncode == 3
    missing = run_clean(["-m", "amp_shim", str(tmp_path / "nope.py")], tmp_path)
    assert missing.returncode == 2 and "can't open file" in missing.stderr


@pytest.mark.slow
def test_module_mode_runs_a_module_as_main(tmp_path):
    write(
        tmp_path / "legacy_mod.py",
        """
        import sys
        from apex import amp
        print(__name__, sys.argv[0].endswith("legacy_mod.py"), sys.argv[1:], amp.__name__)
    """,
    )
    proc = run_clean(["-m", "amp_shim", "-m", "legacy_mod", "a", "b"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "__main__ True ['a', 'b'] amp_shim.amp"
    missing = run_clean(["-m", "amp_shim", "-m", "no_such_mod"], tmp_path)
    assert missing.returncode == 1 and "No module named no_such_mod" in missing.stderr


def test_run_command_exports_the_alias_to_any_command(tmp_path, monkeypatch, capfd):
    monkeypatch.setenv(alias.ANNOUNCED_VAR, "")  # restored after the test
    monkeypatch.delenv(alias.ENV_VAR, raising=False)
    code = "import apex, os, sys; print(apex.__name__, os.environ['AMP_SHIM_ALIAS']); sys.exit(5)"
    assert launch.run_command([sys.executable, "-c", code], force=False) == 5
    out, err = capfd.readouterr()
    assert out.strip() == "amp_shim 1" and err.splitlines() == [ANNOUNCEMENT]
    assert launch.run_command(["no-such-command-xyz"], force=True) == 127
