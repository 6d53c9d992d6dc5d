"""The work recorded ops do: product formulas agree with torch's own FLOP counter, elementwise work
is counted by elements, data movement by none, and what cannot be counted is kept apart."""
import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from autokernel.profile import module_targets, op_work
from autokernel.profile.forms import Node
from autokernel.profile.profiler import ROOT
from autokernel.profile.records import from_kineto, op_trees


def recorded(fn) -> list[Node]:
    """The top-level ops `fn` runs, as the profiler records them (shapes, dtypes, constants)."""
    from torch.autograd.profiler import record_function
    with torch.no_grad(), torch.profiler.profile(record_shapes=True) as prof:
        with record_function(ROOT):
            fn()
    (tree,) = op_trees(from_kineto(prof.profiler.kineto_results, "cpu"), ROOT, lambda name: None)
    return tree.children


def torch_flops(fn) -> int:
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


x, x2, w, wt = torch.randn(3, 5, 16), torch.randn(5, 16), torch.randn(24, 16), torch.randn(16, 24)
a3, b3 = torch.randn(2, 5, 7), torch.randn(2, 7, 3)
img, kernel = torch.randn(2, 4, 9, 9), torch.randn(6, 2, 3, 3)
q, k, v = torch.randn(1, 4, 6, 8), torch.randn(1, 2, 10, 8), torch.randn(1, 2, 10, 5)
PRODUCTS = {
    "mm": lambda: torch.mm(x2, wt),
    "addmm": lambda: torch.addmm(torch.randn(24), x2, wt),
    "bmm": lambda: torch.bmm(a3, b3),
    "baddbmm": lambda: torch.baddbmm(torch.randn(2, 5, 3), a3, b3),
    "matmul 3-D x 2-D": lambda: torch.matmul(x, wt),
    "linear 3-D": lambda: F.linear(x, w, torch.randn(24)),
    "conv2d strided, padded, grouped": lambda: F.conv2d(img, kernel, stride=2, padding=1, groups=2),
    "conv_transpose1d": lambda: F.conv_transpose1d(torch.randn(1, 4, 9), torch.randn(4, 2, 3), stride=2),
    "sdpa with grouped kv heads": lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True),
}


@pytest.mark.parametrize("name", list(PRODUCTS))
def test_product_formulas_agree_with_torchs_flop_counter(name):
    fn = PRODUCTS[name]
    (op,) = [n for n in recorded(fn) if n.kind != "randn"]
    assert op_work.formula(op) is not None, op.name
    assert op_work.count([op]).flops == torch_flops(fn) > 0


def test_grouped_mm_counts_every_routed_row_once():
    tokens, weights = torch.randn(10, 16), torch.randn(4, 16, 32)
    offs = torch.tensor([3, 3, 7, 10], dtype=torch.int32)  # 3, 0, 4 and 3 rows for the four experts
    (op,) = recorded(lambda: torch._grouped_mm(tokens, weights, offs=offs))
    work = op_work.count([op])
    assert work.flops == work.matmul_flops == 2 * 10 * 16 * 32
    assert dict(work.matmuls) == {"aten::_grouped_mm[K=16,N=32,groups=4]": [10]}


def test_causal_attention_counts_the_half_it_computes():
    q4 = torch.randn(1, 2, 8, 4)
    (full,) = recorded(lambda: F.scaled_dot_product_attention(q4, q4, q4))
    (causal,) = recorded(lambda: F.scaled_dot_product_attention(q4, q4, q4, is_causal=True))
    assert op_work.count([causal]).flops * 2 == op_work.count([full]).flops == 4 * 2 * 8 * 8 * 4


def test_einsum_is_counted_by_what_its_equation_dispatches():
    (contraction,) = recorded(lambda: torch.einsum("bij,bjk->bik", a3, b3))
    (elementwise,) = recorded(lambda: torch.einsum("ij,ij->ij", x2, x2))
    assert op_work.count([contraction]).matmul_flops == 2 * 2 * 5 * 7 * 3
    product = op_work.count([elementwise])
    assert product.matmul_flops == 0 and product.flops == 5 * 16 and not product.uncounted


def test_elementwise_ops_count_their_broadcast_elements_and_data_movement_counts_none():
    col, row = torch.randn(128, 1), torch.randn(1, 256)
    ops = recorded(lambda: (col * row, torch.tanh(row), row.sum(-1), torch.cat([row, row]),
                            F.embedding(torch.tensor([1, 2]), torch.randn(50, 8)), row.view(16, 16).contiguous()))
    ops = [n for n in ops if n.kind not in ("randn", "tensor", "lift_fresh", "detach_", "to")]
    flops = {n.kind: op_work.count([n]).flops for n in ops}
    assert flops["mul"] == 128 * 256 and flops["tanh"] == 256 and flops["sum"] == 256
    assert flops["cat"] == flops["embedding"] == flops["view"] == 0


