"""Device peaks: measured by probes, cached per device and torch version, importable by the judge."""
import json
import os
import subprocess
import sys

import pytest

from harness.device import peaks
from paths import ROOT


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOKERNEL_CACHE_DIR", str(tmp_path))
    # short probes: what is tested here is the measuring and caching, not the figures' precision
    monkeypatch.setattr(peaks, "CPU_BUDGET_S", {"copy": 0.02, "matmul": 0.02})
    return tmp_path


def test_cpu_peaks_are_measured_and_cached(cache):
    result = peaks.measured_peaks("cpu")
    assert result["device"] == peaks.device_name("cpu")
    assert result["copy_gbps"] > 0.01
    assert result["matmul_tflops"]["float32"] > 1e-5
    assert set(result["matmul_tflops"]) <= {"float32", "float16", "bfloat16"}
    assert "copy" in result["method"] and result["measured_at"]
    path = peaks.cache_path("cpu")
    assert path.parent.parent == cache and json.loads(path.read_text()) == result
    # the second call reads the cache: same measurement, same timestamp
    assert peaks.measured_peaks("cpu") == result


def test_refresh_measures_again(cache, monkeypatch):
    first = peaks.measured_peaks("cpu")
    monkeypatch.setattr(peaks, "probe", lambda device: {**first, "copy_gbps": 123.0, "measured_at": "later"})
    assert peaks.measured_peaks("cpu")["copy_gbps"] == first["copy_gbps"]
    assert peaks.measured_peaks("cpu", refresh=True)["copy_gbps"] == 123.0
    assert json.loads(peaks.cache_path("cpu").read_text())["measured_at"] == "later"


def test_a_torn_cache_file_is_measured_again(cache):
    path = peaks.cache_path("cpu")
    path.parent.mkdir(parents=True)
    path.write_text('{"copy_gbps": ')
    assert peaks.measured_peaks("cpu")["copy_gbps"] > 0


def test_cache_key_names_device_and_torch_version(cache):
    import torch

    name = peaks.cache_path("cpu").name
    assert torch.__version__.split("+")[0] in name and name.endswith(".json")
    assert str(torch.get_num_threads()) in name  # peaks differ with the threads we may use


def test_importing_peaks_touches_nothing_and_needs_no_autokernel(tmp_path):
    code = ("import sys, harness.device.peaks; "
            "assert not [m for m in sys.modules if m.startswith('autokernel')], 'harness imported autokernel'")
    env = {**os.environ, "AUTOKERNEL_CACHE_DIR": str(tmp_path / "cache")}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=str(ROOT))
    assert not (tmp_path / "cache").exists()  # no probe, no folder at import


# ---------------------------------------------------------------- peaks that stay true
BUSY = {"device": "fake cpu", "device_type": "cpu", "copy_gbps": 5.0, "measured_at": "busy",
        "torch": "x", "method": "m", "matmul_tflops": {"float32": 0.01, "bfloat16": 0.002}}


def _cached(cache) -> dict:
    path = peaks.cache_path("cpu")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(BUSY))
    return path


def test_an_op_faster_than_a_cached_peak_probes_again_and_keeps_the_higher_figures(cache, monkeypatch):
    path = _cached(cache)
    quiet = {**BUSY, "copy_gbps": 20.0, "measured_at": "quiet", "matmul_tflops": {"float32": 0.05, "bfloat16": 0.01}}
    monkeypatch.setattr(peaks, "probe", lambda device: quiet)
    # bf16 ran at 0.03 TFLOP/s: above the busy cache (0.002) and the new probe (0.01)
    result = peaks.measured_peaks("cpu", at_least={"bfloat16": 0.03, "float32": 0.001})
    assert result["matmul_tflops"] == {"float32": 0.05, "bfloat16": 0.03}
    assert result["copy_gbps"] == 20.0 and result["measured_at"] == "quiet"
    assert result["raised"] == {"bfloat16": {"cached": 0.002, "probed": 0.01, "seen": 0.03}}
    assert json.loads(path.read_text()) == result  # later plans start from the higher figures


def test_a_probe_that_reads_lower_than_the_cache_lowers_nothing(cache, monkeypatch):
    _cached(cache)
    busier = {**BUSY, "copy_gbps": 1.0, "matmul_tflops": {"float32": 0.001, "bfloat16": 0.001}}
    monkeypatch.setattr(peaks, "probe", lambda device: busier)
    result = peaks.measured_peaks("cpu", at_least={"float32": 0.02})
    assert result["matmul_tflops"] == {"float32": 0.02, "bfloat16": 0.002} and result["copy_gbps"] == 5.0


def test_peaks_no_op_beats_are_read_from_the_cache_without_probing(cache, monkeypatch):
    path = _cached(cache)

    def no_probe(device):
        raise AssertionError("probed although no op beat the cached peaks")
    monkeypatch.setattr(peaks, "probe", no_probe)
    seen = {"float32": 0.009, "bfloat16": 0.002, "float16": 99.0}  # fp16 has no cached roof to beat
    assert peaks.measured_peaks("cpu", at_least=seen) == BUSY
    assert json.loads(path.read_text()) == BUSY
