"""A backend is the local trainer with one method replaced: ``Trainer.build_backend``.

The cluster backends sample elsewhere (vLLM engines as Ray actors) and update elsewhere
(OpenRLHF's actor group); everything else, the task draw, the credit, the run folder, the
metrics and ``--resume``, is the local trainer's. This backend keeps the local learner but
samples through :class:`VLLMEnginePolicy` and a stand-in engine that follows vLLM's
token-level contract, the way the OpenRLHF backend's rollouts do on GPUs.
"""

from __future__ import annotations

import json
from pathlib import Path

from mage_rl.cluster.standin import LocalVLLMEngine, sampling_params_namespace
from mage_rl.cluster.vllm_policy import VLLMEnginePolicy
from mage_rl.config import TrainConfig, load_config
from mage_rl.rl.trainer import Trainer

from .conftest import CONFIG


class StandInBackend(Trainer):
    built: list[Path | None] = []

    def build_backend(self, checkpoint: Path | None) -> int:
        start = super().build_backend(checkpoint)
        self.standin = LocalVLLMEngine(self.engine)
        self.policy = VLLMEnginePolicy(
            [self.standin], self.tokenizer, max_model_len=4096,
            sampling_params_factory=sampling_params_namespace, name="standin",
        )  # fmt: skip
        StandInBackend.built.append(checkpoint)
        return start


def test_a_backend_replaces_only_build_backend(tmp_path: Path) -> None:
    overrides = ["train.iterations=2", "rollout.tasks=2", "rollout.group_size=2", "eval.tasks=0"]
    cfg = load_config(CONFIG, overrides, TrainConfig)
    run = tmp_path / "run"
    trainer = StandInBackend(cfg, run, progress=False)
    trainer.run()
    assert trainer.standin.requests > 0  # the rollouts sampled through the vLLM contract
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [1, 2]
    assert (run / "checkpoints" / "iter_000002" / "model").is_dir()
    first = StandInBackend.built[-1]
    assert first is None
    # --resume hands the newest checkpoint to the backend, which starts after it.
    longer = load_config(CONFIG, [*overrides[1:], "train.iterations=3"], TrainConfig)
    resumed = StandInBackend(longer, run, resume=True, progress=False)
    assert StandInBackend.built[-1] == run / "checkpoints" / "iter_000002"
    assert resumed.start_iteration == 2
    resumed.run()
    assert resumed.standin.requests > 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [1, 2, 3]
