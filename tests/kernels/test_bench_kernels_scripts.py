"""bench/kernels_bytes.py's accounting (exact parameter counts, bytes per scenario, the table in
docs/results/cuda-kernels.md is its current output) and bench/kernels_gpu.py's argument
parsing; on a machine without a GPU kernels_gpu.py measures nothing and says so."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _load(name: str):
    import sys

    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, BENCH / (name + ".py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    sys.path.insert(0, str(BENCH))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCH))
    return module


kb = _load("kernels_bytes")
kg = _load("kernels_gpu")


def test_parameter_sets_have_the_real_models_sizes():
    assert sum(kb._numel(s) for s in kb.resnet50_shapes()) == 25_557_032
    assert len(kb.resnet50_shapes()) == 161
    assert sum(kb._numel(s) for s in kb.bert_large_shapes()) == 335_141_888


def test_bytes_per_element_follow_the_ops():
    by_name = {sc.name: sc for sc in kb.SCENARIOS}
    clip = by_name["fp32 grads: unscale, then clip_grad_norm_"]
    assert kb.bytes_for(clip.torch_path, 1) == 20 and kb.bytes_for(clip.kernels, 1) == 12  # 5 sweeps -> 3
    o2 = by_name["O2: fp16 grads -> new fp32 master grads, then masters -> fp16 params"]
    assert kb.bytes_for(o2.torch_path, 1) == 20 and kb.bytes_for(o2.kernels, 1) == 12
    for row in kb.rows():
        assert row["kernel_bytes"] <= row["torch_bytes"]
        assert row["torch_us"] == pytest.approx(row["torch_bytes"] / 3.35e12 * 1e6)


def test_kernels_page_shows_the_current_generated_table():
    text = kb.PAGE.read_text(encoding="utf-8")
    block = re.search(re.escape(kb.BEGIN) + r"\n(.*?)\n" + re.escape(kb.END), text, re.S)
    assert block, "docs/results/cuda-kernels.md lacks the generated kernels-bytes block"
    assert block.group(1) == kb.markdown(), "run: python bench/kernels_bytes.py --write"


def test_write_page_replaces_only_the_generated_block(tmp_path):
    page = tmp_path / "cuda-kernels.md"
    page.write_text("# x\n\nbefore\n%s\nold\n%s\nafter\n" % (kb.BEGIN, kb.END))
    kb.write_page("NEW TABLE", page)
    assert page.read_text() == "# x\n\nbefore\n%s\nNEW TABLE\n%s\nafter\n" % (kb.BEGIN, kb.END)


def test_gpu_benchmark_parses_its_arguments():
    args = kg.parse_args([])
    assert args.models == ["resnet50", "bert-large"] and args.ops == list(kg.OPS)
    assert (args.iters, args.warmup, args.device, args.grad_dtype) == (50, 10, "cuda:0", "float32")
    args = kg.parse_args(
        [
            "--model",
            "bert-large",
            "--ops",
            "clip, update",
            "--iters",
            "3",
            "--warmup",
            "0",
            "--grad-dtype",
            "bfloat16",
            "--device",
            "cuda:1",
        ]
    )
    assert args.models == ["bert-large"] and args.ops == ["clip", "update"]
    assert (args.iters, args.warmup, args.grad_dtype, args.device) == (3, 0, "bfloat16", "cuda:1")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--ops", "unscale,bogus"], "unknown op(s): bogus"),
        (["--iters", "0"], "--iters must be >= 1"),
        (["--model", "gpt"], "invalid choice"),
    ],
)
def test_gpu_benchmark_rejects_bad_arguments(capsys, argv, message):
    with pytest.raises(SystemExit) as info:
        kg.parse_args(argv)
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_gpu_benchmark_measures_nothing_without_a_gpu(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present; this checks the CPU-only refusal")
    assert kg.main(["--iters", "1"]) == 2
    assert "nothing measured" in capsys.readouterr().err
