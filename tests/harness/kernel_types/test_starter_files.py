"""What every starter file declares, for both backends: literals the tuner can read and rewrite
without importing the file, and kernel_fn with the registry's signature."""
from __future__ import annotations

import ast

import pytest

from autokernel.search.kernel_source import apply_config, check_constraints, read_literals
from harness.kernel_types import registry
from starter_configs import SECOND_CONFIGS, source
from starter_kernels import BACKENDS, TYPES_BY_BACKEND

CASES = [(backend, kernel_type) for backend in BACKENDS for kernel_type in TYPES_BY_BACKEND[backend]]


@pytest.mark.parametrize("backend,kernel_type", CASES)
def test_literals_declare_a_space_holding_config_and_second_config(backend, kernel_type):
    lit = read_literals(source(kernel_type, backend))
    assert lit["KERNEL_TYPE"] == kernel_type and lit["BACKEND"] == backend
    space, config, second = lit["TUNABLES"], lit["CONFIG"], SECOND_CONFIGS[backend][kernel_type]
    if backend == "triton":
        assert {"num_warps", "num_stages"} <= set(space)
    for chosen in (config, second):
        assert set(chosen) == set(space)
        assert all(chosen[name] in values for name, values in space.items()), chosen
        assert check_constraints(lit["CONSTRAINTS"], chosen), chosen
    assert second != config


@pytest.mark.parametrize("backend,kernel_type", CASES)
def test_tuner_rewrite_changes_only_the_config_line(backend, kernel_type):
    """Only the CONFIG statement changes (it may span lines: a backward's BWD_ settings widen it)."""
    def around_config(text):
        lines = text.splitlines()
        node = next(n for n in ast.parse(text).body if isinstance(n, ast.Assign)
                    and any(isinstance(t, ast.Name) and t.id == "CONFIG" for t in n.targets))
        return lines[:node.lineno - 1], "\n".join(lines[node.lineno - 1:node.end_lineno]), lines[node.end_lineno:]
    text = source(kernel_type, backend)
    after = apply_config(text, SECOND_CONFIGS[backend][kernel_type])
    head, config, tail = around_config(text)
    head2, config2, tail2 = around_config(after)
    assert (head, tail) == (head2, tail2) and config != config2 and config2.startswith("CONFIG = ")
    assert ast.literal_eval(config2.split("=", 1)[1].strip()) == SECOND_CONFIGS[backend][kernel_type]


@pytest.mark.parametrize("backend,kernel_type", CASES)
def test_kernel_fn_has_the_registry_signature(backend, kernel_type):
    fn = next(n for n in ast.parse(source(kernel_type, backend)).body
              if isinstance(n, ast.FunctionDef) and n.name == "kernel_fn")
    names = [a.arg for a in fn.args.args]
    defaults = dict(zip(names[len(names) - len(fn.args.defaults):],
                        (ast.literal_eval(d) for d in fn.args.defaults)))
    kt = registry.get(kernel_type)
    assert tuple(names) == kt.params and defaults == kt.defaults
