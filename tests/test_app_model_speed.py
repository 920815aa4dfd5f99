"""Issue 44, item 6: the model list says what to expect here: an estimated answering (and reading)
speed from this machine's measured reads, and one model marked recommended for this machine."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest  # noqa: E402

from engine.models.catalog import DeviceMemory, fit, load_catalog  # noqa: E402
from engine.models.expected_speed import (  # noqa: E402
    RECOMMENDED_ANSWER_TOKENS_PER_S, expected_speed, machine_factor, recommended, step_parameters,
)
from engine.read_time import RateKey, guessed_rate, record_rate  # noqa: E402
from engine.settings import EngineSettings  # noqa: E402

GIB = 1024**3
LAPTOP = DeviceMemory("cpu", "RAM", 16 * GIB, 4)
SMALL = DeviceMemory("cpu", "RAM", 3 * GIB, 4)


def by_name(models, name):
    return next(model for model in models if model.name == name)


def test_the_estimates_reproduce_the_two_measured_decode_rates():
    """The constants come from two measurements on one CPU (BENCHMARKS §5f, §5g): the embedded
    135M model at 24 tokens/s and the 1.5B shape (with the 49,152-token vocabulary) at 6.31."""
    import dataclasses

    models = load_catalog()
    smol = by_name(models, "SmolLM2 135M Instruct")
    shape = dataclasses.replace(by_name(models, "Qwen2.5 1.5B Instruct"), vocab_size=49_152)
    assert expected_speed(smol, "cpu", None).answer_tokens_per_s == pytest.approx(24.0, rel=0.02)
    assert expected_speed(shape, "cpu", None).answer_tokens_per_s == pytest.approx(6.31, rel=0.02)
    assert step_parameters(shape) == pytest.approx(1_385e6, rel=0.01)
    assert expected_speed(smol, "cuda", None) is None  # not estimated where nothing was measured


def test_a_read_measured_here_scales_every_estimate(tmp_path):
    models = load_catalog()
    path = tmp_path / "read_speed.json"
    assert machine_factor(models, "cpu", path) is None
    qwen = by_name(models, "Qwen2.5 1.5B Instruct")
    before = expected_speed(qwen, "cpu", None)
    assert not before.measured and "a guess" in before.describe()
    half = guessed_rate("cpu", qwen.linear_parameters) / 2  # this machine read Qwen at half the reference rate
    assert record_rate(RateKey(qwen.repo, "cpu", "4-bit int4", 2), 4096, 4096 / half, path)
    assert machine_factor(models, "cpu", path) == pytest.approx(0.5)
    after = expected_speed(by_name(models, "Llama 3.2 3B Instruct"), "cpu", machine_factor(models, "cpu", path))
    reference = expected_speed(by_name(models, "Llama 3.2 3B Instruct"), "cpu", None)
    assert after.measured and after.answer_tokens_per_s == pytest.approx(reference.answer_tokens_per_s / 2)
    assert after.read_tokens_per_s == pytest.approx(reference.read_tokens_per_s / 2)


def test_the_recommended_model_fits_answers_fast_enough_and_is_the_largest_such():
    models = load_catalog()
    settings = EngineSettings()
    for memory in (LAPTOP, SMALL):
        speeds = [expected_speed(model, "cpu", None) for model in models]
        fits = [fit(model, settings, memory).fits for model in models]
        pick = recommended(models, speeds, fits)
        assert fits[pick] and speeds[pick].answer_tokens_per_s >= RECOMMENDED_ANSWER_TOKENS_PER_S
        better = [i for i in range(len(models)) if fits[i] and speeds[i].answer_tokens_per_s >= RECOMMENDED_ANSWER_TOKENS_PER_S
                  and models[i].linear_parameters > models[pick].linear_parameters]
        assert better == []
    assert models[recommended(models, speeds, [False] * len(models))].embedded  # nothing fits: the embedded model


def test_the_model_list_shows_the_speed_here_and_one_recommended_row(qtbot, memory_keyring, tmp_path, monkeypatch):
    from app.model_list import COLUMNS, RECOMMENDED, ModelList

    monkeypatch.setenv("HALAMAN_HOME", str(tmp_path))  # no read measured here: the reference machine's rates

    models = load_catalog()
    table = ModelList(EngineSettings(), models=models, memory=LAPTOP)
    qtbot.addWidget(table)
    here = COLUMNS.index("Here")
    cells = [table.table.item(row, here).text() for row in range(len(models))]
    assert sum(RECOMMENDED in cell for cell in cells) == 1
    assert all("tokens/s answering" in cell for cell in cells)
    slow = [("may be slow here" in cell) for cell in cells]
    assert slow == [speed.answer_tokens_per_s < 3.0 for speed in table.speeds] and any(slow)
    assert "reads ~" in table.table.item(0, here).toolTip()
