"""``train.backend: openrlhf``: OpenRLHF's Ray PPO on GPUs with MAGE rollouts and credit.

OpenRLHF 0.11 provides the distributed machinery: a DeepSpeed actor group (ZeRO-sharded
policy and Adam), a reference group for the KL term, vLLM engines as Ray actors, and NCCL
(or CUDA-IPC) weight sync from the actor to the engines. Its own loop draws prompts from
a dataset, lets each engine run a single-sequence agent loop, groups rewards by position
and sums a trajectory's step rewards into one scalar. MAGE replaces the two ends:

1. **Rollout.** The driver runs MAGE's meta-episode graphs (LangGraph) as in the local
   trainer; every LLM call goes to a vLLM engine through
   :class:`~mage_rl.cluster.vllm_policy.VLLMEnginePolicy` and becomes one training
   sample. When the engines share the GPUs with DeepSpeed (``openrlhf.colocate_all``),
   they are woken before and put to sleep after the rollout, as OpenRLHF does.
2. **Credit.** Returns and opponent-grouped GiGPO advantages come from ``mage_rl.rl``
   (:func:`~mage_rl.cluster.experience.experiences_from_records`); OpenRLHF's
   ``RemoteExperienceMaker`` still scores the samples with the actor and reference groups,
   but its advantage step is replaced by
   :func:`~mage_rl.cluster.experience.keep_mage_advantages`.
3. **Update.** OpenRLHF's ``BasePPOTrainer.train_step`` unchanged: samples to the actor
   group's replay buffers, PPO-clip with the k3 KL loss and entropy bonus (DeepSpeed),
   weights broadcast to the vLLM engines.

Everything else is the local :class:`~mage_rl.rl.trainer.Trainer`: the same task draw,
metrics (``metrics.jsonl``, TensorBoard tags), periodic evaluation, the run folder and
``--resume``. Checkpoints are OpenRLHF's (DeepSpeed states under
``checkpoints/_actor/iter_NNNNNN`` and an HF copy ``checkpoints/iter_NNNNNN_hf``);
``checkpoints/iter_NNNNNN/model`` points at the HF copy, so every tool that reads a MAGE run
folder reads this one too. See docs/cluster.md.
"""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path
from typing import Any

from mage_rl.cluster.deps import require
from mage_rl.cluster.experience import experiences_from_records, keep_mage_advantages
from mage_rl.cluster.openrlhf_args import build_args
from mage_rl.cluster.vllm_policy import VLLMEnginePolicy
from mage_rl.fileio import atomic_write_json
from mage_rl.records import MetaEpisodeRecord
from mage_rl.rl.advantages import credit_parts
from mage_rl.rl.trainer import Trainer
from mage_rl.train_folder import (
    STATE_FILE,
    retire_checkpoints,
)

logger = logging.getLogger(__name__)

PURPOSE = "train.backend=openrlhf"
# A generous bound on LLM calls per meta-episode (K episodes of a few turns, reflections).
MAX_TURNS_BOUND = 64


def make_ppo_loop(
    strategy: Any, actor_group: Any, ref_group: Any, engines: list[Any], tokenizer: Any
) -> Any:
    """OpenRLHF's ``BasePPOTrainer`` with MAGE's advantage step in its experience maker."""
    base = require("openrlhf.trainer.ppo_trainer", PURPOSE).BasePPOTrainer
    maker = require("openrlhf.trainer.ppo_utils.experience_maker", PURPOSE).RemoteExperienceMaker

    class MageExperienceMaker(maker):  # type: ignore[misc, valid-type]
        """Scores samples with OpenRLHF's actor/reference groups; keeps MAGE advantages."""

        def compute_advantages_and_returns(self, experiences: list[Any]) -> list[Any]:
            return keep_mage_advantages(experiences)

    class MagePPOLoop(base):  # type: ignore[misc, valid-type]
        """OpenRLHF's PPO step (score, append, fit, broadcast) without its prompt loop."""

        def __init__(self) -> None:
            super().__init__(strategy, actor_group, None, None, ref_group, engines, tokenizer)
            self.experience_maker = MageExperienceMaker(
                actor_group, None, None, ref_group, self.kl_ctl, strategy, tokenizer
            )

    return MagePPOLoop()


