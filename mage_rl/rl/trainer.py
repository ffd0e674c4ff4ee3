"""The MAGE training loop (``mage train``).

One iteration:

1. Draw B task instances (seed, opponent, seat) for this iteration; every seed derives
   from ``rollout.seed`` and the iteration, so a resumed run draws the same tasks.
2. Roll out G meta-episodes per task with the current weights (local batched engine).
3. Returns and advantages: SPEC §3-5 (``rl.returns``, ``rl.advantages``).
4. One PPO update over every turn (``rl.learner``), then push the new weights into the
   engine in memory.
5. Log to TensorBoard and ``metrics.jsonl``; checkpoint (HF format + optimizer + RNG);
   evaluate on fixed seeds every ``eval.every`` iterations and at the end.

A run folder holds ``config.yaml``, ``metrics.jsonl``, ``tb/``, ``checkpoints/iter_N/``
(``model/`` is a plain HF checkpoint with its tokenizer) and ``eval/iter_N.json``.
``--resume`` continues from the newest complete checkpoint; Ctrl-C saves one and exits.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

import torch
import yaml

from mage_rl.config import TrainConfig
from mage_rl.eval.metrics import summarize_records
from mage_rl.rl.advantages import compute_advantages
from mage_rl.rl.batching import samples_from_records
from mage_rl.rl.metrics_log import MetricsLogger, flatten_summary
from mage_rl.rl.records import MetaEpisodeRecord
from mage_rl.rl.rollout import write_jsonl

logger = logging.getLogger(__name__)

STATE_FILE = "trainer_state.json"


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest checkpoint whose trainer state was written (i.e. is complete)."""
    root = run_dir / "checkpoints"
    if not root.exists():
        return None
    done = [p for p in root.iterdir() if p.name.startswith("iter_") and (p / STATE_FILE).exists()]
    return max(done, key=lambda p: int(p.name.split("_")[1]), default=None)


