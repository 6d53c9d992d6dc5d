"""What one experiment's prompt holds, and the playbook section chosen for it."""
import pytest

import playbook
from autokernel.search import prompt
from autokernel.search.proposer import Candidate, Experiment, SearchContext
from harness.kernel_types import registry

BEST_SOURCE = '''KERNEL_TYPE = "rmsnorm"
BACKEND = "triton"
CONFIG = {"BLOCK_N": 1024}
def kernel_fn(x, weight, eps=1e-6):
    return _launch_marker_4711(x, weight, eps)
'''
BEST_VERDICT = {
    "verdict": "PASS", "failed_stage": None, "stages": [],
    "timing": {"median_us": 123.5, "iqr_us": 4.25, "baseline_median_us": 250.0, "speedup_vs_eager": 2.02},
    "roofline": {"gbps": 812.0, "tflops": 0.4, "pct_of_peak": 61.5, "bound": "memory"},
    "resources": {"arch": "sm_90", "registers": 40, "spills": 0, "shared_bytes": 0},
    "device": {"type": "cuda", "name": "NVIDIA H100"},
}


def context(history=(), **changes):
    ctx = SearchContext(kernel_type="rmsnorm", dims={"M": 4096, "N": 4096}, dtype="float16",
                        target=registry.target_name("rmsnorm", {"M": 4096, "N": 4096}, "float16"),
                        best_source=BEST_SOURCE, best_verdict=BEST_VERDICT, history=list(history),
                        device={"type": "cuda", "name": "NVIDIA H100 80GB HBM3", "capability": "sm_90",
                                "sms": 132},
                        peaks={"copy_gbps": 2905.5, "matmul_tflops": {"float16": 611.0, "float32": 49.0}},
                        experiment=len(history))
    for k, v in changes.items():
        setattr(ctx, k, v)
    return ctx


def failures(n):
    return [Experiment(0, "starter", "BASELINE", "PASS", median_us=250.0)] + [
        Experiment(i, f"idea number {i}", "REVERT", "FAIL", "shape_sweep",
                   f"rmsnorm[3x4097:float16]: failure detail {i}") for i in range(1, n + 1)]


def user_text(ctx):
    messages = prompt.build_messages(ctx)
    assert [m["role"] for m in messages] == ["system", "user"]
    return messages[0]["content"], messages[1]["content"]


def test_contract_target_device_and_best_kernel_are_in_the_prompt():
    system, user = user_text(context(failures(1)))
    kt = registry.get("rmsnorm")
    assert kt.signature_text() in user
    assert kt.reference_source.strip() in user
    assert "rmsnorm[4096x4096:float16]" in user and "M=4096, N=4096" in user and "float16" in user
    assert "NVIDIA H100 80GB HBM3" in user and "sm_90" in user
    assert "2906 GB/s" in user and "611 TFLOP/s" in user  # the float16 peak, not float32's
    assert BEST_SOURCE.strip() in user
    assert "123.5 us" in user and "IQR 4.25 us" in user and "2.02x" in user
    assert "memory-bound" in user and "61.5%" in user


def test_rules_are_the_system_message():
    system, _ = user_text(context())
    assert playbook.read("rules").strip() in system
    assert "integrity" in system and "```python" in system


def test_recent_experiments_with_failing_stage_and_message():
    _, user = user_text(context(failures(12)))
    # only the last eight experiments are shown
    assert "| 12 | REVERT | FAIL | shape_sweep |" in user and "| 5 | REVERT |" in user
    assert "| 4 | REVERT |" not in user and "| 0 | BASELINE |" not in user
    assert "experiment 12 failed `shape_sweep`: rmsnorm[3x4097:float16]: failure detail 12" in user
    assert "failure detail 3" not in user


def test_long_failure_messages_are_cut():
    history = failures(0) + [Experiment(1, "x", "REVERT", "CRASH", "compile", "E" * 5000)]
    _, user = user_text(context(history))
    assert "E" * prompt.MESSAGE_CHARS + " ..." in user and "E" * (prompt.MESSAGE_CHARS + 1) not in user


def test_a_passing_kernel_whose_time_was_not_trusted_is_told_why():
    note = "measured twice and both times too wide: the reps' IQR was 90% then 89% of the median"
    verdict = {"verdict": "PASS", "failed_stage": None, "stages": [],
               "timing": {"median_us": 80.0, "iqr_us": 72.0, "spread_ok": False, "spread_note": note}}
    untrusted = Experiment.from_verdict(1, Candidate("src", "fast but noisy"), verdict, "REVERT")
    assert untrusted.message == f"its time was not trusted: {note}"
    _, user = user_text(context(failures(0) + [untrusted]))
    assert f"- experiment 1 passed, but: its time was not trusted: {note}" in user
    trusted = Experiment.from_verdict(2, Candidate("src", "steady"), {**verdict, "timing": {
        **verdict["timing"], "spread_ok": True, "spread_note": "the reps' IQR is 3% of the median"}}, "REVERT")
    assert trusted.message == ""
    _, user = user_text(context(failures(0) + [trusted]))
    assert "experiment 2 passed" not in user


def test_no_code_reply_is_called_out_only_right_after_it_happened():
    parse = Experiment.from_verdict(1, Candidate(None, "reply without a kernel"), None, "REVERT")
    assert (parse.verdict, parse.failed_stage) == ("FAIL", "parse")
    _, user = user_text(context(failures(0) + [parse]))
    assert "Your previous reply" in user and "no complete ```python block" in user
    later = Experiment(2, "fixed", "REVERT", "PASS", median_us=300.0)
    _, user = user_text(context(failures(0) + [parse, later]))
    assert "Your previous reply" not in user


