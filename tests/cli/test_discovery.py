"""Which files a run takes: folders recursively, `.py` and `.ipynb`, what git ignores left out
(unless `--no-gitignore`), `--exclude`/`--include`, virtualenvs and build output skipped, and
`[tool.amp-migrate]` settings from the nearest pyproject.toml."""

import json
import shutil
import subprocess

import pytest

from amp_migrate.cli.discover import Filters, Glob, discover

from .conftest import SHIM_INPUT, SHIM_OUTPUT, run_cli, write

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def paths_in(result):
    return [f["path"] for f in json.loads(result.stdout)["files"]]


def check(project, *args):
    return paths_in(run_cli(["--check", "--format", "json", "--target", "shim", *args], project))


@needs_git
@pytest.mark.slow
def test_gitignored_files_are_skipped_inside_a_git_work_tree(project):
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    write(project / ".gitignore", "generated/\n*_old.py\n")
    write(project / "sub" / ".gitignore", "local.py\n")
    for name in ("keep.py", "generated/gen.py", "train_old.py", "sub/local.py", "sub/keep.py"):
        write(project / name, SHIM_INPUT)
    assert check(project, ".") == ["keep.py", "sub/keep.py"]
    assert check(project, "sub") == ["sub/keep.py"]
    assert check(project, "--no-gitignore", ".") == [
        "generated/gen.py",
        "keep.py",
        "sub/keep.py",
        "sub/local.py",
        "train_old.py",
    ]
    # A file named on the command line is taken even though git ignores it.
    assert check(project, "train_old.py") == ["train_old.py"]


def test_gitignore_is_not_read_outside_a_git_work_tree(tmp_path):
    write(tmp_path / ".gitignore", "*.py\n")
    write(tmp_path / "a.py", SHIM_INPUT)
    assert Filters().gitignore and [c.path for c in discover([str(tmp_path)])] == [str(tmp_path / "a.py")]


def test_exclude_and_include_globs(project):
    for name in ("src/a.py", "src/vendored/b.py", "tests/test_a.py", "src/c_pb2.py", "nb/x.ipynb"):
        write(project / name, SHIM_INPUT if name.endswith(".py") else "{}")
    assert check(project, "--exclude", "vendored", "--exclude", "*_pb2.py", "src") == ["src/a.py"]
    assert check(project, "--exclude", "src/vendored", "src") == ["src/a.py", "src/c_pb2.py"]
    assert check(project, "--include", "tests/*", ".") == ["tests/test_a.py"]


def test_virtualenvs_site_packages_caches_and_build_output_are_skipped(project):
    write(project / "env" / "pyvenv.cfg", "home = /usr/bin\n")
    for name in (
        "env/lib/x.py",
        ".venv/y.py",
        "lib/site-packages/apex_user.py",
        "__pycache__/z.py",
        "build/lib/b.py",
        ".git/hooks/h.py",
        "pkg.egg-info/e.py",
        "real.py",
    ):
        write(project / name, SHIM_INPUT)
    assert check(project, "--no-gitignore", ".") == ["real.py"]
    # Named on the command line, a file is taken wherever it is, unless --force-exclude.
    assert check(project, "build/lib/b.py") == ["build/lib/b.py"]
    assert check(project, "--force-exclude", "build/lib/b.py") == []


def test_glob_matches_names_and_leading_paths():
    assert Glob("tests").matches("tests/unit/a.py")
    assert Glob("tests/unit").matches("tests/unit/a.py")
    assert not Glob("unit/a").matches("tests/unit/a.py")
    assert Glob("*_pb2.py").matches("x/y_pb2.py")


def test_pyproject_settings_apply_and_flags_override_them(project):
    write(
        project / "pyproject.toml",
        '[project]\nname = "x"\n\n[tool.amp-migrate]\ntarget = "shim"\nexclude = ["legacy"]\n',
    )
    write(project / "src" / "a.py", SHIM_INPUT)
    write(project / "src" / "legacy" / "b.py", SHIM_INPUT)
    result = run_cli(["--format", "json", "src"], project)
    document = json.loads(result.stdout)
    assert document["options"]["target"] == "shim"
    assert [f["path"] for f in document["files"]] == ["src/a.py"]
    assert (project / "src" / "a.py").read_text() == SHIM_OUTPUT
    assert (project / "src" / "legacy" / "b.py").read_text() == SHIM_INPUT
    flagged = json.loads(
        run_cli(
            ["--check", "--format", "json", "--target", "native", "b.py"], project / "src" / "legacy"
        ).stdout
    )
    assert flagged["options"]["target"] == "native"


def test_bad_configuration_is_a_usage_error(project):
    write(project / "pyproject.toml", '[tool.amp-migrate]\ntarget = "fast"\n')
    write(project / "a.py", SHIM_INPUT)
    result = run_cli(["a.py"], project)
    assert result.exit_code == 2 and "target must be one of" in result.output
    write(project / "pyproject.toml", '[tool.amp-migrate]\ntargte = "shim"\n')
    result = run_cli(["a.py"], project)
    assert result.exit_code == 2 and "unknown key(s) targte" in result.output
    assert (project / "a.py").read_text() == SHIM_INPUT
