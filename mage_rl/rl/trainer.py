"""The MAGE training loop (``mage train``).

One iteration:

1. Draw B task instances (seed, opponent, seat) for this iteration; every seed derives
   from ``rollout.seed`` and the iteration, so a resumed run draws the same tasks.
2. Roll out G meta-episodes per task with the current weights (local batched engine).
3. Returns and advantages: SPEC §3-5 (``rl.returns``, ``rl.advantages``).
4. One PPO update over every turn (``rl.learner``), then push the new weights into the
   engine in memory.
5. Evaluate on fixed seeds every ``eval.every`` iterations (and at the end); log to
   TensorBoard and ``metrics.jsonl`` (with the credit of each graph node's calls,
   ``nodes/<node>/...``); every ``train.save_samples`` iterations write the batch's calls
   with their credit (:mod:`mage_rl.rl.samples`); then checkpoint (HF format + optimizer
   + RNG).

A run folder holds ``config.yaml``, ``metrics.jsonl``, ``tb/``,
``checkpoints/iter_NNNNNN/`` (``model/`` is a plain HF checkpoint with its tokenizer),
``eval/iter_NNNNNN.json`` and ``samples/iter_NNNNNN.jsonl.gz``. Nothing is written into
it before the config, the tasks and the model have all loaded. ``--resume`` continues
from the newest complete checkpoint, cutting what the stopped run logged after it;
Ctrl-C saves one and exits. A write into the folder that fails (a full disk) stops the
run with a :class:`~mage_rl.fileio.WriteError` naming the file, after removing the
half-written checkpoint; the checkpoints before it are complete, so the run resumes from
the newest once there is space. The rules of the folder's life cycle are in
:mod:`mage_rl.train_folder`.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from mage_rl import runtime
from mage_rl.config import TrainConfig
from mage_rl.envs import make_env, resolve_seat
from mage_rl.eval.metrics import summarize_records
from mage_rl.eval.training import eval_tasks, summarize_eval, write_eval
from mage_rl.eval.training_report import write_training_report
from mage_rl.fileio import atomic_write_json, writing
from mage_rl.memory import release_free_memory
from mage_rl.policy.models import load_model
from mage_rl.records import MetaEpisodeRecord
from mage_rl.rl.advantages import CallCredit, credit_parts
from mage_rl.rl.baselines import evaluate_baselines
from mage_rl.rl.batching import TrainingSample, samples_from_records
from mage_rl.rl.league import League
from mage_rl.rl.learner import Learner, OldLogprobs
from mage_rl.rl.metrics_log import MetricsLogger, flatten_summary, node_metrics
from mage_rl.rl.phases import (
    EVAL_AFTER,
    EVAL_DURING,
    LEARNER,
    PHASES_FILE,
    REPORT,
    ROLLOUTS,
    SAVING,
    SETUP,
    RunClock,
    resident_mb,
)
from mage_rl.rl.samples import SAMPLES_DIR, prune_samples, sample_path, samples_due, write_samples
from mage_rl.rl.selfplay import SelfPlay, plays_self, seat_records
from mage_rl.train_folder import (
    STATE_FILE,
    check_resume_config,
    checkpoint_name,
    clear_retired,
    latest_checkpoint,
    retire_checkpoints,
    start_checkpoint,
    write_run_config,
)

logger = logging.getLogger(__name__)

__all__ = ["STATE_FILE", "Trainer", "check_tasks", "latest_checkpoint"]


def check_tasks(cfg: TrainConfig) -> None:
    """Draw the first training and evaluation tasks and reset one environment of each.

    Seats, opponent specs and environment settings are read only when tasks are drawn,
    so this finds their errors before a run folder is made.

    Raises:
        ValueError: What is wrong, naming the config key.
    """
    try:
        resolve_seat(cfg.env.seat, 0)
    except ValueError as exc:
        raise ValueError(cfg.locate("env.seat", f"env.seat={cfg.env.seat!r}: {exc}")) from None
    tasks, _ = runtime.training_tasks(cfg, 0)
    if cfg.eval.tasks:
        tasks += runtime.tasks_for(cfg, 1, cfg.eval.seed)
    for task in tasks[:1] + tasks[-1:]:
        env = make_env(cfg.env.name, task.opponent, seat=task.seat, max_turns=cfg.env.max_turns)
        env.reset(task.seed)


class TrainingBars:
    """The progress display of a run: iterations, and the meta-episodes of the phase in
    progress (an iteration's rollouts or an evaluation's tasks).

    Args:
        show: Draw on the terminal; otherwise every call does nothing visible.
        iterations: ``train.iterations``.
        per_iteration: Meta-episodes an iteration plays.
        done: Iterations already done (a resumed run).
        eval_tasks: The number of evaluation tasks, asked when an evaluation starts.
    """

    def __init__(self, show: bool, iterations: int, per_iteration: int, done: int,
                 eval_tasks: Any) -> None:  # fmt: skip
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        self.progress = Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"), disable=not show,
        )  # fmt: skip
        self.per_iteration = per_iteration
        self._eval_tasks = eval_tasks
        self._iterations = self.progress.add_task(
            "iterations", total=iterations, completed=done, info=""
        )
        self._episodes = self.progress.add_task("meta-episodes", total=per_iteration, info="")

    def __enter__(self) -> TrainingBars:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.__exit__(*exc)

    def meta_episodes(self) -> None:
        """An iteration's rollouts begin."""
        self.progress.reset(self._episodes, total=self.per_iteration, description="meta-episodes")

    def advance(self, _record: Any = None) -> None:
        """One meta-episode is done (an ``on_done`` callback)."""
        self.progress.advance(self._episodes)

    def evaluation(self, label: str, tasks: int | None = None) -> Any:
        """An evaluation of ``label`` begins; returns its ``on_done`` callback."""
        total = self._eval_tasks() if tasks is None else tasks
        self.progress.reset(self._episodes, total=total, description=f"eval: {label}")
        return self.advance

    def iteration_done(self, info: str) -> None:
        self.progress.update(self._iterations, advance=1, info=info)


