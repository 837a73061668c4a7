"""Under the `apex` alias, `import amp_C` / `import apex_C` resolve to the shim's modules: code
that sees `multi_tensor_applier.available` and then imports `amp_C` (as Apex's own LAMB test's
reference optimizer does) runs. A compiled `amp_C` that is importable is not shadowed, unless
the alias is forced."""

import os
import subprocess
import sys
import textwrap

import pytest

PROBE = textwrap.dedent("""
    import torch
    from apex.multi_tensor_apply import multi_tensor_applier
    assert multi_tensor_applier.available
    import amp_C, apex_C
    from amp_C import multi_tensor_l2norm
    flag = torch.zeros(1, dtype=torch.int)
    src, dst = [torch.tensor([1.0, float('inf')])], [torch.empty(2, dtype=torch.float16)]
    multi_tensor_applier(amp_C.multi_tensor_scale, flag, [src, dst], 0.5)
    total, _ = multi_tensor_applier(multi_tensor_l2norm, torch.zeros(1, dtype=torch.int),
                                    [[torch.tensor([3.0, 4.0])]])
    print(amp_C.__name__, apex_C.__name__, dst[0][0].item(), flag.item(), total.tolist())
""")


def run(code, cwd, **env_extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("AMP_SHIM_ALIAS")}
    env.update(OMP_NUM_THREADS="1", **env_extra)
    return subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


@pytest.mark.slow
def test_amp_c_imports_and_runs_through_the_applier_under_the_alias(tmp_path):
    proc = run(PROBE, tmp_path, AMP_SHIM_ALIAS="1")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["amp_shim.amp_C", "amp_shim.apex_C", "0.5", "1", "[5.0]"]


@pytest.mark.slow
def test_without_the_alias_amp_c_is_not_importable(tmp_path):
    proc = run("import amp_C", tmp_path)
    assert proc.returncode != 0 and "No module named 'amp_C'" in proc.stderr


@pytest.mark.slow
def test_a_compiled_amp_c_wins_unless_the_alias_is_forced(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "amp_C.py").write_text("REAL = True\n")
    code = "import amp_C; print(getattr(amp_C, 'REAL', False), amp_C.__name__)"
    auto = run(code, tmp_path, AMP_SHIM_ALIAS="1", PYTHONPATH=str(site))
    assert auto.stdout.split() == ["True", "amp_C"], auto.stderr
    forced = run(code, tmp_path, AMP_SHIM_ALIAS="force", PYTHONPATH=str(site))
    assert forced.stdout.split() == ["False", "amp_shim.amp_C"], forced.stderr


def test_uninstalling_the_alias_forgets_the_extension_modules():
    from amp_shim import alias

    assert alias.install(force=True)
    try:
        import amp_C  # noqa: F401

        assert sys.modules["amp_C"].__name__ == "amp_shim.amp_C"
    finally:
        alias.uninstall()
    assert "amp_C" not in sys.modules
