"""``train.backend: ray``: rollout workers as Ray actors, the learner on the driver.

For machines (or clusters) without GPUs, where one process cannot keep every core busy:
the rollout of a batch is split across workers, each a Ray actor with its own
:class:`~mage_rl.policy.engine.LocalEngine`, graph and chat model, while the driver keeps
the learner, the evaluation, the checkpoints and the logs of the single-process
:class:`~mage_rl.rl.trainer.Trainer`, whose methods it reuses.

One iteration:

1. The driver draws the B task instances exactly as the local trainer does (same seeds),
   and deals them round-robin to the workers; all G rollouts of a task stay on one
   worker, so a GiGPO group shares one engine.
2. Each worker plays its share (its own batched engine, ``rollout.concurrency``
   meta-episodes at a time) and returns the records.
3. The driver computes returns and advantages and runs the PPO update
   (``Trainer.learn``), then puts the new weights in the Ray object store once and every
   worker loads them before the next iteration, so every rollout is on-policy.

``ray.init`` is local by default (``train.ray_address: null``); ``train.ray_address``
joins an existing cluster (every node needs mage-rl installed). If Ray is already
initialised (a notebook, a test), the backend uses that instance and leaves it running.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import time
from pathlib import Path
from typing import Any

from mage_rl import runtime
from mage_rl.cluster.deps import require
from mage_rl.config import TrainConfig
from mage_rl.graphs.rollouts import TaskInstance
from mage_rl.policy.engine import LocalEngine
from mage_rl.policy.models import load_model
from mage_rl.records import MetaEpisodeRecord
from mage_rl.rl.trainer import Trainer

logger = logging.getLogger(__name__)


def vocab_digest(tokenizer: Any) -> str:
    """A short hash of a tokenizer's vocabulary: workers must tokenize as the driver does."""
    vocab = sorted(tokenizer.get_vocab().items())
    return hashlib.sha256(json.dumps(vocab).encode()).hexdigest()[:16]


class RolloutWorker:
    """One rollout worker: a local engine, the agent graph and its chat model.

    A plain class, so it can be tested without Ray; :class:`RayTrainer` runs it as a Ray
    actor with ``ray.remote(num_cpus=1)(RolloutWorker)``.

    Args:
        cfg: The training config as a plain dict (``TrainConfig.model_dump()``).
        index: Worker number; seeds the engine's sampling stream.
        torch_threads: Intra-op threads of this worker (one per CPU it was given).
    """

    def __init__(self, cfg: dict[str, Any], index: int, torch_threads: int = 1) -> None:
        import torch

        torch.set_num_threads(torch_threads)
        self.cfg = TrainConfig.model_validate(cfg)
        self.index = index
        model, self.tokenizer = load_model(self.cfg.policy.model, dtype=self.cfg.policy.dtype)
        self.engine = LocalEngine(
            model,
            self.tokenizer,
            max_batch_size=self.cfg.policy.max_batch_size,
            seed=self.cfg.rollout.seed * 1_000_003 + index + 1,
            name=f"{self.cfg.policy.model}#{index}",
        )
        self.graph = runtime.build_graph(self.cfg)
        self.llm = runtime.rollout_chat_model(self.cfg, self.engine)

    def vocab_digest(self) -> str:
        """See :func:`vocab_digest`."""
        return vocab_digest(self.tokenizer)

    def set_weights(self, state_dict: dict[str, Any]) -> int:
        """Load the learner's newest weights; returns the engine's weight version."""
        self.engine.update_weights(state_dict)
        return self.engine.weight_version

    def rollout(self, tasks: list[TaskInstance], group_size: int) -> list[MetaEpisodeRecord]:
        """Play ``len(tasks) x group_size`` meta-episodes with the current weights."""
        return runtime.run_rollouts(self.cfg, self.graph, self.llm, tasks, group_size)

    def close(self) -> None:
        """Stop the engine's worker thread."""
        self.engine.close()