class Trainer:
    """Runs MAGE training for one config.

    Args:
        cfg: The validated training config.
        run_dir: The run folder (created if missing).
        resume: Continue from the newest complete checkpoint in ``run_dir``.
        progress: Show a progress display on the terminal.
    """

    def __init__(
        self, cfg: TrainConfig, run_dir: str | Path, resume: bool = False, progress: bool = True
    ) -> None:
        from mage_rl import runtime
        from mage_rl.policy.models import load_model
        from mage_rl.rl.learner import Learner

        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.show_progress = progress
        checkpoint = latest_checkpoint(self.run_dir) if resume else None
        if resume and checkpoint is None:
            raise FileNotFoundError(f"--resume: no complete checkpoint in {self.run_dir}")
        if not resume and (self.run_dir / "metrics.jsonl").exists():
            raise FileExistsError(
                f"{self.run_dir} already holds a run; pass --resume to continue it or choose "
                "another train.run_name"
            )
        self.run_dir.mkdir(parents=True, exist_ok=True)
        _atomic_write(
            self.run_dir / "config.yaml",
            yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False),
        )

        # The learner keeps float32 master weights; the engine samples in policy.dtype.
        model, self.tokenizer = load_model(cfg.policy.model, dtype="fp32")
        self.learner = Learner(model, cfg.learner)
        engine_model, _ = load_model(cfg.policy.model, dtype=cfg.policy.dtype)
        self.engine = runtime.build_engine(cfg.policy, engine_model, self.tokenizer)
        # The recorded log-probs are exact old log-probs only when sampler and learner
        # compute in the same precision, i.e. both in fp32 (see docs/policy.md).
        mode = cfg.train.recompute_old_logprobs
        exact = (
            next(engine_model.parameters()).dtype == torch.float32
            and self.learner.autocast_dtype is None
        )
        self.recompute_old_logprobs = mode == "always" or (mode == "auto" and not exact)
        self.start_iteration = 0
        if checkpoint is not None:
            self.learner.load(checkpoint)
            state = json.loads((checkpoint / STATE_FILE).read_text())
            self.start_iteration = int(state["iteration"])
            logger.info("resumed from %s (iteration %d)", checkpoint, self.start_iteration)
        self.engine.update_weights(self.learner.state_dict_for_inference())
        self.graph = runtime.build_graph(cfg)
        self.train_llm = runtime.chat_model(
            self.engine,
            temperature=cfg.policy.temperature,
            top_p=cfg.policy.top_p,
            top_k=cfg.policy.top_k,
            max_tokens=cfg.policy.max_tokens,
        )
        self.eval_llm = runtime.chat_model(
            self.engine,
            temperature=cfg.eval.temperature,
            top_p=cfg.eval.top_p,
            top_k=cfg.eval.top_k,
            max_tokens=cfg.policy.max_tokens,
        )
        self.metrics = MetricsLogger(self.run_dir)
        self.iteration = self.start_iteration

    # -- one iteration -------------------------------------------------------------------

    def rollout(self, iteration: int, on_done: Any = None) -> list[MetaEpisodeRecord]:
        from mage_rl import runtime

        tasks, group_size = runtime.training_tasks(self.cfg, iteration)
        return runtime.run_rollouts(
            self.cfg, self.graph, self.train_llm, tasks, group_size, on_done
        )

    def learn(self, records: list[MetaEpisodeRecord]) -> dict[str, float]:
        advantages = compute_advantages(records, self.cfg.returns, self.cfg.advantages)
        samples = samples_from_records(records, advantages)
        if self.recompute_old_logprobs:
            fresh = self.learner.compute_logprobs(samples)
            samples = [s.with_old_logprobs(lp) for s, lp in zip(samples, fresh, strict=True)]
        stats = self.learner.update(samples)
        self.engine.update_weights(self.learner.state_dict_for_inference())
        return stats

    def evaluate(self, iteration: int) -> dict[str, Any]:
        """success@k and ev@k on the fixed evaluation seeds (one rollout per task)."""
        from mage_rl import runtime

        tasks = runtime.tasks_for(self.cfg, self.cfg.eval.tasks, self.cfg.eval.seed)
        records = runtime.run_rollouts(self.cfg, self.graph, self.eval_llm, tasks, 1)
        summary = summarize_records(records, self.cfg.meta.episodes)
        out = self.run_dir / "eval" / f"iter_{iteration:06d}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        _atomic_write(out, json.dumps(summary, indent=2))
        write_jsonl(records, out.with_suffix(".jsonl"))
        return summary

    def save(self, iteration: int) -> Path:
        path = self.run_dir / "checkpoints" / f"iter_{iteration:06d}"
        self.learner.save(path)
        # model/ is a complete HF model (merged with LoRA): servable as it is.
        self.tokenizer.save_pretrained(path / "model")
        _atomic_write(path / STATE_FILE, json.dumps({"iteration": iteration}))
        checkpoints = sorted(
            (p for p in path.parent.iterdir() if p.name.startswith("iter_")),
            key=lambda p: int(p.name.split("_")[1]),
        )
        for old in checkpoints[: -self.cfg.train.keep_checkpoints]:
            shutil.rmtree(old, ignore_errors=True)
        return path

    # -- the loop ------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        """Train until ``train.iterations``; returns paths and the last evaluation."""
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        cfg = self.cfg
        total = cfg.train.iterations
        per_iter = cfg.rollout.tasks * cfg.rollout.group_size
        last_saved = self.start_iteration
        last_eval: dict[str, Any] | None = None
        progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"),
            disable=not self.show_progress,
        )
        try:
            with progress:
                it_bar = progress.add_task(
                    "iterations", total=total, completed=self.start_iteration, info=""
                )
                ep_bar = progress.add_task("meta-episodes", total=per_iter, info="")
                for iteration in range(self.start_iteration, total):
                    progress.reset(ep_bar, total=per_iter)
                    t0 = time.perf_counter()
                    records = self.rollout(iteration, on_done=lambda _r: progress.advance(ep_bar))
                    t1 = time.perf_counter()
                    stats = self.learn(records)
                    t2 = time.perf_counter()
                    self.iteration = iteration + 1
                    scalars = self._scalars(records, stats, t1 - t0, t2 - t1)
                    if cfg.eval.tasks and cfg.eval.every and self.iteration % cfg.eval.every == 0:
                        last_eval = self.evaluate(self.iteration)
                        scalars.update(flatten_summary(last_eval, "eval"))
                    self.metrics.log(self.iteration, scalars)
                    if self.iteration % cfg.train.save_every == 0 or self.iteration == total:
                        self.save(self.iteration)
                        last_saved = self.iteration
                    info = (
                        f"success {scalars['charts/success@1']:.2f}→"
                        f"{scalars[f'charts/success@{cfg.meta.episodes}']:.2f} "
                        f"loss {stats['loss']:+.3f}"
                    )
                    progress.update(it_bar, advance=1, info=info)
            if cfg.eval.tasks and (
                last_eval is None or cfg.eval.every == 0 or total % cfg.eval.every
            ):
                last_eval = self.evaluate(self.iteration)
                self.metrics.log(self.iteration, flatten_summary(last_eval, "eval"))
        except KeyboardInterrupt:
            if self.iteration > last_saved:
                logger.warning("interrupted: saving iteration %d before exiting", self.iteration)
                self.save(self.iteration)
            raise
        finally:
            self.metrics.close()
            self.engine.close()
        checkpoint = latest_checkpoint(self.run_dir)
        return {
            "run_dir": str(self.run_dir),
            "checkpoint": str(checkpoint / "model") if checkpoint else None,
            "metrics": str(self.run_dir / "metrics.jsonl"),
            "tensorboard": str(self.run_dir / "tb"),
            "report": str(self.run_dir / "eval" / f"iter_{self.iteration:06d}.json")
            if last_eval
            else None,
            "eval": last_eval,
        }

    def _scalars(
        self,
        records: list[MetaEpisodeRecord],
        stats: dict[str, float],
        rollout_s: float,
        learn_s: float,
    ) -> dict[str, float]:
        scalars = flatten_summary(summarize_records(records, self.cfg.meta.episodes), "charts")
        for key in (
            "loss",
            "pg_loss",
            "kl",
            "entropy",
            "entropy_free",
            "entropy_coef",
            "clip_frac",
            "approx_kl",
            "grad_norm",
        ):
            if key in stats:
                scalars[f"losses/{key}"] = stats[key]
        turns = [t for r in records for t in r.turns]
        generated = sum(len(t.response_ids) for t in turns)
        scalars.update(
            {
                "charts/invalid_share": sum(t.invalid for t in turns) / max(1, len(turns)),
                "charts/response_tokens_mean": generated / max(1, len(turns)),
                "perf/rollout_s": rollout_s,
                "perf/learn_s": learn_s,
                "perf/rollout_share": rollout_s / max(1e-9, rollout_s + learn_s),
                "perf/rollout_tokens_per_s": generated / max(1e-9, rollout_s),
                "perf/learner_tokens_per_s": stats.get("tokens_per_s", 0.0),
            }
        )
        return scalars