def test_playbook_section_follows_the_search():
    _, user = user_text(context(failures(0)))
    assert "## Playbook (tier 1)" in user and playbook.read("tier1_launch_tiling").strip() in user
    assert "## Tricks for rmsnorm" in user and "## Tricks for softmax" not in user
    passing = [Experiment(i, "ok", "REVERT", "PASS", median_us=260.0) for i in range(1, 7)]
    _, user = user_text(context(failures(0) + passing))
    assert "## Playbook (tier 4)" in user  # memory-bound: tiers 1, 2, then 4


@pytest.mark.parametrize("bound, experiments, failed, tier", [
    (None, 0, None, 1), ("memory", 1, None, 1), ("memory", 4, None, 2), ("compute", 4, None, 3),
    ("compute", 7, None, 4), ("compute", 10, None, 5), ("memory", 7, None, 4),
    ("memory", 7, "smoke", 2),  # a broken candidate holds the advice back a tier
    ("memory", 2, "parse", 1),
    ("memory", 16, None, 1),  # cycles once every tier was offered
])
def test_tier_choice(bound, experiments, failed, tier):
    assert playbook.tier_for(bound, experiments, failed) == tier


def test_playbook_files_read_from_the_package():
    for name in playbook.names():
        assert playbook.read(name).startswith("# ")
    assert playbook.read("rules.md") == playbook.read("rules")
    with pytest.raises(KeyError):
        playbook.read("../pyproject.toml")
    for kernel_type in registry.names():
        assert playbook.kernel_tricks(kernel_type).startswith(f"## Tricks for {kernel_type}")
    assert playbook.kernel_tricks("conv2d") == ""


def test_render_keeps_every_message():
    messages = prompt.build_messages(context())
    text = prompt.render(messages)
    assert "<!-- system -->" in text and "<!-- user -->" in text and BEST_SOURCE.strip() in text


def test_ideas_first_asks_for_three_ideas_then_implements_one_per_experiment():
    ask = user_text(context(strategy="ideas_first"))[1]
    assert "three distinct ideas" in ask and "implement idea 1" in ask
    reply = ("1. Two rows per program.\n2) **Vectorised** loads of 8 halves.\n3. An online softmax in one pass.\n"
             "Idea 1 below.\n```python\n1. not an idea = 2\n```\n")
    ideas = prompt.parse_ideas(reply)
    assert ideas == ["Two rows per program.", "**Vectorised** loads of 8 halves.", "An online softmax in one pass."]
    later = [user_text(context(strategy="ideas_first", ideas=ideas, visit_proposals=n))[1] for n in (1, 2)]
    assert "Implement this idea, and only this one: **Vectorised** loads" in later[0]
    assert "An online softmax in one pass." in later[1] and "three distinct ideas" not in later[1]


def test_a_parent_other_than_the_best_and_the_smaller_prompts():
    inspiration = {"number": 7, "median_us": 130.0, "description": "two rows", "source": "# inspiration 7\n"}
    ctx = context(history=failures(8), parent_number=5, parent_source="# parent 5\n", parent_median_us=140.0,
                  inspirations=[inspiration])
    whole = user_text(ctx)[1]
    assert "Parent kernel: experiment 5" in whole and "# parent 5" in whole and "_launch_marker_4711" not in whole
    assert "# inspiration 7" in whole
    smaller, smallest = (prompt.build_messages(ctx, level)[1]["content"] for level in (1, 2))
    assert len(whole) > len(smaller) > len(smallest)
    assert "# inspiration 7" not in smaller and "## Playbook" in smaller and "## Playbook" not in smallest
    assert "Recent experiments" not in smallest and "# parent 5" in smallest  # what to improve stays


@pytest.mark.parametrize("kernel_type, params", [
    ("rmsnorm", "grad_out, out, x, weight, eps=1e-06"),
    ("flash_attention", "grad_out, out, q, k, v, causal=False, sm_scale=None")])
def test_backward_section_states_the_contract_for_a_training_target(kernel_type, params):
    text = prompt.backward_section(kernel_type)
    assert f"`backward_fn({params})`" in text
    words = " ".join(text.split())  # the playbook's line breaks are its own
    for rule in ("Recompute rather than save", "BWD_", "never `.sum()` in PyTorch",
                 "No returned gradient may share memory", "rmsnorm (x, weight)"):
        assert rule in words, rule
    # an inference target's prompt does not carry it: the rules are the system prompt, not this
    system, user = user_text(context())
    assert "Recompute rather than save" not in system + user and "Training target" not in user


def test_a_training_targets_prompt_asks_for_a_backward_and_an_inference_targets_does_not():
    training = prompt.render(prompt.build_messages(context(training=True)))
    assert "## Training target: give a backward too" in training
    assert "backward_fn(grad_out, out, x, weight, eps=1e-06)" in training
    assert "Recompute" in training or "recompute" in training  # the playbook's advice comes with it
    inference = prompt.render(prompt.build_messages(context()))
    assert "Training target" not in inference and "backward_fn(" not in inference


def test_a_training_targets_prompt_times_the_best_by_forward_plus_backward():
    back = {"verdict": "PASS", "stages": [], "timing": {"forward_backward": {
        "median_us": 400.5, "iqr_us": 8.0, "reps": 20, "eager_median_us": 600.75, "speedup_vs_eager": 1.5}}}
    user = prompt.build_messages(context(training=True, best_verdict={**BEST_VERDICT, "backward": back}))[1]["content"]
    assert "median 400.5 us for one forward plus backward" in user and "(600.8 us)" in user
    assert "median 123.5 us" not in user  # the forward alone is not what a training step pays
