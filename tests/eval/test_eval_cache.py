"""The evaluation cache: one key per (weights, tokenizer, config, label, tasks, code)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from mage_rl.config import load_config
from mage_rl.eval.eval_cache import (
    EvalCache,
    cache_key,
    code_digest,
    key_material,
    weights_digest,
)
from mage_rl.graphs.rollouts import TaskInstance
from mage_rl.rl.baselines import _cache_identity

CONFIG = Path(__file__).parents[2] / "configs" / "rps_smollm2.yaml"
TASKS = [TaskInstance(1, "rock_paper_scissors:always_rock", 0), TaskInstance(2, "x", 0)]


def key(overrides: list[str] = (), **changes: object) -> str:
    dump = load_config(CONFIG, list(overrides)).model_dump(mode="json")
    parts = {"label": "untrained", "tasks": TASKS, "weights": "w", "tokenizer": "t", "code": "c"}
    parts.update(changes)
    return cache_key(key_material(dump, **parts))  # type: ignore[arg-type]


def test_the_same_config_and_inputs_give_the_same_key() -> None:
    assert key() == key()


@pytest.mark.parametrize(
    "override",
    [
        "env.population=rps:always_rock",
        "env.seat=second",
        "meta.episodes=4",
        "meta.layout=rerendered",
        "meta.prompt=standard",
        "policy.model=tiny",
        "policy.dtype=fp32",
        "policy.max_tokens=16",
        "policy.max_batch_size=8",
        "policy.explore=0.1",  # not read by evaluations, but the whole section is keyed
        "rollout.concurrency=8",
        "eval.tasks=30",
        "eval.seed=7",
        "eval.temperature=0.5",
        "eval.top_p=0.9",
        "eval.top_k=5",
        "eval.stratify=false",
        "eval.baseline_tasks=12",
    ],
)
def test_any_setting_that_reaches_the_evaluation_changes_the_key(override: str) -> None:
    assert key([override]) != key()


@pytest.mark.parametrize(
    "override",
    [
        "rollout.seed=1",
        "rollout.tasks=3",
        "learner.seed=1",
        "learner.lr=2.0e-5",
        "returns.reward_to_go=false",
        "train.iterations=3",
        "eval.cache=false",
        "eval.every=5",
        "eval.baselines=[]",
    ],
)
def test_settings_only_training_reads_keep_the_key(override: str) -> None:
    assert key([override]) == key()


@pytest.mark.parametrize(
    "change",
    [
        {"label": "reflexion"},
        {"tasks": TASKS[:1]},
        {"tasks": [TaskInstance(1, "rock_paper_scissors:always_paper", 0), TASKS[1]]},
        {"weights": "w2"},
        {"tokenizer": "t2"},
        {"code": "c2"},
    ],
)
def test_label_tasks_weights_tokenizer_and_code_change_the_key(change: dict) -> None:
    assert key(**change) != key()


def test_a_plugin_file_s_source_is_part_of_the_key(tmp_path: Path) -> None:
    plugin = tmp_path / "p.py"
    plugin.write_text("X = 1\n")
    dump = {"plugins": [str(plugin)]}
    first = key_material(dump, "untrained", TASKS, "w", "t", "c")
    plugin.write_text("X = 2\n")
    assert key_material(dump, "untrained", TASKS, "w", "t", "c") != first


def test_weights_digest_sees_one_changed_value_and_the_dtype() -> None:
    model = torch.nn.Linear(4, 3)
    before = weights_digest(model)
    with torch.no_grad():
        model.weight[1, 2] += 1e-3
    changed = weights_digest(model)
    assert changed != before
    assert weights_digest(model.to(torch.bfloat16)) != changed


def test_code_digest_sees_an_edited_source_file(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text("x = 1\n")
    first = code_digest(tmp_path / "pkg")
    assert code_digest(tmp_path / "pkg") == first
    (tmp_path / "pkg" / "a.py").write_text("x = 2\n")
    assert code_digest(tmp_path / "pkg") != first


def test_store_then_load_round_trips_and_a_broken_entry_is_a_miss(tmp_path: Path) -> None:
    from mage_rl.records import MetaEpisodeRecord

    cache = EvalCache(tmp_path)
    record = MetaEpisodeRecord(uid="u", rollout=0, env="e", seed=1, opponent="o", seat=0)
    assert cache.load("k1") is None
    cache.store("k1", {"label": "untrained"}, {"n": 1}, [record], 12.5, tmp_path)
    summary, records, entry = cache.load("k1")  # type: ignore[misc]
    assert summary == {"n": 1} and records[0].uid == "u"
    assert entry["seconds"] == 12.5 and entry["material"] == {"label": "untrained"}
    (tmp_path / "k1" / "summary.json").write_text("{not json")
    assert cache.load("k1") is None
    # An entry under another key's folder is not taken for it.
    (tmp_path / "k1" / "summary.json").write_text(json.dumps({"n": 1}))
    (tmp_path / "k2").mkdir()
    for name in ("summary.json", "records.jsonl", "entry.json"):
        (tmp_path / "k2" / name).write_bytes((tmp_path / "k1" / name).read_bytes())
    assert cache.load("k2") is None


def test_eval_cache_false_turns_the_cache_off() -> None:
    model = torch.nn.Linear(2, 2)
    tokenizer = SimpleNamespace(
        backend_tokenizer=None, get_vocab=lambda: {"a": 0}, chat_template="", all_special_tokens=[]
    )
    on = SimpleNamespace(cfg=load_config(CONFIG), engine=SimpleNamespace(model=model),
                         tokenizer=tokenizer)  # fmt: skip
    off = SimpleNamespace(**{**vars(on), "cfg": load_config(CONFIG, ["eval.cache=false"])})
    assert _cache_identity(on) is not None
    assert _cache_identity(off) is None
    # Weights outside this process (a vLLM server): no identity, no cache.
    remote = SimpleNamespace(**{**vars(on), "engine": SimpleNamespace()})
    assert _cache_identity(remote) is None
    # A language-model opponent, whose weights the key does not hold: no cache.
    kuhn = Path(__file__).parents[2] / "configs" / "kuhn_tiny.yaml"
    llm = load_config(kuhn, ["env.population=kuhn_poker:llm:tiny"])
    assert _cache_identity(SimpleNamespace(**{**vars(on), "cfg": llm})) is None
    assert _cache_identity(SimpleNamespace(**{**vars(on), "cfg": load_config(kuhn)})) is not None
