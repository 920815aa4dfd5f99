"""`halaman ask --cloud` as a user runs it: a real process, the embedded model, a real HTTP server."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from cloud_server import PIECES, USAGE, CloudServer

REPO = Path(__file__).resolve().parent.parent
HALAMAN = [str(Path(sys.executable).parent / "halaman")]
if not Path(HALAMAN[0]).exists():
    HALAMAN = [sys.executable, "-m", "engine.cli"]
KEY = "sk-cli-91b2c3d4e5f60718293a4b5c6d7e8f90"
FAST = ("--max-new-tokens", "8", "--budget", "512", "--window", "128", "--no-prefix-cache")


def halaman(*args: str, key: str | None = KEY, home: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if home is not None:
        env["HALAMAN_HOME"] = str(home)
    env.pop("HALAMAN_CLOUD_API_KEY", None)
    if key:
        env["HALAMAN_CLOUD_API_KEY"] = key
    return subprocess.run([*HALAMAN, *args], capture_output=True, text=True, timeout=600, env=env, cwd=REPO,
                          stdin=subprocess.DEVNULL)


def test_ask_cloud_streams_an_escalated_answer_with_provenance(tmp_path):
    doc = tmp_path / "notes.md"
    doc.write_text("# Notes\n\nThe meeting is on Tuesday at 10 in room 4. The code word is PELICAN.\n")
    with CloudServer(expected_key=KEY) as server:
        out = halaman("ask", str(doc), "What is the code word?", "--cloud", "--cloud-url", server.base_url,
                      "--cloud-model", "ok", *FAST)
        requests = list(server.requests)
    assert out.returncode == 0, out.stderr
    local, _, cloud = out.stdout.partition("--- cloud answer (user asked (--cloud)) ---")
    assert "--- report ---" in local and "prefix cache    miss" in local  # the local answer came first
    answer, _, report = cloud.partition("--- cloud report ---")
    assert answer.strip() == "".join(PIECES)
    assert "source          cloud" in report and f"endpoint        {server.base_url}" in report
    assert "model           served-model" in report and "reason          user asked (--cloud)" in report
    assert f"usage           prompt {USAGE['prompt_tokens']} + completion {USAGE['completion_tokens']}" in report
    assert "stop: end" in report and "INCOMPLETE" not in report
    assert "--- cloud request ---" in out.stderr and "notes.md" in out.stderr  # the plan, shown before sending
    [request] = requests
    assert "PELICAN" in request["body"]["messages"][1]["content"]  # the document is quoted in the user turn
    assert request["body"]["max_tokens"] == 8  # --max-new-tokens reaches the cloud request too
    assert KEY not in out.stdout + out.stderr  # the key went to the server only


def test_cloud_auto_escalates_a_low_confidence_answer(tmp_path):
    """--cloud-auto with the threshold at 0 (every answer is below it): the reason is printed."""
    doc = tmp_path / "notes.md"
    doc.write_text("The meeting is on Tuesday.\n")
    home = tmp_path / "home"
    (home / "config").mkdir(parents=True)
    (home / "config" / "settings.toml").write_text("[cloud]\nescalation_threshold = 0.0\n")
    (home / "cache").symlink_to(Path(os.environ["HALAMAN_HOME"]) / "cache")  # the converted model, not a new one
    with CloudServer() as server:
        out = halaman("ask", str(doc), "When is the meeting?", "--cloud-auto", "--cloud-url", server.base_url,
                      "--cloud-model", "ok", *FAST, key=None, home=home)
    assert out.returncode == 0, out.stderr
    assert "--- cloud answer (low confidence: the local answer's mean log-probability is" in out.stdout
    assert "".join(PIECES) in out.stdout and "reason          low confidence" in out.stdout
    assert "Authorization" not in server.requests[0]["headers"]  # no key anywhere: none sent
