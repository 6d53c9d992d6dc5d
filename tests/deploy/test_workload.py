"""The inputs verify runs a model on: the profiled inputs, then the model file's get_workload() or
the profiled inputs with their leading (batch, sequence) dims varied."""
import textwrap

import pytest
import torch

from autokernel.deploy import workload
from autokernel.errors import UserError
from autokernel.profile.modelfile import ModelSpec, load_model

MODEL = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, 8)
        self.proj = nn.Linear(8, 4)

    def forward(self, ids, mask):
        return self.proj(self.embed(ids)) * mask.unsqueeze(-1)


def get_inputs():
    return [torch.randint(0, 50, (2, 10)), torch.ones(2, 10)]


def get_init_inputs():
    return []
'''


def load(tmp_path, text, **spec):
    path = tmp_path / "model.py"
    path.write_text(textwrap.dedent(text))
    return load_model(ModelSpec(path=str(path), **spec))


def test_without_get_workload_the_sequence_is_halved_plus_odd_the_batch_doubled_and_one_token_decoded(tmp_path):
    loaded = load(tmp_path, MODEL)
    sets, source, skipped = workload.input_sets(loaded, (0, 1))
    assert source == workload.SOURCE_DEFAULT and skipped == {}
    assert [(s.name, s.seeds, s.profiled) for s in sets] == [("2x10 (profiled)", (0, 1), True), ("2x9", (0,), False),
                                                             ("4x10", (0,), False), ("2x1", (0,), False)]
    profiled = loaded.make_inputs(0)
    for s in sets[1:]:
        ids, mask = s.make(0)
        assert ids.shape == mask.shape  # every input with the first one's leading dims follows it
        rows, cols = min(ids.shape[0], 2), min(ids.shape[1], 10)
        assert torch.equal(ids[:rows, :cols], profiled[0][:rows, :cols])  # the profiled values, cut
    doubled = sets[2].make(0)[0]
    assert torch.equal(doubled[2:], loaded.make_inputs(1000)[0])  # the batch grown with another seed's rows


def test_inputs_without_a_sequence_vary_their_batch_and_a_short_sequence_grows_from_another_seed(tmp_path):
    loaded = load(tmp_path, "import torch\nclass M(torch.nn.Module):\n    def forward(self, x):\n        return x * 2\n",
                  class_name="M", input_shape=[6, 16])
    sets, _, _ = workload.input_sets(loaded, (0,))
    assert [s.name for s in sets] == ["6 (profiled)", "7", "12", "1"]
    assert sets[1].make(0)[0].shape == (7, 16)
    tokens = load(tmp_path, "import torch\nclass M(torch.nn.Module):\n    def forward(self, x):\n        return x + 1\n",
                  class_name="M", input_shape=[1, 2], input_dtype="tokens", vocab_size=9)
    sets, _, _ = workload.input_sets(tokens, (0,))
    assert [s.name for s in sets] == ["1x2 (profiled)", "1x5", "2x2", "1x1"]
    grown = sets[1].make(0)[0]
    assert grown.shape == (1, 5) and torch.equal(grown[:, :2], tokens.make_inputs(0)[0])


WORKLOAD = MODEL + '''

def get_workload():
    ids = torch.randint(0, 50, (1, 7))
    return [{"name": "prefill 7", "inputs": [ids, torch.ones(1, 7)]},
            [ids[:, :1], torch.ones(1, 1)],
            [torch.randint(0, 50, (1, 3)), torch.ones(1, 4)]]  # shapes the model cannot take
'''


def test_get_workload_gives_the_sets_names_them_and_leaves_out_one_the_model_cannot_run(tmp_path):
    loaded = load(tmp_path, WORKLOAD)
    sets, source, skipped = workload.input_sets(loaded, (0,))
    assert source == workload.SOURCE_FILE
    assert [s.name for s in sets] == ["2x10 (profiled)", "prefill 7", "1x1"]
    assert list(skipped) == ["1x3"] and "RuntimeError" in skipped["1x3"]
    assert torch.equal(sets[1].make(0)[0], sets[1].make(0)[0])  # seeded: the same inputs every time
    assert torch.equal(sets[2].make(0)[0], sets[1].make(0)[0][:, :1])


def test_a_get_workload_that_returns_no_list_says_how_to_write_one(tmp_path):
    loaded = load(tmp_path, MODEL + "\n\ndef get_workload():\n    return torch.zeros(3)\n")
    with pytest.raises(UserError, match="not a list of input sets") as e:
        workload.input_sets(loaded, (0,))
    assert "return a list like" in e.value.hint


def test_with_an_input_shape_of_the_users_the_file_s_get_workload_is_not_used(tmp_path):
    loaded = load(tmp_path, WORKLOAD.replace("def forward(self, ids, mask):", "def forward(self, ids, mask=None):")
                  .replace("* mask.unsqueeze(-1)", ""), input_shape=[1, 6], input_dtype="tokens", vocab_size=50)
    sets, source, _ = workload.input_sets(loaded, (0,))
    assert source == workload.SOURCE_DEFAULT and [s.name for s in sets] == ["1x6 (profiled)", "1x7", "2x6", "1x1"]
