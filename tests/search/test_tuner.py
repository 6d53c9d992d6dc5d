"""The offline tuner on its own: the loop's end-to-end tuner run is in test_loop.py."""
import pytest

from autokernel.errors import Plateau, UserError
from autokernel.search.kernel_source import check_constraints, read_literals
from autokernel.search.proposer import Candidate, Proposer
from autokernel.search.tuner import Tuner
from starter_kernels import starter_path

STARTER = '''"""toy"""
KERNEL_TYPE = "reduce"
BACKEND = "triton"
TUNABLES = {"BLOCK": [16, 32, 64, 128], "num_warps": [1, 2, 4, 8]}
CONSTRAINTS = ["BLOCK >= 8 * num_warps"]
CONFIG = {"BLOCK": 64, "num_warps": 4, "untuned": "kept"}

def kernel_fn(x):
    return dict(CONFIG)
'''
VALID = {(b, w) for b in (16, 32, 64, 128) for w in (1, 2, 4, 8) if b >= 8 * w}


def cost_us(config):
    """A made-up timing landscape with its optimum at BLOCK=128, num_warps=2."""
    return 10.0 + abs(config["BLOCK"] - 128) / 8 + abs(config["num_warps"] - 2) * 3


def passed(config):
    return {"verdict": "PASS", "timing": {"median_us": cost_us(config)}}


def run_out(tuner, verdict_of=passed, limit=100):
    seen = []
    with pytest.raises(Plateau) as stop:
        for _ in range(limit):
            candidate = tuner.propose(None)
            seen.append(candidate)
            tuner.observe(candidate, verdict_of(candidate.config))
    return seen, str(stop.value)


def test_every_valid_configuration_once_then_plateau():
    tuner = Tuner(STARTER, seed=3)
    assert isinstance(tuner, Proposer) and tuner.name == "tune"
    seen, why = run_out(tuner)
    configs = [(c.config["BLOCK"], c.config["num_warps"]) for c in seen]
    assert len(configs) == len(set(configs)) == len(VALID)
    assert set(configs) == VALID
    assert f"all {len(VALID)} valid configurations" in why


def test_candidate_is_the_starter_with_only_config_rewritten():
    candidate = Tuner(STARTER, seed=0).propose(None)
    literals = read_literals(candidate.source)
    assert literals["CONFIG"] == candidate.config and candidate.config["untuned"] == "kept"
    assert candidate.source.replace(f"CONFIG = {candidate.source.split('CONFIG = ')[1].splitlines()[0]}", "") == \
        STARTER.replace('CONFIG = {"BLOCK": 64, "num_warps": 4, "untuned": "kept"}', "")
    assert candidate.description.startswith("tune BLOCK=")
    assert candidate.prompt is None and candidate.prompt_tokens is None


def test_same_seed_same_sequence():
    def sequence(seed):
        tuner, out = Tuner(STARTER, seed=seed), []
        for _ in range(6):
            c = tuner.propose(None)
            tuner.observe(c, passed(c.config))
            out.append((c.config["BLOCK"], c.config["num_warps"]))
        return out
    assert sequence(7) == sequence(7)
    assert sequence(7) != sequence(8)


def test_baseline_and_resumed_history_are_not_proposed_again():
    tuner = Tuner(STARTER, seed=0)
    # the loop judges the starter itself as experiment 0 and reports it like any candidate
    tuner.observe(Candidate(STARTER, "starter"), passed({"BLOCK": 64, "num_warps": 4}))
    # a resumed run replays what it already tried, failures included
    tuner.record({"BLOCK": 128, "num_warps": 2, "untuned": "kept"}, 11.0)
    tuner.record({"BLOCK": 32, "num_warps": 1, "untuned": "kept"}, None)
    seen, _ = run_out(tuner)
    configs = {(c.config["BLOCK"], c.config["num_warps"]) for c in seen}
    assert configs == VALID - {(64, 4), (128, 2), (32, 1)}


def test_failed_verdicts_are_remembered_and_not_retried():
    def fails_big_blocks(config):
        if config["BLOCK"] == 128:
            return {"verdict": "FAIL", "failed_stage": "compile", "timing": None}
        return passed(config)
    seen, _ = run_out(Tuner(STARTER, seed=5), fails_big_blocks)
    assert len(seen) == len(VALID)


def test_bounded_asks_fall_back_to_an_untried_configuration():
    tuner = Tuner(STARTER, seed=0, max_asks=1)
    seen, _ = run_out(tuner)
    assert len({(c.config["BLOCK"], c.config["num_warps"]) for c in seen}) == len(VALID)


def test_constraints_may_name_the_targets_dims():
    source = STARTER.replace('["BLOCK >= 8 * num_warps"]', '["BLOCK <= N", "BLOCK >= 8 * num_warps"]')
    seen, _ = run_out(Tuner(source, seed=0, dims={"M": 4, "N": 32}))
    assert {c.config["BLOCK"] for c in seen} <= {16, 32}
    with pytest.raises(Plateau, match="no configuration"):
        Tuner(source, dims={"N": 8}).propose(None)


def test_starter_without_tunables_plateaus_and_bad_declarations_are_user_errors():
    with pytest.raises(Plateau, match="no TUNABLES"):
        Tuner('KERNEL_TYPE = "reduce"\nCONFIG = {}\n').propose(None)
    with pytest.raises(UserError, match="CONSTRAINTS"):
        Tuner(STARTER.replace("8 * num_warps", "8 * warps"))
    with pytest.raises(UserError, match="no values"):
        Tuner(STARTER.replace("[1, 2, 4, 8]", "[]"))


def test_real_starter_space():
    source = starter_path("softmax").read_text()
    literals = read_literals(source)
    tuner = Tuner(source, seed=0, dims={"M": 64, "N": 1024}, training=True)
    candidate = tuner.propose(None)
    assert check_constraints(literals["CONSTRAINTS"], candidate.config)
    assert set(candidate.config) == set(literals["TUNABLES"])
    assert tuner.space_size == 7 * 5 * 3 * 7 * 5  # the forward's BLOCK_N, warps, stages; the backward's BLOCK_N, warps
    assert Tuner(source, seed=0, dims={"M": 64, "N": 1024}).space_size == 7 * 5 * 3  # inference: the forward's


@pytest.mark.parametrize("training", [False, True])
def test_the_backwards_knobs_are_searched_only_for_a_training_target(training):
    source = starter_path("rmsnorm").read_text()
    declared = read_literals(source)
    tuner = Tuner(source, seed=0, dims={"M": 64, "N": 1024}, training=training)
    backward = {k for k in declared["TUNABLES"] if k.startswith("BWD_")}
    assert backward and (backward <= set(tuner.tunables)) is training
    assert not training or len(tuner.tunables) == len(declared["TUNABLES"])
    for _ in range(6):
        candidate = tuner.propose(None)
        tuner.observe(candidate, passed({"BLOCK": 64, "num_warps": 2}))
        if not training:  # an inference target's candidates keep the starter's backward as it is
            assert {k: candidate.config[k] for k in backward} == {k: declared["CONFIG"][k] for k in backward}
