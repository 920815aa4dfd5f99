"""How a `Bf16Int8Workspace` holds its bfloat16 keys (`engine.kvcache.key_layout`): the layout this
CPU runs faster for the model's shape, measured once per process and shape, and a workspace that
computes the same attention either way."""

import pytest
import torch
from fake_clock import FakeClock

from engine.kvcache import key_layout
from engine.kvcache.decode_workspace import Bf16Int8Workspace

REAL_ROWS, REAL_TRANSPOSED = key_layout.rows_products, key_layout.transposed_products


@pytest.fixture
def fresh(monkeypatch):
    """Measure again in this test, and forget what it measured afterwards."""
    monkeypatch.setattr(key_layout, "METHOD", "auto")
    # small calibrations: these tests check the choosing, not this CPU (48 MB of bfloat16 products
    # take seconds on a CPU without AVX-512 BF16)
    monkeypatch.setattr(key_layout, "CALIBRATION_KEYS", 256)
    monkeypatch.setattr(key_layout, "CALIBRATION_BYTES", 1024**2)
    key_layout.forget_choices()
    yield
    key_layout.forget_choices()


def costs(monkeypatch, rows_s, transposed_s):
    clock = FakeClock()
    monkeypatch.setattr(key_layout, "time", clock)
    monkeypatch.setattr(key_layout, "rows_products", clock.costing(REAL_ROWS, rows_s))
    monkeypatch.setattr(key_layout, "transposed_products", clock.costing(REAL_TRANSPOSED, transposed_s))


def workspace_logits(group=3):
    torch.manual_seed(0)
    keys, values = torch.randn(3, 200, 64), torch.randn(3, 200, 64)
    workspace = Bf16Int8Workspace(keys, values, group)
    query = torch.randn(3, group, 64)
    reference = torch.bmm(query.to(torch.bfloat16).float(), keys.to(torch.bfloat16).float().transpose(1, 2))
    return workspace, workspace.logits(query).float(), reference


@pytest.mark.parametrize(("rows_s", "transposed_s", "transposed"), [(0.2, 0.1, True), (0.1, 0.2, False)])
def test_the_faster_layout_is_held(fresh, monkeypatch, rows_s, transposed_s, transposed):
    costs(monkeypatch, rows_s, transposed_s)
    workspace, logits, reference = workspace_logits()
    assert workspace._transposed is transposed
    assert workspace._keys.shape == ((3, 64, 200) if transposed else (3, 200, 64))
    torch.testing.assert_close(logits, reference, rtol=1e-2, atol=1e-1)  # logits rounded to bfloat16
    [choice] = key_layout.measured()
    assert choice.transposed is transposed
    assert choice.copies * 3 * key_layout.CALIBRATION_KEYS * 64 * 2 >= key_layout.CALIBRATION_BYTES  # more than the caches hold
    assert choice.rows_us == pytest.approx(rows_s * 1e6 / choice.copies)
    assert choice.transposed_us == pytest.approx(transposed_s * 1e6 / choice.copies)


def test_measured_once_per_process_and_shape(fresh, monkeypatch):
    calls = []
    real = key_layout._measure
    monkeypatch.setattr(key_layout, "_measure", lambda *shape: calls.append(shape) or real(*shape))
    for _ in range(3):
        workspace_logits(group=3)
    workspace_logits(group=6)
    assert [c[:3] for c in calls] == [(3, 3, 64), (3, 6, 64)]
    assert len(key_layout.measured()) == 2


def test_an_int8_workspace_times_no_layout(fresh):
    """Where decode steps hold int8 keys (CPUs without AVX-512 BF16) no bfloat16 product is timed."""
    from engine.kvcache.decode_workspace import Int8Workspace

    workspace = Int8Workspace(torch.randn(3, 40, 64), torch.randn(3, 40, 64), 3)
    workspace.append(torch.randn(3, 8, 64), torch.randn(3, 8, 64))
    workspace.keep(torch.arange(0, 48, 2).expand(3, -1), torch.randn(3, 24, 64))
    assert workspace.logits(torch.randn(3, 3, 64)).shape == (3, 3, 24)
    assert key_layout.measured() == []
    Bf16Int8Workspace(torch.randn(3, 40, 64), torch.randn(3, 40, 64), 3)
    assert len(key_layout.measured()) == 1  # the fixture's fresh registry does record a bfloat16 one


def test_both_layouts_give_the_same_logits(monkeypatch):
    results = {}
    for method in ("rows", "transposed"):
        monkeypatch.setattr(key_layout, "METHOD", method)
        workspace, logits, reference = workspace_logits()
        assert workspace._transposed is (method == "transposed")
        torch.testing.assert_close(logits, reference, rtol=1e-2, atol=1e-1)
        results[method] = logits
    # the same bfloat16 products summed in float32: equal where the kernel sums in the same order,
    # within one bfloat16 rounding wherever it does not
    torch.testing.assert_close(results["rows"], results["transposed"], rtol=8e-3, atol=1e-2)


def test_an_unknown_method_is_refused(monkeypatch):
    monkeypatch.setattr(key_layout, "METHOD", "fast")
    with pytest.raises(ValueError, match="key_layout.METHOD"):
        Bf16Int8Workspace(torch.randn(3, 10, 64), torch.randn(3, 10, 64), 3)
