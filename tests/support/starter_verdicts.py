"""What every starter's verdict must say (tests/harness/test_starters_triton.py, test_starters_chains.py)."""
from __future__ import annotations


def stage_report(verdict: dict) -> str:
    return "\n".join(f"{s['name']}: {s['status']}: {s['detail']}" for s in verdict["stages"])


def assert_starter_passes(verdict: dict, kernel_type: str) -> None:
    """Forward and backward PASS, every forward stage run, timed, served for training."""
    assert verdict["verdict"] == "PASS", stage_report(verdict)
    assert verdict["kernel_type"] == kernel_type and verdict["failed_stage"] is None
    assert [s["name"] for s in verdict["stages"]] == ["compile", "smoke", "shape_sweep", "stability",
                                                      "determinism", "edge_cases", "integrity"]
    assert verdict["timing"]["median_us"] > 0
    back = verdict["backward"]
    assert back["verdict"] == "PASS", stage_report(back)
    assert verdict["serves"] == "training and inference"
