"""What the backward judge watches besides the values it checks: each wrong backward here returns
right gradients wherever a test of values alone would look, and is caught only by the watch named.

- caches_by_identity: remembers each call's gradients by its input tensors (held, so no address is
  reused) and hands them back when called again on the same tensors. Right on every fresh input;
  the replay refills the same buffers with new values, and only its check sees stale gradients.
- sums_with_pytorch_when_timed: counts the calls on the same input tensors; the replay makes two,
  only the timed reps make more, and on those the weight gradient is summed with PyTorch.
- float64_weight_gradient: the right values, returned in float64 for a float32 or float16 weight.

The first two keep state between calls, which the static check refuses before import: they are
judged behind it, so that the stages, not the filter, must stop them. Each names the break of the
judge it catches; their forwards are the honest file's and pass."""
from __future__ import annotations

import pytest

from backward_kernels import HONEST, RETURN, SUM_LAUNCH
from judge_batch import judge_batch

SIGNATURE = "def backward_fn(grad_out, out, x, weight, eps=1e-6):\n"
CACHE = "_calls = {}\n\n\n" + SIGNATURE
CACHES_BY_IDENTITY = (HONEST.replace(SIGNATURE, CACHE, 1)
                      .replace(CACHE, CACHE +
                               "    hit = _calls.get(id(x))\n"
                               "    if hit is not None and hit[0] is x and hit[1] is weight:\n"
                               "        return hit[2], hit[3]\n", 1)
                      .replace(RETURN, "    _calls[id(x)] = (x, weight, dx.view(x.shape), dw)\n" + RETURN, 1))
SUMS_WITH_PYTORCH_WHEN_TIMED = (HONEST.replace(SIGNATURE, CACHE, 1)
                                .replace(CACHE, CACHE +
                                         "    seen = _calls.get(id(x))\n"
                                         "    n = seen[1] + 1 if seen is not None and seen[0] is x else 1\n"
                                         "    _calls[id(x)] = (x, n)\n", 1)
                                .replace(SUM_LAUNCH, "    if n > 2:\n"
                                                     "        dw = part.sum(0).to(weight.dtype)\n"
                                                     "    else:\n"
                                         + "    " + SUM_LAUNCH, 1))
FLOAT64_WEIGHT_GRADIENT = HONEST.replace(RETURN, "    return dx.view(x.shape), dw.to(torch.float64)\n", 1)

# name -> (source, the backward stage that must fail it, a phrase of its reason)
WATCHED = {
    "caches_by_identity": (CACHES_BY_IDENTITY, "integrity", "replay"),
    "sums_with_pytorch_when_timed": (SUMS_WITH_PYTORCH_WHEN_TIMED, "timing", "aten::sum"),
    "float64_weight_gradient": (FLOAT64_WEIGHT_GRADIENT, "compile", "torch.float64"),
}


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory):
    folder = tmp_path_factory.mktemp("watched")
    paths = {}
    for name, (text, *_rest) in WATCHED.items():
        assert text != HONEST and text.count("_calls") in (0, 3), name  # each edit took, whole
        paths[name] = folder / f"{name}.py"
        paths[name].write_text(text)
    return judge_batch(paths, None, static_check=False, backward=True)


@pytest.mark.parametrize("name", sorted(WATCHED))
def test_each_watched_backward_fails_at_its_stage_and_its_forward_serves_inference(verdicts, name):
    _, stage, phrase = WATCHED[name]
    v = verdicts[name]
    assert v["verdict"] == "PASS", v["failed_stage"]
    back = v["backward"]
    why = next((s["detail"] for s in back["stages"] if s["name"] == back["failed_stage"]), "")
    assert (back["verdict"], back["failed_stage"]) == ("FAIL", stage), why[:2000]
    assert phrase in why, why[:2000]
    assert v["serves"] == f"inference only: the backward failed {stage}"
