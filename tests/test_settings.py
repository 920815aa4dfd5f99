"""Settings: validation messages, TOML round trip, bad files."""

import pytest

from engine.errors import SettingsError
from engine.settings import CachePolicy, CloudSettings, EngineSettings, load_settings, save_settings


def test_round_trip_through_toml(tmp_path):
    settings = EngineSettings(model="/models/x.gguf", device="cpu", cache=CachePolicy(budget_tokens=2048, kv_bits=8),
                              cloud=CloudSettings(enabled=True, base_url="http://127.0.0.1:9/v1", model="m"))
    path = save_settings(settings, tmp_path / "settings.toml")
    assert load_settings(path) == settings
    assert "api_key" not in path.read_text()


def test_missing_file_gives_defaults(tmp_path):
    assert load_settings(tmp_path / "none.toml") == EngineSettings()


@pytest.mark.parametrize("changes,message", [
    (dict(budget_tokens=100, window_tokens=1024), "smaller than sink \\+ window"),
    (dict(kv_bits=3), "kv_bits"),
    (dict(residual_tokens=2048, window_tokens=1024), "residual"),
    (dict(position_mode="sideways"), "position_mode"),
    (dict(chunk_tokens=0), "chunk_tokens"),
])
def test_invalid_policy_is_named(changes, message):
    with pytest.raises(SettingsError, match=message):
        CachePolicy().replace(**changes)


def test_bad_files_are_clear_errors(tmp_path):
    path = tmp_path / "settings.toml"
    path.write_text("this is = = not toml")
    with pytest.raises(SettingsError, match="cannot read settings file"):
        load_settings(path)
    path.write_text("[cache]\nbudget = 5\n")
    with pytest.raises(SettingsError, match="unknown setting cache.budget"):
        load_settings(path)
    path.write_text("[cloud]\nenabled = true\nbase_url = 'ftp://x'\nmodel = 'm'\n")
    with pytest.raises(SettingsError, match="https://"):
        load_settings(path)
