"""Every results file says what produced it: commit, versions, threads, CPU, command."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import torch

import mage_rl
from mage_rl.provenance import git_commit, provenance, write_results

CHECKOUT = Path(mage_rl.__file__).resolve().parents[1]


def test_results_are_stamped_and_written_atomically(tmp_path) -> None:
    path = tmp_path / "deep" / "result.json"
    doc = {"score": 0.5}
    assert write_results(path, doc, started=0.0, argv=["mage", "bench", "x"], note="n") == path
    saved = json.loads(path.read_text())
    assert saved["score"] == 0.5 and saved["provenance"] == doc["provenance"]
    stamp = saved["provenance"]
    assert stamp["torch_threads"] == torch.get_num_threads()
    assert stamp["versions"]["torch"] == torch.__version__
    assert stamp["versions"]["mage-rl"] is not None and "transformers" in stamp["versions"]
    assert stamp["command"] == "mage bench x" and stamp["note"] == "n"
    assert stamp["cpu_model"] and stamp["cpu_count"] >= 1
    assert stamp["started_at"].startswith("1970-01-01") and stamp["wall_seconds"] > 1e9
    assert [p.name for p in path.parent.iterdir()] == ["result.json"]  # no temp file left


def test_commit_of_this_checkout() -> None:
    head = subprocess.run(
        ["git", "-C", str(CHECKOUT), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    assert provenance()["commit"] == head
    assert git_commit()["dirty"] in (True, False)


def test_commit_is_unknown_outside_a_checkout(tmp_path) -> None:
    assert git_commit(tmp_path) == {"commit": "unknown", "dirty": None}
    # A folder inside some repository (an installed package in a project's virtual
    # environment) does not report that repository's commit.
    assert git_commit(CHECKOUT / "mage_rl")["commit"] == "unknown"


def test_the_commit_is_the_one_the_command_started_from(monkeypatch) -> None:
    import mage_rl.provenance as prov

    monkeypatch.setattr(prov, "_START_COMMIT", {"commit": "a" * 40, "dirty": False})
    stamp = provenance()
    assert stamp["commit"] == "a" * 40 and stamp["commit_at_write"] == git_commit()
    monkeypatch.setattr(prov, "_START_COMMIT", git_commit())
    assert "commit_at_write" not in provenance()