def test_work_that_cannot_be_counted_is_kept_apart():
    opaque = Node("mylib::fused_moe", 40.0, shapes=[[8, 16]], dtypes=["float"])
    no_formula = Node("aten::_weight_int4pack_mm", 30.0, shapes=[[8, 16], [4, 2], [], []], dtypes=["float", "int"])
    unshaped = Node("aten::mm", 20.0, shapes=[[], []], dtypes=["", ""])
    counted = Node("aten::mul", 5.0, shapes=[[8, 16], [8, 16]], dtypes=["float", "float"])
    work = op_work.count([opaque, no_formula, unshaped, counted])
    assert dict(work.uncounted) == {"mylib::fused_moe": 40.0, "aten::_weight_int4pack_mm": 30.0, "aten::mm": 20.0}
    assert work.flops == 8 * 16
    # a library's op that computed outside torch (numpy) recorded only casts and views: not counted
    numpy_op = Node("mylib::numpy_tanh", 50.0, shapes=[[8, 16]], dtypes=["float"],
                    children=[Node("aten::detach", 1.0), Node("aten::to", 1.0), Node("aten::resolve_neg", 0.1)])
    assert dict(op_work.count([numpy_op]).uncounted) == {"mylib::numpy_tanh": pytest.approx(52.1)}
    # a library's op that ran recorded aten ops is counted by them
    wrapped = Node("mylib::gemm", 0.0, children=[Node("aten::mm", 9.0, shapes=[[8, 16], [16, 4]],
                                                      dtypes=["float", "float"])])
    assert op_work.count([wrapped]).flops == 2 * 8 * 16 * 4 and not op_work.count([wrapped]).uncounted
    # on a GPU a module's own time is kernels no op launched (a Triton kernel called from Python)
    triton = Node("module::moe::Experts", 12.0, module=("moe", "Experts"), children=[counted])
    assert list(op_work.count([triton], kernels_only=True).uncounted) == ["kernels launched by Experts outside any op"]
    # on a CPU a user's own range is Python between ops, not uncounted work
    assert not op_work.count([Node("my_range", 3.0)]).uncounted


def test_data_dependent_shapes_are_found_inside_the_ops_that_make_them():
    mask = torch.tensor([True, False, True])
    (where,) = recorded(lambda: torch.where(mask))
    (index,) = recorded(lambda: torch.randn(3, 4)[mask])[-1:]
    assert op_work.data_dependent(where) == "aten::nonzero_numpy" and op_work.data_dependent(index) == "aten::nonzero"
    (plain,) = recorded(lambda: torch.where(mask, 1.0, 0.0))
    assert op_work.data_dependent(plain) is None


def test_a_module_is_charged_the_weights_its_products_read_not_the_table_an_embedding_indexes():
    stacked, table, norm = torch.zeros(4, 8, 16), torch.zeros(1000, 8), torch.zeros(16)
    whole = stacked.numel() * 4
    assert module_targets.weight_bytes([[4, 16, 8]], [stacked]) == whole  # read whole, transposed (grouped mm)
    assert module_targets.weight_bytes([[8, 16], [8, 16]], [stacked]) == whole // 2  # two experts' slices
    assert module_targets.weight_bytes([[8, 16]] * 9, [stacked]) == whole  # never more than once whole
    assert module_targets.weight_bytes([[3, 16], [16]], [table, norm]) == 16 * 4  # embedding rows: not here


PRODUCTS_WITHOUT_FORMULA = ["_weight_int4pack_mm", "_scaled_grouped_mm", "cudnn_convolution", "_efficient_attention_forward",
                            "bilinear", "linalg_solve", "fft_rfft", "cdist", "lstm", "_cudnn_rnn", "tensordot", "hspmm"]
ELEMENTWISE_LOOKALIKES = ["cummax", "cummin", "upsample_bilinear2d", "upsample_linear1d", "linalg_vector_norm",
                          "_convert_indices_from_coo_to_csr", "gelu"]


@pytest.mark.parametrize("kind", PRODUCTS_WITHOUT_FORMULA + ELEMENTWISE_LOOKALIKES)
def test_only_products_without_a_formula_are_left_uncounted(kind):
    work = op_work.count([Node(f"aten::{kind}", 7.0, shapes=[[8, 16], [8, 16]], dtypes=["float", "float"])])
    if kind in PRODUCTS_WITHOUT_FORMULA:
        assert dict(work.uncounted) == {f"aten::{kind}": 7.0} and work.flops == 0
    else:
        assert not work.uncounted and work.flops == 8 * 16