class Trainer:
    """Runs MAGE training for one config.

    Args:
        cfg: The validated training config.
        run_dir: The run folder (created if missing).
        resume: Continue from the newest complete checkpoint in ``run_dir``.
        progress: Show a progress display on the terminal.
        started: ``time.time()`` when the command began, where set-up starts (default:
            now).
    """

    def __init__(
        self,
        cfg: TrainConfig,
        run_dir: str | Path,
        resume: bool = False,
        progress: bool = True,
        started: float | None = None,
    ) -> None:
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.show_progress = progress
        self._started = time.time()
        # Everything that can fail on a user's config runs before the folder is touched,
        # so a refused start leaves nothing behind that would block the next one.
        checkpoint = start_checkpoint(self.run_dir, resume)
        if checkpoint is not None:
            check_resume_config(self.run_dir, cfg.model_dump(mode="json"), checkpoint)
        check_tasks(cfg)
        self.self_play: SelfPlay | None = None
        self.start_iteration = self.build_backend(checkpoint)
        if plays_self(cfg):
            if self.self_play is None:
                raise ValueError(
                    f"{type(self).__name__} cannot play {cfg.env.name}:self: self-play reads "
                    "the current policy from the engine's model, which only the local backend "
                    "holds in this process (train with --backend local)"
                )
            self.self_play.install()
        self.league = (
            League(self.run_dir, cfg.env.name, cfg.league, self.start_iteration)
            if cfg.league.every
            else None
        )
        self.graph = runtime.build_graph(cfg)
        self.train_llm = runtime.rollout_chat_model(cfg, self.policy)
        self.eval_llm = runtime.eval_chat_model(cfg, self.policy)
        self.iteration = self.start_iteration
        self._eval_design: tuple[list[Any], Any] | None = None
        self.trained: list[MetaEpisodeRecord] = []
        self.credit: list[list[CallCredit]] = []
        with writing(self.run_dir):
            self.run_dir.mkdir(parents=True, exist_ok=True)
            clear_retired(self.run_dir / "checkpoints")
            write_run_config(self.run_dir, cfg.model_dump(mode="json"))
            self.metrics = MetricsLogger(self.run_dir, self.start_iteration)
        began = min(started or self._started, self._started)
        self.clock = RunClock(self.run_dir, began, self.start_iteration, cfg.train.iterations)
        self.clock.add(SETUP, time.time() - began)

    def build_backend(self, checkpoint: Path | None) -> int:
        """Load the policy and its learner; return the iteration to start from.

        The one seam where a backend differs (``mage_rl.cluster``): it sets ``policy``
        (what the chat models sample from), ``engine`` (closed when the run ends) and
        ``tokenizer``, restores ``checkpoint`` (None: a fresh start) and returns its
        iteration. The local trainer: a float32 learner and a batched engine in
        ``policy.dtype``, in this process.
        """
        cfg = self.cfg
        model, self.tokenizer = load_model(cfg.policy.model, dtype="fp32")
        self.learner = Learner(model, cfg.learner)
        engine_model, _ = load_model(cfg.policy.model, dtype=cfg.policy.dtype)
        self.engine = self.policy = runtime.build_engine(cfg.policy, engine_model, self.tokenizer)
        self.self_play = SelfPlay(cfg, engine_model, self.tokenizer)
        # The recorded log-probs are exact old log-probs only when sampler and learner
        # compute in the same precision, i.e. both in fp32 (see docs/policy.md).
        mode = cfg.train.recompute_old_logprobs
        exact = (
            next(engine_model.parameters()).dtype == torch.float32
            and self.learner.autocast_dtype is None
        )
        self.recompute_old_logprobs = mode == "always" or (mode == "auto" and not exact)
        start = 0
        if checkpoint is not None:
            self.learner.load(checkpoint)
            start = int(json.loads((checkpoint / STATE_FILE).read_text())["iteration"])
            logger.info("resumed from %s (iteration %d)", checkpoint, start)
        self.engine.update_weights(self.learner.state_dict_for_inference())
        window = getattr(engine_model.config, "max_position_embeddings", None)
        if window:
            runtime.check_conversation_budget(cfg, self.tokenizer, int(window))
        return start

    # -- one iteration -------------------------------------------------------------------

    def rollout(self, iteration: int, on_done: Any = None) -> list[MetaEpisodeRecord]:
        tasks, group_size = runtime.training_tasks(self.batch_config(), iteration)
        return runtime.run_rollouts(
            self.cfg, self.graph, self.train_llm, tasks, group_size, on_done
        )

    def batch_config(self) -> TrainConfig:
        """The config training batches draw their opponents from: with a league, its
        members join the population (:mod:`mage_rl.rl.league`)."""
        if self.league is None or not self.league.members:
            return self.cfg
        text = self.league.population(runtime.population(self.cfg))
        return self.cfg.model_copy(
            update={"env": self.cfg.env.model_copy(update={"population": text})}
        )

    def samples(self, records: list[MetaEpisodeRecord]) -> list[TrainingSample]:
        """The learner's samples of an iteration's records, each call with its credit."""
        # With self-play the opponent's calls are samples of their own seat's records.
        trained = list(records) + seat_records(records)
        # Kept for the iteration's metrics and samples file: the credit of every call.
        self.trained, self.credit = (
            trained,
            credit_parts(trained, self.cfg.returns, self.cfg.advantages),
        )
        advantages = [[c.advantage for c in calls] for calls in self.credit]
        return samples_from_records(trained, advantages)

    def learn(self, records: list[MetaEpisodeRecord]) -> dict[str, float]:
        stats = self.learner.update(
            self.samples(records), old_logprobs=self.old_logprobs, explore=self.cfg.policy.explore
        )
        self.engine.update_weights(self.learner.state_dict_for_inference())
        if self.self_play is not None:
            self.self_play.forget()
        return stats

    @property
    def old_logprobs(self) -> OldLogprobs:
        """``Learner.update``'s ``old_logprobs``: rescored when the engine's numerics
        differ from the learner's (``learner.recompute_old_logprobs``), else recorded."""
        return "rescored" if self.recompute_old_logprobs else "recorded"

    def evaluate(self, iteration: int, on_done: Any = None) -> dict[str, Any]:
        """success@k and ev@k on the fixed evaluation seeds (one rollout per task)."""
        tasks, design = self.eval_design
        records = runtime.run_rollouts(self.cfg, self.graph, self.eval_llm, tasks, 1, on_done)
        summary = summarize_eval(records, self.cfg, design)
        write_eval(self.run_dir, checkpoint_name(iteration), summary, records)
        return summary

    @property
    def eval_design(self) -> tuple[list[Any], Any]:
        """The evaluation tasks (the same for every evaluation of the run), built once."""
        if self._eval_design is None:
            self._eval_design = eval_tasks(self.cfg)
        return self._eval_design

    def save(self, iteration: int) -> Path:
        """Write the checkpoint of ``iteration``, then retire older ones.

        Raises:
            WriteError: A write failed (the disk is full, ...); the incomplete checkpoint
                is removed and the complete ones before it are kept.
        """
        path = self.run_dir / "checkpoints" / checkpoint_name(iteration)
        with writing(path):
            try:
                self.learner.save(path)
                # model/ is a complete HF model (merged with LoRA): servable as it is.
                self.tokenizer.save_pretrained(path / "model")
                # Written last: its presence is what makes the checkpoint complete.
                atomic_write_json(path / STATE_FILE, {"iteration": iteration})
            except Exception:
                if not (path / STATE_FILE).exists():  # incomplete: its space back
                    shutil.rmtree(path, ignore_errors=True)
                raise
            retire_checkpoints(path.parent, iteration, self.cfg.train.keep_checkpoints)
        return path

    def save_samples(self, iteration: int) -> Path:
        """Write ``samples/iter_NNNNNN.jsonl.gz``: the records of the last :meth:`learn`
        (the seat records of self-play after the batch's) with their credit
        (:mod:`mage_rl.rl.samples`).

        Raises:
            WriteError: A write failed (the disk is full, ...); the file is not replaced.
        """
        path = sample_path(self.run_dir, iteration)
        with writing(path):
            write_samples(
                self.run_dir, iteration, self.trained, self.credit, self.tokenizer, self._started
            )
        return path

    def save_phases(self) -> None:
        """Write ``phases.json``: the phase table so far (:mod:`mage_rl.rl.phases`)."""
        with writing(self.run_dir / PHASES_FILE):
            self.clock.save()

    def log(self, iteration: int, scalars: dict[str, float]) -> None:
        """Log one iteration's scalars (``metrics.jsonl`` and TensorBoard)."""
        with writing(self.run_dir / "metrics.jsonl"):
            self.metrics.log(iteration, scalars)

    # -- the loop ------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        """Train until ``train.iterations``; returns paths and the last evaluation.

        The untrained graph and the baselines are evaluated before the first iteration,
        each iteration is one :meth:`step`, and the trained graph is evaluated after the
        last (unless an evaluation during training already fell on it). Ctrl-C saves the
        iteration reached; the engine and the metrics are closed whatever happens.
        """
        cfg = self.cfg
        self.last_saved = self.start_iteration
        self.last_eval = self._logged_final_eval()
        evaluated_after = self.last_eval is not None
        finished = False
        bars = TrainingBars(
            self.show_progress, cfg.train.iterations, cfg.rollout.tasks * cfg.rollout.group_size,
            self.start_iteration, lambda: len(self.eval_design[0]),
        )  # fmt: skip
        try:
            # Iterations after the checkpoint are played again, their samples with them.
            with writing(self.run_dir / SAMPLES_DIR):
                prune_samples(self.run_dir, self.start_iteration, self._started)
            with bars:
                if self.start_iteration == 0 and cfg.eval.tasks:
                    evaluate_baselines(self, bars.evaluation, self.clock)
                for iteration in range(self.start_iteration, cfg.train.iterations):
                    self.step(iteration, bars)
                if not evaluated_after and self._evaluation_after_due():
                    self._release_learner(self.last_saved)
                    with self.clock.phase(EVAL_AFTER):
                        self.last_eval = self.evaluate(self.iteration, bars.evaluation("trained"))
                        self.log(self.iteration, flatten_summary(self.last_eval, "eval"))
            finished = True
        except KeyboardInterrupt:
            if self.iteration > self.last_saved:
                logger.warning("interrupted: saving iteration %d before exiting", self.iteration)
                self.save(self.iteration)
            self.save_phases()
            raise
        finally:
            self._close(finished)
        try:
            return self._finish()
        finally:
            self.clock.close()

    def step(self, iteration: int, bars: TrainingBars) -> None:
        """One iteration: rollouts, the update, the batch's samples, an evaluation when
        due, the metrics line, the checkpoint when due, and the league's turn."""
        cfg = self.cfg
        bars.meta_episodes()
        t0 = time.perf_counter()
        records = self.rollout(iteration, on_done=bars.advance)
        release_free_memory()  # what the engine freed, before the learner allocates
        t1 = time.perf_counter()
        self.clock.add(ROLLOUTS, t1 - t0)
        stats = self.learn(records)
        release_free_memory()  # the update's activations and gradients
        t2 = time.perf_counter()
        self.clock.add(LEARNER, t2 - t1)
        self.iteration = iteration + 1
        scalars = self._scalars(records, stats, t1 - t0, t2 - t1)
        if samples_due(self.iteration, cfg.train.iterations, cfg.train.save_samples):
            with self.clock.phase(SAVING):
                self.save_samples(self.iteration)
        if cfg.eval.tasks and cfg.eval.every and self.iteration % cfg.eval.every == 0:
            with self.clock.phase(EVAL_DURING):
                self.last_eval = self.evaluate(self.iteration, bars.evaluation("trained"))
            scalars.update(flatten_summary(self.last_eval, "eval"))
        scalars["perf/elapsed_s"] = self.clock.elapsed()
        rss = resident_mb()
        if rss is not None:
            scalars["perf/rss_mb"] = rss
        # Logged before the save: a kill in between resumes from the checkpoint before,
        # which cuts this line and logs the iteration again, once.
        with self.clock.phase(SAVING):
            self.log(self.iteration, scalars)
            if self.iteration % cfg.train.save_every == 0 or self.iteration == cfg.train.iterations:
                self._checkpoint()
        if self.league is not None:
            self._league_turn(records)
        episodes = cfg.meta.episodes
        info = (
            f"success {scalars['charts/success@1']:.2f}→"
            f"{scalars[f'charts/success@{episodes}']:.2f} loss {stats['loss']:+.3f}"
        )
        bars.iteration_done(info)
        ev = scalars.get(f"charts/ev@{episodes}")
        figures = info + ("" if ev is None else f" ev@{episodes} {ev:+.2f}")
        self.clock.iteration_done(self.iteration, t1 - t0, t2 - t1,
                                  time.perf_counter() - t0, figures)  # fmt: skip
        self.save_phases()

    def _checkpoint(self) -> None:
        """Save the iteration reached, once."""
        if self.last_saved != self.iteration:
            self.save(self.iteration)
            self.last_saved = self.iteration

    def _league_turn(self, records: list[MetaEpisodeRecord]) -> None:
        """Record the batch's games; every ``league.every`` iterations (the last one
        excepted) the checkpoint reached joins the league."""
        assert self.league is not None
        self.league.record(records)
        if (
            self.iteration % self.cfg.league.every == 0
            and self.iteration < self.cfg.train.iterations
        ):
            self._checkpoint()
            model = self.run_dir / "checkpoints" / checkpoint_name(self.iteration)
            self.league.add(self.iteration, model / "model")

    def _evaluation_after_due(self) -> bool:
        """Whether the trained graph still needs its evaluation after the last iteration:
        evaluation is on and no evaluation during training fell on that iteration."""
        cfg = self.cfg
        return bool(cfg.eval.tasks) and (
            self.last_eval is None
            or cfg.eval.every == 0
            or bool(cfg.train.iterations % cfg.eval.every)
        )

    def _close(self, finished: bool) -> None:
        """Close the engine, self-play's seat and the metrics, after success or failure."""
        self.engine.close()
        if self.self_play is not None:
            self.self_play.uninstall()
        try:
            with writing(self.run_dir / "metrics.jsonl"):
                self.metrics.close()
        except Exception as exc:
            if finished:
                raise
            # A full disk fails the last flush too; the error that stopped the run counts.
            logger.warning("closing the metrics after a failure failed too: %s", exc)

    def _finish(self) -> dict[str, Any]:
        """Write the report (when the run was evaluated) and the phase table; return the
        run's paths and its last evaluation."""
        release_free_memory()  # what the closed engine held, before the report loads models
        checkpoint = latest_checkpoint(self.run_dir)
        written: dict[str, Any] = {}
        if self.last_eval is not None:
            with writing(self.run_dir), self.clock.phase(REPORT):
                written = write_training_report(
                    self.run_dir, self.cfg, self.iteration, self._started, self.clock
                )
        self.clock.log_table()
        self.save_phases()
        return {
            "run_dir": str(self.run_dir),
            "checkpoint": str(checkpoint / "model") if checkpoint else None,
            "metrics": str(self.run_dir / "metrics.jsonl"),
            "tensorboard": str(self.run_dir / "tb"),
            "report": written.get("report"),
            "plot": written.get("plot"),
            "verdict": written.get("verdict", []),
            "eval": self.last_eval,
        }

    def _release_learner(self, last_saved: int) -> None:
        """Free the learner's optimizer state before the final evaluation, when training
        is over and its last iteration is saved (a 135M model's AdamW moments are 1 GB)."""
        release = getattr(getattr(self, "learner", None), "release_training_state", None)
        if release is not None and last_saved == self.iteration == self.cfg.train.iterations:
            release()

    def _logged_final_eval(self) -> dict[str, Any] | None:
        """The final evaluation of a finished run that is resumed again, if logged.

        Resuming a run whose last checkpoint is ``train.iterations`` only evaluates; when
        that evaluation was logged already, it is read back instead of logged twice.
        """
        if self.start_iteration < self.cfg.train.iterations:
            return None
        report = self.run_dir / "eval" / f"{checkpoint_name(self.start_iteration)}.json"
        logged = any(
            row["iteration"] == self.start_iteration and any(k.startswith("eval/") for k in row)
            for row in self.metrics.kept
        )
        return json.loads(report.read_text()) if logged and report.exists() else None

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
            "clip_frac",
            "approx_kl",
            "grad_norm",
        ):
            if key in stats:
                scalars[f"losses/{key}"] = stats[key]
        for key, value in stats.items():  # registered loss terms (learner.loss_terms)
            if key.startswith("term/"):
                scalars[f"losses/{key}"] = value
        turns = [t for r in records for t in r.turns]
        acting = [t for t in turns if t.acting]
        generated = sum(len(t.response_ids) for t in turns)
        scalars.update(
            {
                # Acting calls only, as in evaluation: the share of steps the environment
                # refused, however many other calls a graph makes.
                "charts/invalid_share": sum(t.invalid for t in acting) / max(1, len(acting)),
                "charts/response_tokens_mean": generated / max(1, len(turns)),
                "perf/rollout_s": rollout_s,
                "perf/learn_s": learn_s,
                "perf/rollout_share": rollout_s / max(1e-9, rollout_s + learn_s),
                "perf/rollout_tokens_per_s": generated / max(1e-9, rollout_s),
                "perf/learner_tokens_per_s": stats.get("tokens_per_s", 0.0),
                # Samples' tokens over the tokens the model computed: above 1 where
                # prefix trees share what the samples repeat, below where rows are padded.
                "perf/learner_token_ratio": stats.get("sample_tokens", 0.0)
                / max(1.0, stats.get("fed_tokens", 0.0)),
            }
        )
        scalars.update(node_metrics(self.trained, self.credit))
        return scalars
