"""bench/int4_one_row.py: the one-row candidates measured in docs/BENCHMARKS.md §5l multiply one
row by the same Q4_1 weights (torch's int4 kernel, its bfloat16 and int8 copies, and, where numba
is installed, the two numba kernels on their own nibble layout), so their rates compare one weight."""

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))
_spec = importlib.util.spec_from_file_location("int4_one_row", BENCH / "int4_one_row.py")
one_row = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(one_row)


@pytest.mark.parametrize("shape", [(64, 96), (128, 320)])
def test_candidates_multiply_by_the_same_weights(shape):
    n_out, k = shape
    layer, x = one_row.weights(n_out, k, seed=3), torch.randn(1, k, generator=torch.Generator().manual_seed(5))
    reference = x @ layer["w"].T
    scale = float(reference.abs().max())
    found = one_row.candidates(layer, x, None)
    assert set(found) == {"torch int4", "bf16 dense", "int8 rows"}
    # torch's kernel and the bfloat16 copy apply the same weights up to bfloat16 activations and
    # outputs; int8 rows round each weight again (one part in 254 of its row's largest)
    bounds = {"torch int4": 0.02, "bf16 dense": 0.02, "int8 rows": 0.05}
    for name, fn in found.items():
        assert float((fn().float() - reference).abs().max()) <= bounds[name] * scale, name


def test_numba_kernels_give_the_float32_product():
    pytest.importorskip("numba")
    n_out, k = 96, 256
    layer, x = one_row.weights(n_out, k, seed=4), torch.randn(1, k, generator=torch.Generator().manual_seed(6))
    reference = x @ layer["w"].T
    found = one_row.candidates(layer, x, one_row.numba_kernels())
    for name in ("numba rows", "numba flat"):
        assert torch.allclose(found[name]().reshape(1, -1), reference, rtol=1e-4, atol=1e-4), name