def learner_stats(status: dict[str, Any], kl_coef: float, entropy_coef: float) -> dict[str, float]:
    """OpenRLHF's PPO status under the local learner's statistic names."""
    pg = float(status.get("policy_loss", 0.0))
    kl = float(status.get("kl", 0.0))
    entropy = float(status.get("entropy_loss", 0.0))
    stats = {
        "loss": pg + kl_coef * kl - entropy_coef * entropy,
        "pg_loss": pg,
        "kl": kl,
        "entropy": entropy,
        "clip_frac": float(status.get("ppo_clip_ratio", 0.0)),
        "approx_kl": float(status.get("ppo_kl", 0.0)),
        "grad_norm": float(status.get("actor_grad_norm", 0.0)),
    }
    train_s = float(status.get("timing/ppo_train", 0.0))
    tokens = float(status.get("rollout/num_samples", 0.0)) * float(
        status.get("rollout/response_length_mean", 0.0)
    )
    stats["tokens_per_s"] = tokens / train_s if train_s > 0 else 0.0
    return stats


class _Engines:
    """What the local trainer calls ``engine``: here only ``close()`` (Ray owns the engines)."""

    def close(self) -> None:
        return None


class OpenRLHFTrainer(Trainer):
    """MAGE training on OpenRLHF's DeepSpeed + vLLM Ray machinery (GPU clusters).

    Same arguments, run folder, metrics and ``--resume`` as the local trainer. Needs
    CUDA GPUs and the ``cluster`` extra; ``train.ray_address`` joins a running Ray
    cluster (``ray start --head`` on the head node, ``ray start --address`` on the
    others), otherwise Ray starts on this node.
    """

    def build_backend(self, checkpoint: Path | None) -> int:
        """The policy in OpenRLHF's actor group and vLLM engines instead of this process;
        ``checkpoint`` (found by the local trainer's rules) resumes OpenRLHF's own state."""
        ray = require("ray", PURPOSE)
        require("vllm", PURPOSE)
        require("deepspeed", PURPOSE)
        launcher = require("openrlhf.trainer.ray.launcher", PURPOSE)
        ppo_actor = require("openrlhf.trainer.ray.ppo_actor", PURPOSE)
        vllm_engine = require("openrlhf.trainer.ray.vllm_engine", PURPOSE)
        utils = require("openrlhf.utils", PURPOSE)

        cfg = self.cfg
        resume = checkpoint is not None
        self.args = args = build_args(cfg, self.run_dir, resume=resume)
        o = cfg.openrlhf

        self._ray = ray
        self._owns_ray = not ray.is_initialized()
        if self._owns_ray:
            ray.init(
                address=cfg.train.ray_address,
                runtime_env={
                    "env_vars": {
                        "TOKENIZERS_PARALLELISM": os.environ.get("TOKENIZERS_PARALLELISM", "true"),
                        "NCCL_DEBUG": os.environ.get("NCCL_DEBUG", "WARN"),
                    }
                },
            )
        strategy = utils.get_strategy(args)
        pg = None
        if o.colocate_all:
            from ray.util.placement_group import placement_group

            bundles = [{"GPU": 1, "CPU": 1} for _ in range(o.actor_nodes * o.actor_gpus_per_node)]
            pg = placement_group(bundles, strategy="PACK")
            ray.get(pg.ready())
        model = args.actor.model_name_or_path
        # processed_logprobs: the sampled token's log-prob after temperature, which is the
        # sampling distribution MAGE records (and OpenRLHF's IS correction reads).
        self.vllm_engines = vllm_engine.create_vllm_engines(
            o.vllm_engines,
            o.vllm_tensor_parallel,
            model,
            args.train.seed,
            args.train.full_determinism_enable,
            args.vllm.enable_prefix_caching,
            args.vllm.enforce_eager,
            o.max_len,
            pg,
            o.vllm_gpu_memory_utilization,
            args.vllm.enable_sleep,
            "processed_logprobs",
        )
        share = 0.2 if pg else 1
        self.actor_group = launcher.RayActorGroup(
            o.actor_nodes, o.actor_gpus_per_node, ppo_actor.PolicyModelActor,
            pg=pg, num_gpus_per_actor=share, duplicate_actors=1,
        )  # fmt: skip
        self.ref_group = None
        if cfg.learner.kl_coef > 0:
            self.ref_group = launcher.RayActorGroup(
                o.ref_nodes, o.ref_gpus_per_node, launcher.ReferenceModelActor,
                pg=pg, num_gpus_per_actor=share, duplicate_actors=1,
            )  # fmt: skip
        # The scheduler is constant; its length only has to cover every optimizer step.
        per_iter = math.ceil(
            cfg.rollout.tasks * cfg.rollout.group_size * MAX_TURNS_BOUND / args.train.batch_size
        )
        refs = self.actor_group.async_init_model_from_pretrained(
            strategy, model, cfg.train.iterations * per_iter, self.vllm_engines
        )
        if self.ref_group is not None:
            refs += self.ref_group.async_init_model_from_pretrained(strategy, model)
        ray.get(refs)

        self.tokenizer = utils.get_tokenizer(model, None, "left", strategy)
        self.policy = VLLMEnginePolicy(
            self.vllm_engines, self.tokenizer, max_model_len=o.max_len, name=str(model)
        )
        self.engine = _Engines()
        self.loop = make_ppo_loop(
            strategy, self.actor_group, self.ref_group, self.vllm_engines, self.tokenizer
        )
        self.recompute_old_logprobs = True  # OpenRLHF always rescores with the actor
        start = 0
        if resume:
            states = ray.get(self.actor_group.async_run_method("get_checkpoint_states"))[0]
            start = int(states.get("iteration", 0))
            if start:
                self.loop.broadcast_to_vllm()
            logger.info("resumed OpenRLHF state at iteration %d", start)
        self.global_step = start
        return start

    # -- vLLM engines asleep except while sampling (colocated mode) --------------------------

    def _engines(self, method: str) -> None:
        if self.args.vllm.enable_sleep:
            batch_call = require("openrlhf.trainer.ray.vllm_engine", PURPOSE).batch_vllm_engine_call
            batch_call(self.vllm_engines, method)

    def rollout(self, iteration: int, on_done: Any = None) -> list[MetaEpisodeRecord]:
        self._engines("wake_up")
        try:
            return super().rollout(iteration, on_done)
        finally:
            self._engines("sleep")

    def evaluate(self, iteration: int, on_done: Any = None) -> dict[str, Any]:
        self._engines("wake_up")
        try:
            return super().evaluate(iteration, on_done)
        finally:
            self._engines("sleep")

    # -- update and checkpoints --------------------------------------------------------------

    def learn(self, records: list[MetaEpisodeRecord]) -> dict[str, float]:
        # As the local trainer: the credit is kept for the metrics and the samples file.
        self.credit = credit_parts(records, self.cfg.returns, self.cfg.advantages)
        advantages = [[c.advantage for c in calls] for calls in self.credit]
        experiences = experiences_from_records(records, advantages=advantages)
        status, self.global_step = self.loop.train_step(experiences, self.global_step)
        return learner_stats(status, self.cfg.learner.kl_coef, self.cfg.learner.entropy_coef)

    def save(self, iteration: int) -> Path:
        tag = f"iter_{iteration:06d}"
        self._ray.get(
            self.actor_group.async_run_method(
                "save_checkpoint", tag=tag, client_states={"iteration": iteration}
            )
        )
        root = self.run_dir / "checkpoints"
        path = root / tag
        path.mkdir(parents=True, exist_ok=True)
        link = path / "model"
        if not link.exists():
            os.symlink(Path("..") / f"{tag}_hf", link)
        atomic_write_json(path / STATE_FILE, {"iteration": iteration})
        retire_checkpoints(root, iteration, self.cfg.train.keep_checkpoints, companions=("_hf",))
        return path

    def run(self) -> dict[str, Any]:
        """:meth:`Trainer.run`, then Ray is shut down if this trainer started it."""
        try:
            return super().run()
        finally:
            if self._owns_ray and self._ray.is_initialized():
                self._ray.shutdown()
