"""The evaluations before training, kept on this machine and reused by later runs.

Before iteration 1 a run evaluates the untrained model and its baseline agents on fixed
tasks (:func:`mage_rl.rl.baselines.evaluate_baselines`). Those figures do not depend on
anything training does: another seed, a longer run or another learning rate computes the
same figures again. So each is kept under a key over everything that could change it:

1. the weights the engine plays with: the name, shape, dtype and bytes of every tensor
   of its model (so also the precision ``policy.dtype: auto`` chose on this CPU);
2. the tokenizer: its serialized vocabulary and merges, its chat template and special
   tokens;
3. the config without what only training reads: ``env``, ``meta``, ``policy``,
   ``plugins`` (and the source of every plugin file), ``rollout.concurrency`` (it shapes
   the engine's batches) and ``eval`` but for ``cache``, ``every``, ``before`` and
   ``baselines`` (each label is its own entry);
4. the agent's label and every evaluation task (seed, opponent, seat);
5. the code: a hash of every source file of the ``mage_rl`` package that runs, the
   versions of the libraries that change results, and torch's thread count.

Any change of any of them is another key, computed and stored afresh; nothing is shipped
precomputed; evaluations against a language-model opponent (``GAME:llm:...``, whose
weights are not in the key) and those whose weights are not in this process are never
cached. Entries live in ``$MAGE_RL_CACHE/eval/KEY/`` (``~/.cache/mage-rl`` by
default): ``summary.json``, ``records.jsonl`` and ``entry.json`` (what the key was made
of, when and in how many seconds the entry was computed). ``eval.cache: false`` turns the
cache off for a run (nothing is read or stored); deleting the folder empties it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from mage_rl.cache import cache_root
from mage_rl.graphs.rollouts import read_jsonl, write_jsonl
from mage_rl.plugins import ENV_VAR as PLUGINS_VAR
from mage_rl.provenance import package_versions

logger = logging.getLogger(__name__)

CACHE_DIR = "eval"
"""The cache's folder under :func:`~mage_rl.cache.cache_root`."""

TRAINING_ONLY = ("train", "learner", "returns", "advantages", "league", "openrlhf")
"""Config sections the evaluations before training never read."""

EVAL_KEYS_LEFT_OUT = ("cache", "every", "before", "baselines")
"""``eval`` keys that change no figure of one label's evaluation."""

LIBRARIES = ("torch", "transformers", "open_spiel", "langgraph", "langchain-core", "numpy")


def weights_digest(model: torch.nn.Module) -> str:
    """A hash over the name, shape, dtype and bytes of every tensor of ``model``."""
    digest = hashlib.blake2b(digest_size=20)
    for name, tensor in sorted(model.state_dict().items()):
        t = tensor.detach().to("cpu").contiguous()
        digest.update(f"{name}|{tuple(t.shape)}|{t.dtype}|".encode())
        digest.update(memoryview(t.view(torch.uint8).reshape(-1).numpy()))
    return digest.hexdigest()


def tokenizer_digest(tokenizer: Any) -> str:
    """A hash over a tokenizer's vocabulary and merges, chat template and special tokens."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    body = (
        backend.to_str()
        if backend is not None
        else json.dumps(sorted(tokenizer.get_vocab().items()))
    )
    extra = [type(tokenizer).__name__, getattr(tokenizer, "chat_template", None) or "",
             sorted(map(str, tokenizer.all_special_tokens))]  # fmt: skip
    return hashlib.blake2b((body + json.dumps(extra)).encode(), digest_size=20).hexdigest()


def code_digest(package: Path | None = None) -> str:
    """A hash over the path and content of every ``.py`` file of ``package`` (default:
    the ``mage_rl`` package that runs)."""
    root = package or Path(__file__).resolve().parents[1]
    digest = hashlib.blake2b(digest_size=20)
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _plugin_sources(specs: list[str]) -> dict[str, str | None]:
    """The content hash of each plugin's source file (``None`` when none is found)."""
    out: dict[str, str | None] = {}
    for spec in specs:
        path: Path | None = Path(spec) if spec.endswith(".py") else None
        if path is None:
            try:
                found = importlib.util.find_spec(spec)
            except (ImportError, ValueError):
                found = None
            path = Path(found.origin) if found is not None and found.origin else None
        out[spec] = (
            hashlib.blake2b(path.read_bytes(), digest_size=20).hexdigest()
            if path is not None and path.is_file()
            else None
        )
    return out


