"""How the compute-bound Triton starters choose their launch: tile sizes fitted to the GPU's
multiprocessors and dtype, the TMA-descriptor variant only where descriptors are valid, and the
default configurations compiled for sm_90 and sm_80 without spills."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from starter_kernels.triton import fused_mlp, matmul
from paths import ROOT



def test_matmul_tiles_halve_n_first_until_every_multiprocessor_has_one():
    assert matmul._tiles(4096, 4096, 4096, 2, 132) == (128, 256, 64)  # 512 tiles: the CONFIG's
    # M = 512 at a 4096-wide projection: 64 tiles of 128 x 256, then 128 of 128 x 128, then 256
    assert matmul._tiles(512, 4096, 4096, 2, 132) == (128, 64, 64)
    assert matmul._tiles(1, 4096, 4096, 2, 132) == (16, 64, 64)  # decode: never below 64 wide
    # fp32 operands: half the N and K tiles (CUDA-core operands take twice the registers)
    assert matmul._tiles(4096, 4096, 4096, 4, 132) == (128, 128, 32)


def test_matmul_takes_descriptors_only_for_aligned_contiguous_16_bit_tensors():
    a = torch.empty(64, 128, dtype=torch.float16)
    assert matmul._tma_ok(a)
    assert not matmul._tma_ok(a.float())  # fp32: no tensor cores to feed
    assert not matmul._tma_ok(a.T)  # last dim not contiguous
    assert not matmul._tma_ok(torch.empty(64, 65, dtype=torch.float16))  # rows 130 B apart
    assert not matmul._tma_ok(a.view(-1)[1:].view(-1)[:64 * 127].view(64, 127))  # base off by 2 B


def test_fused_mlp_launch_fits_small_dims_and_uses_the_doubled_tile_for_the_down_projection():
    grid, meta = fused_mlp._launch(4096, 4096, 11008, 2 * fused_mlp.CONFIG["BLOCK_N"], 2, 132)
    assert (meta["BLOCK_M"], meta["BLOCK_N"], meta["BLOCK_K"]) == (128, 256, 64) and grid == (132,)
    grid, meta = fused_mlp._launch(7, 40, 72, fused_mlp.CONFIG["BLOCK_N"], 4, 4)
    assert (meta["BLOCK_M"], meta["BLOCK_N"], meta["BLOCK_K"]) == (16, 64, 32) and grid == (1,)


def _resources_script():
    spec = importlib.util.spec_from_file_location("starter_resources", ROOT / "benchmarks/starter_resources.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.parametrize("kernel_type", ["matmul", "fused_mlp", "flash_attention"])
def test_default_configs_compile_for_sm_90_and_sm_80_without_spills(kernel_type):
    # forward and backward
    rows = _resources_script().resource_rows(kernel_type, ["sm_90", "sm_80"], sample=0, dtype="bfloat16")
    assert [(r["arch"], r["pass"]) for r in rows] == [("sm_90", "forward"), ("sm_90", "backward"),
                                                      ("sm_80", "forward"), ("sm_80", "backward")]
    for row in rows:
        assert row["ok"] and not row["problem"] and row["spills"] == 0, row
        assert 0 < row["shared_bytes"] <= 227 * 1024 and row["registers"] <= 255, row


@pytest.mark.slow
@pytest.mark.parametrize("kernel_type", ["add_rmsnorm", "silu_mul", "rotary_qk", "linear_cross_entropy"])
def test_chain_starters_compile_for_sm_90_and_sm_80_without_spills(kernel_type):
    # forward and backward, in the dtype a GPU serves them in
    rows = _resources_script().resource_rows(kernel_type, ["sm_90", "sm_80"], sample=0, dtype="bfloat16")
    assert [(r["arch"], r["pass"]) for r in rows] == [("sm_90", "forward"), ("sm_90", "backward"),
                                                      ("sm_80", "forward"), ("sm_80", "backward")]
    for row in rows:
        assert row["ok"] and not row["problem"] and row["spills"] == 0, row
        assert row["shared_bytes"] <= 227 * 1024 and row["registers"] <= 255, row
