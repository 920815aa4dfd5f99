"""Settings: validation messages, TOML round trip, bad files (B29 in docs/REAL_WORLD_INPUTS.md: a
byte-order mark, unknown keys, values of the wrong type; every message names the file)."""

import codecs
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # before pytest-qt makes the application (the app test)

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
    with pytest.raises(SettingsError, match="settings file .*: not valid TOML"):
        load_settings(path)
    path.write_text("[cache]\nbudget = 5\n")
    warnings: list[str] = []
    assert load_settings(path, warn=warnings.append) == EngineSettings()  # B29: a warning, not a refusal
    assert warnings == [f"settings file {path}: unknown setting cache.budget ignored (did you mean cache.budget_tokens?)"]
    path.write_text("[cloud]\nenabled = true\nbase_url = 'ftp://x'\nmodel = 'm'\n")
    with pytest.raises(SettingsError, match="https://"):
        load_settings(path)


def b29(corpus: Path, name: str) -> Path:
    return next((corpus / "bugs").glob("B29-*")) / name


EXPECTED = EngineSettings(max_new_tokens=128)


def test_b29_settings_saved_with_a_byte_order_mark_are_read(corpus, tmp_path):
    path = tmp_path / "settings.toml"
    shutil.copyfile(b29(corpus, "settings-bom.toml"), path)
    assert path.read_bytes().startswith(codecs.BOM_UTF8)
    warnings: list[str] = []
    assert load_settings(path, warn=warnings.append) == EXPECTED and warnings == []


@pytest.mark.parametrize("codec", ["utf-16", "utf-16-le", "utf-32"])
def test_settings_in_utf16_or_utf32_with_a_byte_order_mark_are_read(tmp_path, codec):
    """PowerShell 5's `Out-File` and `>` write UTF-16 LE with a BOM; "utf-16-le" adds it by hand."""
    path = tmp_path / "settings.toml"
    text = 'model = "default"\r\nmax_new_tokens = 128\r\n'
    path.write_bytes((codecs.BOM_UTF16_LE if codec == "utf-16-le" else b"") + text.encode(codec))
    assert load_settings(path) == EXPECTED


def test_b29_unknown_key_is_a_warning_that_names_the_file_and_the_key(corpus, tmp_path):
    path = tmp_path / "settings.toml"
    shutil.copyfile(b29(corpus, "settings-unknown-key.toml"), path)
    warnings: list[str] = []
    settings = load_settings(path, warn=warnings.append)
    assert settings == EngineSettings(max_new_tokens=128, cache=CachePolicy(budget_tokens=8192))
    assert warnings == [f"settings file {path}: unknown setting theme ignored"]


@pytest.mark.parametrize("text,message", [
    ("[cache]\nbudget_tokens = \"big\"\n", "cache.budget_tokens must be a whole number, got 'big'"),
    ("temperature = \"hot\"\n", "temperature must be a number, got 'hot'"),
    ("max_new_tokens = 1.5\n", "max_new_tokens must be a whole number, got 1.5"),
    ("prefix_cache = 1\n", "prefix_cache must be true or false, got 1"),
    ("[cloud]\nenabled = \"yes\"\n", "cloud.enabled must be true or false, got 'yes'"),
    ("[cloud]\nenabled = true\nbase_url = 5\nmodel = \"m\"\n", "cloud.base_url must be text in quotes, got 5"),
    ("cache = 5\n", "cache must be a table ([cache]), got 5"),
    ("model = [\"a\"]\n", "model must be text in quotes, got ['a']"),
    ("[recall]\nmax_spans = 1979-05-27\n", "recall.max_spans must be a whole number, got datetime.date(1979, 5, 27)"),
    ("[cache]\nkv_bits = 3\n", "kv_bits must be 4, 8 or 16, got 3"),
    ("threads = -1\n", "threads must be 0"),
    ("this is = = not toml\n", "not valid TOML"),
    # issue 45: TOML reads nan and inf as floats; they were accepted (a NaN threshold never escalates)
    ("[cloud]\nescalation_threshold = nan\n", "cloud.escalation_threshold must be a finite number, got nan"),
    ("[cloud]\nread_timeout_s = inf\n", "cloud.read_timeout_s must be a finite number, got inf"),
    ("[cloud]\nconnect_timeout_s = -inf\n", "cloud.connect_timeout_s must be a finite number, got -inf"),
])
def test_every_settings_mistake_names_the_file(tmp_path, text, message):
    path = tmp_path / "settings.toml"
    path.write_text(text)
    with pytest.raises(SettingsError) as error:
        load_settings(path)
    assert str(error.value).startswith(f"settings file {path}: ") and message in str(error.value)
    assert "\n" not in str(error.value)


def test_settings_that_are_not_utf8_name_the_file(tmp_path):
    path = tmp_path / "settings.toml"
    path.write_bytes('model = "Caf\xe9"\n'.encode("cp1252"))
    with pytest.raises(SettingsError, match=f"settings file {path}: .*UTF-8"):
        load_settings(path)


HALAMAN = [str(Path(sys.executable).parent / "halaman")]
if not Path(HALAMAN[0]).exists():
    HALAMAN = [sys.executable, "-m", "engine.cli"]


@pytest.mark.parametrize("name", ["settings-bom.toml", "settings-unknown-key.toml"])
def test_b29_cache_list_reads_the_file_and_names_it_in_any_warning(corpus, tmp_path, name):
    home = tmp_path / "home"
    (home / "config").mkdir(parents=True)
    settings = home / "config" / "settings.toml"
    shutil.copyfile(b29(corpus, name), settings)
    out = subprocess.run([*HALAMAN, "cache", "list"], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "HALAMAN_HOME": str(home)})
    assert out.returncode == 0, out.stderr
    if name == "settings-bom.toml":
        assert "settings" not in out.stderr
    else:
        assert out.stderr == f"warning: settings file {settings}: unknown setting theme ignored\n"


def test_b29_the_app_names_the_file_and_the_key(corpus, tmp_path, monkeypatch, qtbot):
    pytest.importorskip("PySide6")
    from app.window import MainWindow

    monkeypatch.setenv("HALAMAN_HOME", str(tmp_path / "home"))
    settings = tmp_path / "home" / "config" / "settings.toml"
    settings.parent.mkdir(parents=True)
    shutil.copyfile(b29(corpus, "settings-unknown-key.toml"), settings)
    window = MainWindow(load_model=False)
    qtbot.addWidget(window)
    window.show()
    assert window.banner.kind == "warning"
    assert window.banner.text == f"settings file {settings}: unknown setting theme ignored"
    assert window.settings.max_new_tokens == 128
    window.close()