def evaluation_config(cfg_dump: dict[str, Any]) -> dict[str, Any]:
    """The part of a config (``TrainConfig.model_dump(mode="json")``) that can change an
    evaluation before training (see the module docstring, item 3)."""
    kept = {k: v for k, v in cfg_dump.items() if k not in (*TRAINING_ONLY, "rollout")}
    kept["rollout"] = {"concurrency": cfg_dump.get("rollout", {}).get("concurrency")}
    kept["eval"] = {
        k: v for k, v in cfg_dump.get("eval", {}).items() if k not in EVAL_KEYS_LEFT_OUT
    }
    return kept


def key_material(
    cfg_dump: dict[str, Any],
    label: str,
    tasks: list[Any],
    weights: str,
    tokenizer: str,
    code: str | None = None,
) -> dict[str, Any]:
    """Everything an evaluation's figures depend on (the module docstring's list)."""
    plugins = list(cfg_dump.get("plugins") or [])
    plugins += [p for p in os.environ.get(PLUGINS_VAR, "").split(os.pathsep) if p]
    return {
        "label": label,
        "config": evaluation_config(cfg_dump),
        "plugins": _plugin_sources(plugins),
        "tasks": [[t.seed, t.opponent, t.seat, t.draw] for t in tasks],
        "weights": weights,
        "tokenizer": tokenizer,
        "code": code if code is not None else code_digest(),
        "versions": package_versions(LIBRARIES),
        "torch_threads": torch.get_num_threads(),
    }


def cache_key(material: dict[str, Any]) -> str:
    """The key of an entry: a hash of its canonical JSON."""
    text = json.dumps(material, sort_keys=True, separators=(",", ":"))
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


class EvalCache:
    """Entries of :func:`cache_key` in ``root`` (default ``$MAGE_RL_CACHE/eval``)."""

    def __init__(self, root: str | Path | None = None) -> None:
        self.root = Path(root) if root is not None else cache_root() / CACHE_DIR

    def load(self, key: str) -> tuple[dict[str, Any], list[Any], dict[str, Any]] | None:
        """``(summary, records, entry)`` stored under ``key``, or ``None``; an entry that
        cannot be read counts as missing."""
        folder = self.root / key
        try:
            entry = json.loads((folder / "entry.json").read_text())
            summary = json.loads((folder / "summary.json").read_text())
            records = read_jsonl(folder / "records.jsonl")
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            logger.warning("evaluation cache: %s is unreadable (%s); computing it", folder, exc)
            return None
        if entry.get("key") != key:
            return None
        return summary, records, entry

    def store(
        self,
        key: str,
        material: dict[str, Any],
        summary: dict[str, Any],
        records: list[Any],
        seconds: float,
        run_dir: str | Path,
    ) -> Path | None:
        """Keep an evaluation under ``key``; the folder appears whole or not at all. A
        cache that cannot be written is a warning: the run goes on without it."""
        folder = self.root / key
        tmp: Path | None = None
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=self.root))
            entry = {
                "key": key,
                "computed_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "seconds": round(seconds, 2),
                "run_dir": str(Path(run_dir).resolve()),
                "material": material,
            }
            (tmp / "summary.json").write_text(json.dumps(summary))
            write_jsonl(records, tmp / "records.jsonl")
            (tmp / "entry.json").write_text(json.dumps(entry, indent=1))
            if folder.exists():  # another run stored it meanwhile: the same figures
                shutil.rmtree(tmp, ignore_errors=True)
                return folder
            os.replace(tmp, folder)
        except OSError as exc:
            logger.warning("evaluation cache: could not store %s (%s)", folder, exc)
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
            return None
        return folder
