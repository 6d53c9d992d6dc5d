"""The backward judged at the shapes around a target: a backward right at the target and wrong at
one shape around it passes, its verdict saying where it was right, and the training serving range
read from that verdict leaves the wrong shape (and everything between the proven ones) to PyTorch,
while the forward, right everywhere, serves the whole span."""
from __future__ import annotations

import pytest

from autokernel.deploy.routing.serving import ServingRange
from autokernel.deploy.winners import serving_range, training_serving_range
from harness.kernel_types.registry import Case
from paths import DATA

HONEST = (DATA / "kernels" / "backward" / "rmsnorm.py").read_text()
TARGET = Case.make("rmsnorm", {"M": 12, "N": 32}, "float32", seed=5)
# the doubled shape around the target (24 rows of 32): its rows' dx left unwritten
WRONG_THERE = HONEST.replace(
    "    dx = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)\n",
    "    dx = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)\n"
    "    if tuple(x2.shape) == (24, 32):\n"
    "        n_rows = 1\n", 1)


@pytest.fixture(scope="module")
def verdict(tmp_path_factory):
    from harness.judge import judge
    path = tmp_path_factory.mktemp("around") / "rmsnorm.py"
    path.write_text(WRONG_THERE)
    return judge(path, target=TARGET, device="cpu", backward=True, time_around=True)


def test_the_backward_is_judged_at_each_shape_around_the_target_and_wrong_at_one(verdict):
    back = verdict["backward"]
    assert (verdict["verdict"], back["verdict"]) == ("PASS", "PASS"), back["failed_stage"]
    rows = {r["dims"]["M"]: r for r in back["around"]["shapes"]}
    assert set(rows) == {9, 24, 1}
    assert rows[24]["failed"] and "gradient of x" in rows[24]["detail"]
    assert rows[9]["ok"] and rows[1]["ok"]


def test_training_calls_are_served_only_where_the_backward_was_right(verdict):
    class Target:
        kernel_type, dims, dtype, kwargs = "rmsnorm", TARGET.dims, "float32", {}
    forward = ServingRange.from_json(serving_range(Target, verdict))
    training = ServingRange.from_json(training_serving_range(Target, verdict))
    assert forward.refusal({"M": 24, "N": 32}) is None and forward.refusal({"M": 20, "N": 32}) is None
    assert training.refusal({"M": 24, "N": 32})[0] == "wrong"
    assert training.refusal({"M": 20, "N": 32})[0] == "unproven"
    assert training.refusal({"M": 12, "N": 32}) is None and training.refusal({"M": 9, "N": 32}) is None
