"""backend: ray trains the tiny Kuhn config on a real local Ray with two rollout workers.

The tests that start Ray are long (about 30 s on two cores: Ray's processes, then two
worker processes that each import torch and transformers), so they are marked ``slow``:
CI runs them in its second step (``pytest -m slow``). The worker's own test runs in the
default set, in-process.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from mage_rl.cli import main
from mage_rl.cluster.ray_backend import RolloutWorker, vocab_digest
from mage_rl.config import TrainConfig, load_config
from mage_rl.graphs.rollouts import TaskInstance

ray = pytest.importorskip("ray", reason="the dev set-up installs ray (scripts/setup.sh dev)")

CONFIG = Path(__file__).parents[2] / "configs" / "kuhn_tiny.yaml"


def _metrics(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def local_ray():
    """A local Ray of two CPUs for this module."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def runs(tmp_path_factory, local_ray, kuhn_tiny_run: Path) -> tuple[Path, Path]:
    """The same config trained with backend ray (2 workers, one iteration) and backend
    local (the session's shared run, trained with these settings for two iterations).

    One iteration covers the whole path: the workers roll out with the first weights,
    the driver updates, and the evaluation runs on the workers with the updated ones."""
    root = tmp_path_factory.mktemp("runs")
    common = ["--set", "train.iterations=1", "--set", "eval.tasks=2", "--no-progress"]
    code = main(["train", str(CONFIG), "--backend", "ray", "--run-dir", str(root / "ray"),
                 "--set", "train.num_workers=2", *common])  # fmt: skip
    assert code == 0
    # An existing Ray instance is used and left running for its owner.
    assert ray.is_initialized()
    return root / "ray", kuhn_tiny_run


@pytest.mark.slow
def test_ray_backend_writes_the_local_backends_artifacts(runs: tuple[Path, Path]) -> None:
    ray_run, local_run = runs
    ray_lines, local_lines = _metrics(ray_run), _metrics(local_run)
    # One line per iteration, then the final evaluation's, as in the local run.
    assert [x["iteration"] for x in ray_lines] == [1, 1]
    # Same tags: the TensorBoard and JSONL formats match the local backend's.
    assert sorted(ray_lines[0]) == sorted(local_lines[0])
    assert sorted(ray_lines[-1]) == sorted(local_lines[-1])
    assert list((ray_run / "tb").glob("events.out.tfevents.*"))
    assert (ray_run / "eval" / "iter_000001.json").exists()
    saved = TrainConfig.model_validate(
        __import__("yaml").safe_load((ray_run / "config.yaml").read_text())
    )
    assert saved.train.backend == "ray" and saved.train.num_workers == 2


@pytest.mark.slow
def test_ray_backend_changed_the_weights(runs: tuple[Path, Path]) -> None:
    from mage_rl.policy.models import load_model

    initial, _ = load_model("tiny", dtype="fp32")
    trained = load_file(runs[0] / "checkpoints" / "iter_000001" / "model" / "model.safetensors")
    assert any(
        not torch.equal(v, trained[k]) for k, v in initial.state_dict().items() if k in trained
    )


def test_worker_plays_with_the_weights_it_was_sent() -> None:
    """The actor class itself, in-process: weights in, records out, tokenizer check."""
    cfg = load_config(CONFIG, ["rollout.concurrency=4"], TrainConfig)
    worker = RolloutWorker(cfg.model_dump(mode="json"), index=0)
    try:
        from mage_rl.policy.models import load_model

        other, tokenizer = load_model("tiny", dtype="fp32", seed=7)
        assert worker.vocab_digest() == vocab_digest(tokenizer)
        assert worker.set_weights(other.state_dict()) == 1
        first = next(iter(other.state_dict().values()))
        assert torch.equal(next(iter(worker.engine.model.state_dict().values())), first)
        records = worker.rollout([TaskInstance(seed=11, opponent="kuhn:aggressive", seat=0)], 2)
        assert [r.rollout for r in records] == [0, 1]
        assert all(t.response_ids and t.logprobs for r in records for t in r.turns)
    finally:
        worker.close()


@pytest.mark.slow
def test_graphs_drive_standin_engines_running_as_ray_actors(local_ray) -> None:
    """As on a cluster: engines are Ray actors and the policy awaits their ObjectRefs."""
    from mage_rl import runtime
    from mage_rl.cluster.standin import LocalVLLMEngine, sampling_params_namespace
    from mage_rl.cluster.vllm_policy import VLLMEnginePolicy
    from mage_rl.policy.models import load_model

    cfg = load_config(CONFIG, [], TrainConfig)
    _model, tokenizer = load_model("tiny", dtype="fp32")
    actor = ray.remote(num_cpus=0)(LocalVLLMEngine).remote(model="tiny", seed=3)
    try:
        policy = VLLMEnginePolicy(
            [actor], tokenizer, max_model_len=4096,
            sampling_params_factory=sampling_params_namespace,
        )  # fmt: skip
        llm = runtime.chat_model(policy, temperature=1.0, max_tokens=cfg.policy.max_tokens)
        tasks = [TaskInstance(seed=5, opponent="kuhn:conservative", seat=1)]
        records = runtime.run_rollouts(cfg, runtime.build_graph(cfg), llm, tasks, 2)
        turns = [t for r in records for t in r.turns]
        assert len(records) == 2 and turns
        assert all(len(t.logprobs) == len(t.response_ids) > 0 for t in turns)
        assert policy.calls == [len(turns)]
    finally:
        ray.kill(actor)
