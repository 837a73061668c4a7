"""The one distribution (`amp_migrate` and `amp_shim` in one wheel): what the wheel ships, how
the CUDA sources are found, and that the runtime shim pulls in torch and nothing of the
codemod's dependencies."""

from __future__ import annotations

import configparser
import importlib.resources
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SOURCE_ROOTS = {"amp_migrate": REPO / "amp_migrate", "amp_shim": REPO / "shim" / "amp_shim"}
NOT_SHIPPED = ("tests", "fixtures", "bench", "docs", ".ci")
COPY_IGNORE = shutil.ignore_patterns(
    ".git", ".venv*", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache", ".hypothesis"
)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    """Build the wheel as a user would (`python -m build --wheel`, isolated build env) from a
    copy of the tree, so the build writes nothing into the checkout."""
    work = tmp_path_factory.mktemp("wheel")
    src = work / "src"
    shutil.copytree(REPO, src, ignore=COPY_IGNORE)
    out = work / "dist"
    proc = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(out), str(src)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, "wheel build failed:\n" + proc.stdout[-4000:] + proc.stderr[-4000:]
    (path,) = out.glob("amp_migrate-*.whl")
    with zipfile.ZipFile(path) as zf:
        yield zf


def _names(wheel: zipfile.ZipFile) -> set[str]:
    return set(wheel.namelist())


@pytest.mark.slow
def test_wheel_ships_the_cuda_sources_as_amp_shim_kernels_package_data(wheel):
    names = _names(wheel)
    for source in ("__init__.py", "unscale.cu", "amp_math.cuh"):
        assert "amp_shim/kernels/" + source in names
    # Every CUDA source in kernels/ ships, not only the ones named above.
    for source in sorted((REPO / "kernels").glob("*.cu*")):
        assert "amp_shim/kernels/" + source.name in names


@pytest.mark.slow
def test_wheel_ships_every_module_of_both_import_packages(wheel):
    """Catches a subpackage added to the tree but not to pyproject's explicit package list."""
    names = _names(wheel)
    assert {
        "amp_shim/__init__.py",
        "amp_shim/checkpoint_format.py",
        "amp_migrate/__init__.py",
        "amp_migrate/cli/main.py",
    } <= names
    missing = sorted(
        f"{package}/{path.relative_to(root).as_posix()}"
        for package, root in SOURCE_ROOTS.items()
        for path in root.rglob("*.py")
        if "__pycache__" not in path.parts and f"{package}/{path.relative_to(root).as_posix()}" not in names
    )
    assert not missing, "modules missing from the wheel (add their package to pyproject.toml): %s" % missing


@pytest.mark.slow
def test_wheel_declares_the_amp_migrate_console_script(wheel):
    (entry_points,) = [n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt")]
    parser = configparser.ConfigParser()
    parser.read_string(wheel.read(entry_points).decode())
    assert parser["console_scripts"]["amp-migrate"].strip() == "amp_migrate.cli.main:main"


@pytest.mark.slow
def test_wheel_leaves_out_tests_fixtures_and_repo_tooling(wheel):
    shipped = [name for name in wheel.namelist() if any(part in NOT_SHIPPED for part in name.split("/")[:-1])]
    assert not shipped, shipped
    top_level = {name.split("/")[0] for name in wheel.namelist()}
    # amp_shim_alias.pth: the start-up hook that carries the apex alias into child processes.
    assert top_level == {"amp_shim", "amp_migrate", "amp_shim_alias.pth"} | {
        n for n in top_level if n.endswith(".dist-info")
    }


@pytest.mark.slow
def test_wheel_ships_the_alias_start_up_hook_at_its_root(wheel):
    """A .pth runs only from site-packages itself; it acts only when AMP_SHIM_ALIAS is set."""
    from amp_shim._pth_build import PTH_CONTENT

    assert wheel.read("amp_shim_alias.pth").decode() == PTH_CONTENT
    (record,) = [n for n in wheel.namelist() if n.endswith(".dist-info/RECORD")]
    assert any(
        line.startswith("amp_shim_alias.pth,sha256=") for line in wheel.read(record).decode().splitlines()
    )


def test_installed_package_finds_the_cuda_sources_through_importlib_resources():
    import amp_shim.kernels as kernels

    resource = importlib.resources.files("amp_shim.kernels").joinpath("unscale.cu")
    assert resource.is_file()
    expected = (REPO / "kernels" / "unscale.cu").read_text(encoding="utf-8")
    assert resource.read_text(encoding="utf-8") == expected
    assert kernels.read_source("unscale.cu") == expected
    assert kernels.source_dir().joinpath("amp_math.cuh").is_file()
    assert '#include "amp_math.cuh"' in expected


def test_read_source_names_the_available_sources_when_one_is_missing():
    import amp_shim.kernels as kernels

    with pytest.raises(FileNotFoundError, match=r"'nope\.cu'.*available: .*unscale\.cu"):
        kernels.read_source("nope.cu")


@pytest.mark.slow
def test_importing_the_shim_loads_none_of_the_codemod_or_its_dependencies(tmp_path):
    """A training job that uses the shim pulls in torch and nothing else."""
    probe = """
import importlib, json, pkgutil, sys
import amp_shim
importlib.import_module("amp_shim.kernels")  # mapped from kernels/, not under amp_shim.__path__ in an editable install
for info in pkgutil.walk_packages(amp_shim.__path__, "amp_shim."):
    if info.name.rsplit(".", 1)[-1] != "__main__":
        importlib.import_module(info.name)
forbidden = {"amp_migrate", "libcst", "click", "rich", "nbformat"}
print(json.dumps({
    "shim_modules": sorted(m for m in sys.modules if m.startswith("amp_shim")),
    "forbidden": sorted(m for m in sys.modules if m.split(".")[0] in forbidden),
}))
"""
    proc = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert {"amp_shim.amp", "amp_shim.checkpoint_format", "amp_shim.kernels"} <= set(report["shim_modules"])
    assert report["forbidden"] == []
