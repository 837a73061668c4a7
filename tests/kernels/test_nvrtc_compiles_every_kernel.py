"""Every kernel source compiles for the GPU, without a GPU: with NVRTC through
`cupy.cuda.nvrtc` (pip `cupy-cuda12x`, `nvidia-cuda-nvrtc-cu12`; headers from
`nvidia-cuda-runtime-cu12`) to cubin for sm_80 and sm_90 and to PTX for compute_80, from exactly
the text and options that engine/cuda.py hands CuPy's RawModule; every kernel is an entry of
its module (each kernel holds all its fp32/fp16/bf16 instantiations, selected per tensor at run
time); no FMA is emitted; a compile error fails with NVRTC's log. Also with nvcc when it is on
PATH. Skipped, with the reason, only when those packages or nvcc are missing."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

import amp_shim.kernels as kernels
from amp_shim.engine import cuda

pytest.importorskip("cupy", reason="cupy-cuda12x is not installed (pip install -e '.[test]')")
from cupy.cuda import nvrtc  # noqa: E402

TARGETS = [("sm_80", "cubin"), ("sm_90", "cubin"), ("compute_80", "ptx")]


class CompileError(AssertionError):
    pass


def nvrtc_compile(source: str, name: str, arch: str, options=None) -> bytes:
    try:
        program = nvrtc.createProgram(source, name, [], [])
    except Exception as exc:  # NVRTC library missing
        pytest.skip("NVRTC is not loadable (%s); install nvidia-cuda-nvrtc-cu12" % exc)
    opts = list(options if options is not None else cuda.compile_options()) + ["--gpu-architecture=" + arch]
    try:
        nvrtc.compileProgram(program, opts)
    except nvrtc.NVRTCError as exc:
        raise CompileError(
            "NVRTC failed on %s for %s (%s):\n%s" % (name, arch, exc, nvrtc.getProgramLog(program))
        ) from exc
    return nvrtc.getCUBIN(program) if arch.startswith("sm_") else nvrtc.getPTX(program)


@pytest.fixture(scope="module")
def headers():
    if not cuda.cuda_include_dirs():
        pytest.skip("nvidia-cuda-runtime-cu12 (cuda_fp16.h, cuda_bf16.h) is not installed")


@pytest.mark.parametrize("source", sorted(kernels.KERNEL_SOURCES))
@pytest.mark.parametrize("arch, kind", TARGETS, ids=[t[0] for t in TARGETS])
def test_source_compiles_with_nvrtc(headers, source, arch, kind):
    out = nvrtc_compile(kernels.assemble_source(source), source, arch)
    assert len(out) > 0
    if kind == "cubin":
        assert out[:4] == b"\x7fELF"
        for name in kernels.KERNEL_SOURCES[source]:
            assert name.encode() in out, name
    else:
        ptx = out.decode() if isinstance(out, bytes) else out
        entries = set(re.findall(r"\.entry\s+(\w+)\(", ptx))
        assert entries == set(kernels.KERNEL_SOURCES[source])
        # No fused multiply-add anywhere: the kernels round each multiply and add once.
        assert not re.search(r"\bfma\.", ptx), "FMA in %s" % source


def test_every_kernel_is_in_the_emulation_and_launchable_by_name(emu):
    declared = {k for names in kernels.KERNEL_SOURCES.values() for k in names}
    assert set(emu.kernel_names()) == declared
    for source, names in kernels.KERNEL_SOURCES.items():
        text = kernels.read_source(source)
        assert set(re.findall(r'extern "C" __global__ void (\w+)\(', text)) == set(names)


def test_a_compile_error_fails_with_nvrtcs_log(headers):
    broken = kernels.assemble_source("unscale.cu").replace(
        "const float inv = *inv_scale;", "const float inv = *inv_scal;", 1
    )
    with pytest.raises(CompileError) as info:
        nvrtc_compile(broken, "unscale.cu", "sm_80")
    assert 'identifier "inv_scal" is undefined' in str(info.value)
    assert "unscale.cu(" in str(info.value)  # the #line directives keep file names and lines


def test_assembled_source_names_original_files_and_lines():
    text = kernels.assemble_source("norm.cu")
    assert '#line 1 "amp_math.cuh"' in text and '#line 1 "multi_tensor.cuh"' in text
    assert text.count('#line 1 "amp_math.cuh"') == 1  # each header once
    assert "#pragma once" not in text


NVCC = shutil.which("nvcc")


@pytest.mark.slow
@pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH (the NVRTC tests above are the portable check)")
@pytest.mark.parametrize("source", sorted(kernels.KERNEL_SOURCES))
def test_source_compiles_with_nvcc(tmp_path, source):
    out = tmp_path / (source + ".fatbin")
    cmd = [
        NVCC,
        "-std=c++17",
        "--fmad=false",
        "-fatbin",
        "-I",
        str(Path(kernels.__file__).parent),
        "-gencode",
        "arch=compute_80,code=sm_80",
        "-gencode",
        "arch=compute_90,code=sm_90",
        "-gencode",
        "arch=compute_80,code=compute_80",
        str(Path(kernels.__file__).parent / source),
        "-o",
        str(out),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, "nvcc failed on %s:\n%s%s" % (source, proc.stdout, proc.stderr)
    assert out.stat().st_size > 0


FORBIDDEN = {
    r"__shfl": "warp shuffles",
    r"__ballot|__any_sync|__all_sync|__activemask": "warp votes",
    r"\bhalf2\b|__half2\b|\bfloat[234]\b|\bint[234]\b": "vector types",
    r"cooperative_groups": "cooperative groups",
    r"extern\s+__shared__": "dynamic shared memory",
    r"__expf|__logf|__sinf|__cosf|__fdividef|__powf|__frsqrt_rn|rsqrtf": "fast-math intrinsics",
    r"threadIdx\.[yz]|blockIdx\.[yz]|blockDim\.[yz]|gridDim\.[yz]": "2D/3D launches",
}


def test_kernels_use_nothing_the_host_emulation_does_not_model():
    """kernels/emulate/cuda_emulate.h models one-dimensional launches, __syncthreads, static
    __shared__, atomics and scalar half/bf16; the emulated proof only holds for kernels that
    stay within that."""
    for path in sorted(Path(kernels.__file__).parent.glob("*.cu*")):
        code = re.sub(r"//[^\n]*", "", path.read_text(encoding="utf-8"))  # comments may name them
        for pattern, what in FORBIDDEN.items():
            assert not re.search(pattern, code), "%s uses %s, which the emulation does not model" % (
                path.name,
                what,
            )