class RayTrainer(Trainer):
    """:class:`~mage_rl.rl.trainer.Trainer` whose rollouts run on Ray actors.

    Same arguments, run folder, metrics, checkpoints and resume as the local trainer;
    ``train.num_workers`` actors of one CPU each, on ``train.ray_address`` or a local Ray.
    """

    def __init__(
        self,
        cfg: TrainConfig,
        run_dir: str | Path,
        resume: bool = False,
        progress: bool = True,
        started: float | None = None,
    ) -> None:
        ray = require("ray", "train.backend=ray")
        super().__init__(cfg, run_dir, resume=resume, progress=progress, started=started)
        self._ray = ray
        self._owns_ray = not ray.is_initialized()
        if self._owns_ray:
            address = cfg.train.ray_address
            ray.init(address=address, ignore_reinit_error=True)
            logger.info("ray started (%s)", address or "local")
        available = ray.cluster_resources().get("CPU", 0)
        if available < cfg.train.num_workers:
            logger.warning(
                "Ray has %s CPUs for %d workers of one CPU each; some will wait for a CPU "
                "(lower train.num_workers)",
                available,
                cfg.train.num_workers,
            )
        actor_cls = ray.remote(num_cpus=1)(RolloutWorker)
        payload = cfg.model_dump(mode="json")
        self.workers = [actor_cls.remote(payload, i) for i in range(cfg.train.num_workers)]
        try:
            digests = ray.get([w.vocab_digest.remote() for w in self.workers])
            mine = vocab_digest(self.tokenizer)
            if any(d != mine for d in digests):
                raise RuntimeError(
                    f"rollout workers load a tokenizer that differs from the driver's "
                    f"({digests} vs {mine}); point policy.model at the same checkpoint on "
                    "every node"
                )
            self.broadcast_weights()
        except BaseException:
            self.shutdown()
            raise

    # -- the two seams of Trainer ----------------------------------------------------------

    def rollout(self, iteration: int, on_done: Any = None) -> list[MetaEpisodeRecord]:
        """The local trainer's task draw, played by the workers (round-robin by task)."""
        ray = self._ray
        tasks, group_size = runtime.training_tasks(self.batch_config(), iteration)
        n = len(self.workers)
        shares = [tasks[i::n] for i in range(n)]
        pending = {
            w.rollout.remote(share, group_size): i
            for i, (w, share) in enumerate(zip(self.workers, shares, strict=True))
            if share
        }
        results: dict[int, list[MetaEpisodeRecord]] = {}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            index = pending.pop(done[0])
            results[index] = ray.get(done[0])
            if on_done:
                for record in results[index]:
                    on_done(record)
        # Back to the draw order (task, rollout), as the local trainer returns them.
        order = {(t.seed, t.opponent, t.seat): k for k, t in enumerate(tasks)}
        records = [r for i in sorted(results) for r in results[i]]
        return sorted(records, key=lambda r: (order[(r.seed, r.opponent, r.seat)], r.rollout))

    def learn(self, records: list[MetaEpisodeRecord]) -> dict[str, float]:
        """The local update, then the new weights go to every worker."""
        stats = super().learn(records)
        self.broadcast_weights()
        return stats

    # -- workers -----------------------------------------------------------------------------

    def broadcast_weights(self) -> None:
        """Put the learner's weights in the object store once; every worker loads them."""
        start = time.perf_counter()
        ref = self._ray.put(self.learner.state_dict_for_inference())
        versions = self._ray.get([w.set_weights.remote(ref) for w in self.workers])
        logger.info(
            "weights sent to %d workers in %.2fs (versions %s)",
            len(self.workers),
            time.perf_counter() - start,
            versions,
        )

    def shutdown(self) -> None:
        """Stop the workers, and Ray itself if this trainer started it."""
        for worker in getattr(self, "workers", []):
            # A worker that died needs no closing.
            with contextlib.suppress(Exception):
                self._ray.get(worker.close.remote(), timeout=30)
            self._ray.kill(worker)
        self.workers = []
        if self._owns_ray and self._ray.is_initialized():
            self._ray.shutdown()

    def run(self) -> dict[str, Any]:
        """:meth:`Trainer.run`, then the workers are stopped (also on errors and Ctrl-C)."""
        try:
            return super().run()
        finally:
            self.shutdown()
