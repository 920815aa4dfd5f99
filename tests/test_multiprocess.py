"""Two Halaman processes at once (issue 22 item 8: the window and a `halaman ask`, a double
double-click) share one cache folder. Real child processes start the same step at the same moment
(each waits for a "go" file) and must both end up with a whole, unchanged result."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from hub_server import TINY_REPO, FakeHub, tiny_llama  # noqa: F401 - fixture

REPO = Path(__file__).resolve().parent.parent

CONVERT = r"""
import json, os, sys, time
from pathlib import Path
go, me, other = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
from engine.models.gguf_convert import converted_folder
from engine.models.source import default_gguf_path
gguf = default_gguf_path()
while not go.exists():
    time.sleep(0.01)
folder = converted_folder(gguf)
seen = os.stat(folder).st_ino
me.write_text(str(folder))
deadline = time.monotonic() + 600
while not other.exists() and time.monotonic() < deadline:  # the other one is done too
    time.sleep(0.05)
from transformers import AutoConfig, AutoTokenizer
AutoTokenizer.from_pretrained(folder)
AutoConfig.from_pretrained(folder)
print(json.dumps({"folder": str(folder), "inode_returned": seen, "inode_after_both": os.stat(folder).st_ino}))
"""

PULL = r"""
import json, sys, time
from pathlib import Path
go = Path(sys.argv[1])
from engine.models.download import pull
while not go.exists():
    time.sleep(0.01)
try:
    folder = pull(sys.argv[2])
    print(json.dumps({"ok": True, "folder": str(folder)}))
except Exception as exc:
    print(json.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}"}))
"""


def run_two(script: str, tmp_path: Path, env: dict[str, str], args) -> list[dict]:
    """Start two children of `script`, let them go at the same moment, return their JSON lines."""
    go = tmp_path / "go"
    env = dict(os.environ, PYTHONPATH=str(REPO), **env)
    children = [subprocess.Popen([sys.executable, "-c", script, str(go), *args(n)], env=env, cwd=tmp_path,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for n in range(2)]
    time.sleep(8.0)  # both past their imports (transformers, torch) and waiting for the go file
    go.touch()
    results = []
    for child in children:
        out, err = child.communicate(timeout=900)
        assert child.returncode == 0, err[-3000:]
        results.append({**json.loads(out.strip().splitlines()[-1]), "stderr": err})
    return results


def test_two_processes_converting_the_embedded_gguf_at_once_both_load_the_same_folder(tmp_path, monkeypatch):
    """Before the lock, both converted, and the second to finish deleted the folder the first was
    loading from and renamed its own copy into place (its inode changed under the first). A killed
    conversion's temporary folder is cleared by the next one."""
    home = tmp_path / "home"
    done = [tmp_path / "done-0", tmp_path / "done-1"]
    # what a first start killed while converting leaves: its temporary folder (removed by the next conversion)
    from engine.models import gguf_convert
    from engine.models.source import default_gguf_path, file_sha256

    monkeypatch.setenv("HALAMAN_HOME", str(home))
    target = gguf_convert._target(file_sha256(default_gguf_path()))
    leftover = target.with_name(f"{target.name}.999999.tmp")
    leftover.mkdir(parents=True)
    (leftover / "model.safetensors").write_bytes(b"half written")
    results = run_two(CONVERT, tmp_path, {"HALAMAN_HOME": str(home)},
                      lambda n: [str(done[n]), str(done[1 - n])])
    assert results[0]["folder"] == results[1]["folder"]
    inodes = {r["inode_returned"] for r in results} | {r["inode_after_both"] for r in results}
    assert len(inodes) == 1, results  # nobody replaced the folder another process had been given
    folder = Path(results[0]["folder"])
    assert [p.name for p in folder.parent.iterdir() if p.name.endswith(".tmp")] == []
    # transformers' own bars stay off the terminal (they cut through the CLI's progress line)
    assert all("de-quantizing" not in r["stderr"] and "Loading weights" not in r["stderr"] for r in results)


def test_two_processes_pulling_the_same_model_at_once_both_get_it_whole(tiny_llama, tmp_path):  # noqa: F811
    """Before the lock, both appended to the same .part file (it failed verification and was
    deleted) or renamed it from under each other (FileNotFoundError)."""
    hub = FakeHub({TINY_REPO: tiny_llama})
    hub.chunk_delay_s = 0.01  # ~2 s per weights file: the two transfers overlap
    try:
        results = run_two(PULL, tmp_path, {"HALAMAN_HOME": str(tmp_path / "home"), "HF_ENDPOINT": hub.url,
                                           "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "0"},
                          lambda n: [TINY_REPO])
    finally:
        hub.close()
    assert all(r["ok"] for r in results), results
    folder = Path(results[0]["folder"])
    for source in tiny_llama.iterdir():
        assert (folder / source.name).read_bytes() == source.read_bytes()
