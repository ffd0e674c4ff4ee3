"""The adaptation study: does training on the last episode teach opponent identification?

MAGE's claim (SPEC §4) is that rewarding the *last* episode of a meta-episode teaches an
agent to read the opponent from earlier episodes and exploit it. This study tests the
claim on Kuhn Poker, where the exact values are known (SPEC §9):

* ``fresh`` deals every episode, ``history`` context (the past hands, with the cards of
  showdowns, in the prompt), K episodes, the training population conservative 0.3 /
  aggressive 0.3 / intermediate 0.4, one fixed agent seat per run;
* a small policy that learns on CPU in minutes (the config's ``policy.model``, by default
  a tiny Qwen3 built in-process) with the compact prompt and constrained decoding;
* every method trains from the same initial weights, on the same task seeds, for the
  same number of iterations, and sees the same number of hands per iteration.

Methods (:data:`METHODS`): ``mage`` (differential reward, stationary grouping, global
anchors); ``gigpo_single`` (standard GiGPO on single hands: K = 1 and no history during
training, the group three times larger so the hand count matches, evaluated in the
K-hand protocol); ``single_episode_reward`` (meta-episodes, no cross-episode credit);
``cumulative`` (LaMer); ``mage_mixed_groups`` (a group's rollouts face different
opponents); ``mage_local_anchor`` (anchor states keyed by episode index).

Evaluation is exact, not sampled (:mod:`studies.adaptation.exact`): the policy
decodes greedily, the opponents are deterministic, so a meta-episode's outcome is a
function of its K deals. The evaluation plays every one of the ``6**K`` deal sequences
against every opponent and weights them by the population, which gives the exact
expected chips of every episode index (``ev@k``) for the greedy policy, with no sampling
noise. The results file and its plots are :mod:`studies.adaptation.results`.
"""

from __future__ import annotations

import copy
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mage_rl import load_config
from mage_rl.provenance import provenance
from mage_rl.rl.pretrain import PretrainSettings
from studies.adaptation import CONFIG
from studies.adaptation.exact import (
    deal_sequence_seeds,
    exact_ev,
    exact_eval_tasks,
    reference_values,
)
from studies.adaptation.results import (
    SEATS,
    aggregate,
    plot_curves,
    run_budget_seconds,
    save_cell,
)

if TYPE_CHECKING:
    from mage_rl.config import TrainConfig

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_CONFIG",
    "METHODS",
    "Method",
    "bench_adaptation",
    "deal_sequence_seeds",
    "exact_ev",
    "exact_eval_tasks",
    "method_config",
    "reference_values",
    "run_method",
]

DEFAULT_CONFIG = CONFIG


@dataclass(frozen=True)
class Method:
    """One training recipe of the study.

    Attributes:
        name: Key in the results.
        description: One line for tables.
        overrides: Dotted config overrides applied to the base config.
        single_episode_training: Train on K = 1 (no history), evaluate on K episodes.
    """

    name: str
    description: str
    overrides: dict[str, Any] = field(default_factory=dict)
    single_episode_training: bool = False


METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        Method("mage", "MAGE: differential reward, stationary groups, global anchors"),
        Method(
            "gigpo_single",
            "GiGPO on single hands (K=1, no history in training)",
            {"returns.mode": "single_episode"},
            single_episode_training=True,
        ),
        Method(
            "single_episode_reward",
            "meta-episodes, per-episode reward, no cross-episode credit",
            {"returns.mode": "single_episode"},
        ),
        Method("cumulative", "LaMer-style cumulative reward", {"returns.mode": "cumulative"}),
        Method(
            "mage_mixed_groups",
            "MAGE with groups spanning opponents",
            {"advantages.grouping": "mixed"},
        ),
        Method(
            "mage_local_anchor",
            "MAGE with episode-local anchor states",
            {"advantages.anchor": "local"},
        ),
    )
}


# -- one training run ------------------------------------------------------------------


def method_config(
    base: str | Path, method: Method, seat: str, seed: int, iterations: int, extra: Sequence[str]
) -> tuple[TrainConfig, TrainConfig]:
    """The training config and the K-episode evaluation config of one run."""
    chosen = dict(method.overrides)
    if chosen.get("returns.mode", "differential") != "differential":
        # reward_to_go drops the previous episode's reward from the differential reward;
        # the other modes have no such term, so a `--set returns.reward_to_go=true` meant
        # for the MAGE methods is switched off for them.
        chosen["returns.reward_to_go"] = False
    overrides = [f"{k}={json.dumps(v) if not isinstance(v, str) else v}" for k, v in chosen.items()]
    common = [f"env.seat={seat}", f"rollout.seed={seed}", f"learner.seed={seed}", *extra]
    eval_cfg = load_config(base, [*common, *overrides])
    train_overrides = [*common, *overrides, f"train.iterations={iterations}"]
    if method.single_episode_training:
        k = eval_cfg.meta.episodes
        train_overrides += [
            "meta.episodes=1",
            "meta.context=none",
            f"rollout.group_size={eval_cfg.rollout.group_size * k}",
        ]
    train_cfg = load_config(base, train_overrides)
    return train_cfg, eval_cfg


def run_method(
    method: Method,
    seat: str,
    *,
    base_config: str | Path,
    iterations: int,
    eval_every: int,
    seed: int,
    deal_seeds: Sequence[int],
    run_dir: Path,
    extra: Sequence[str] = (),
    on_point: Callable[[dict[str, Any]], None] | None = None,
    max_train_seconds: float | None = None,
    average: float = 0.0,
) -> dict[str, Any]:
    """Train one method for one seat and evaluate it exactly every ``eval_every`` iterations.

    Training stops after ``iterations``, or earlier once the rollout-and-update time
    reaches ``max_train_seconds`` (evaluation time is not counted); the run is then
    evaluated one last time and its final policy saved under
    ``run_dir/checkpoints/iter_NNNNNN``. With ``average`` in (0, 1), an exponential
    moving average of the weights (``avg = average * avg + (1 - average) * new`` after
    each update) is evaluated too, at the same points, under each point's ``average``
    key (at iteration 0 it is the trained weights, whose values it copies); rollouts
    and updates use the trained weights as always.
    """
    from mage_rl import runtime
    from mage_rl.cluster.backends import trainer_class
    from mage_rl.envs.base import resolve_seat

    train_cfg, eval_cfg = method_config(base_config, method, seat, seed, iterations, extra)
    if train_cfg.train.backend == "openrlhf":
        raise ValueError("the adaptation study runs on train.backend local or ray")
    # train.backend=ray spreads the rollouts over train.num_workers processes (one core
    # each); the learner and the exact evaluation stay in this process.
    trainer = trainer_class(train_cfg.train.backend)(train_cfg, run_dir, progress=False)
    eval_graph = runtime.build_graph(eval_cfg)
    greedy = runtime.chat_model(
        trainer.engine, temperature=0.0, max_tokens=eval_cfg.policy.max_tokens
    )
    tasks, weights = exact_eval_tasks(eval_cfg, resolve_seat(seat, 0), deal_seeds)
    k = eval_cfg.meta.episodes
    averaged = (
        {
            n: t.detach().float().clone()
            for n, t in trainer.learner.state_dict_for_inference().items()
        }
        if average
        else {}
    )

    def evaluate(iteration: int, train_seconds: float) -> dict[str, Any]:
        start = time.perf_counter()
        records = runtime.run_rollouts(eval_cfg, eval_graph, greedy, tasks, 1)
        point = {"iteration": iteration, "train_seconds": round(train_seconds, 2)}
        values = exact_ev(records, weights, k)
        point |= values
        if averaged and iteration == 0:
            # Before any update the average is the trained weights: the same values.
            point["average"] = copy.deepcopy(values)
        elif averaged:
            trainer.engine.update_weights(averaged)
            records = runtime.run_rollouts(eval_cfg, eval_graph, greedy, tasks, 1)
            point["average"] = exact_ev(records, weights, k)
            trainer.engine.update_weights(trainer.learner.state_dict_for_inference())
        point["eval_seconds"] = round(time.perf_counter() - start, 2)
        if on_point is not None:
            on_point(point)
        return point

    train_seconds = 0.0
    done = 0
    try:
        curve = [evaluate(0, 0.0)]
        for it in range(iterations):
            start = time.perf_counter()
            records = trainer.rollout(it)
            stats = trainer.learn(records)
            if averaged:
                for name, tensor in trainer.learner.state_dict_for_inference().items():
                    averaged[name].mul_(average).add_(tensor.float(), alpha=1.0 - average)
            train_seconds += time.perf_counter() - start
            done = it + 1
            trainer.metrics.log(done, {"losses/" + key: value for key, value in stats.items()})
            out_of_time = max_train_seconds is not None and train_seconds >= max_train_seconds
            if done % eval_every == 0 or done == iterations or out_of_time:
                curve.append(evaluate(done, train_seconds))
            if out_of_time:
                break
        # The trained policy stays inspectable (mage eval, mage serve, the identification
        # study with --set policy.model=...): one checkpoint, at the end.
        if done:
            trainer.save(done)
    finally:
        trainer.engine.close()
        trainer.metrics.close()
        if hasattr(trainer, "shutdown"):
            trainer.shutdown()
    last = curve[-1]
    return {
        "method": method.name,
        "seat": seat,
        "seed": seed,
        "iterations": iterations,
        "max_train_seconds": max_train_seconds,
        "iterations_done": done,
        "train_seconds": round(train_seconds, 1),
        "ev_by_episode": last["ev_by_episode"],
        "last_episode_ev": last["ev_by_episode"][-1],
        "ev_by_opponent": last["ev_by_opponent"],
        "curve": curve,
        "config": train_cfg.model_dump(mode="json"),
    } | ({"eval_average": average, "average": last["average"]} if averaged else {})


# -- the whole study ------------------------------------------------------------------


def bench_adaptation(
    *,
    config: str | Path = DEFAULT_CONFIG,
    methods: Sequence[str] = tuple(METHODS),
    seats: Sequence[str] = SEATS,
    seeds: Sequence[int] = (0,),
    iterations: int = 60,
    eval_every: int = 10,
    out: str | Path = "runs/adaptation/adaptation.json",
    overrides: Sequence[str] = (),
    resume: bool = True,
    runs_dir: str | Path | None = None,
    pretrain: PretrainSettings | None = None,
    minutes: float | None = None,
    log: Callable[[str], None] = print,
    started: float | None = None,
    average: float = 0.0,
    command: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Train every method for every seat and seed; write the results JSON as it goes.

    Args:
        config: Base training config (environment, model, batch sizes, learner).
        methods: Keys of :data:`METHODS`.
        seats: ``first`` and/or ``second``.
        seeds: Training seeds (task sampling and the learner's shuffling); the initial
            weights are the config's model and the same for every run.
        iterations: Rollout-and-update iterations per run (the shared budget).
        minutes: A time budget as well: a run stops once its training time (rollouts
            and updates, not evaluation) reaches this many minutes, if that comes before
            ``iterations``. With ``pretrain``, the seed's pretraining time is part of
            it: RL gets what pretraining left.
        eval_every: Exact evaluation every N iterations (and after the last).
        out: Results JSON; its folder also receives run folders and ``curves.png``.
        overrides: ``key=value`` config overrides applied to every run.
        resume: Keep runs already present in ``out`` (same method, seat and seed).
        runs_dir: Where run folders (metrics, TensorBoard) go; default ``out``'s folder
            plus ``runs/``.
        pretrain: When given, the config's model is first pretrained on game transcripts
            (:mod:`mage_rl.rl.pretrain`), once per seed and for both seats, and every
            method of that seed starts from the result; its seconds are reported beside
            each run's training seconds.
        log: Where progress lines go.
        started: ``time.time()`` when the command began, for the file's provenance.
        average: Also evaluate an exponential moving average of the weights with this
            decay per update (:func:`run_method`); 0 does not.
        command: The command line the results files record (default: ``sys.argv``).

    Returns:
        The results document (also written to ``out``). Every run carries a
        ``provenance`` block (:func:`~mage_rl.provenance.provenance`: torch threads,
        commit, versions, CPU, command, its wall time), since results depend on them.
    """
    unknown = sorted(set(methods) - set(METHODS))
    if unknown:
        raise ValueError(f"unknown method(s) {unknown}; valid: {', '.join(METHODS)}")
    if not 0.0 <= average < 1.0:
        raise ValueError(f"average={average}: give a decay in [0, 1) (0: no average)")
    bad_seats = sorted(set(seats) - set(SEATS))
    if bad_seats:
        raise ValueError(f"unknown seat(s) {bad_seats}; valid: first, second")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    base = load_config(config, list(overrides))
    doc: dict[str, Any] = {}
    if resume and out.exists():
        doc = json.loads(out.read_text())
    doc.setdefault("results", {})
    doc["reference"] = reference_values()
    doc["setup"] = {
        "config": str(config),
        "overrides": list(overrides),
        "iterations": iterations,
        "minutes": minutes,
        "eval_every": eval_every,
        "eval_average": average,
        "episodes": base.meta.episodes,
        "meta_episodes_per_iteration": base.rollout.tasks * base.rollout.group_size,
        "evaluation": f"exact: greedy policy, all {6**base.meta.episodes} deal sequences "
        "x every opponent, population-weighted",
    }
    deal_seeds = deal_sequence_seeds(base.meta.episodes)
    max_seconds = None if minutes is None else 60.0 * minutes
    parent = Path(runs_dir) if runs_dir is not None else out.parent / "runs"
    pretrained = {
        seed: _pretrained_model(config, overrides, seed, pretrain, parent, log)
        for seed in (seeds if pretrain is not None else ())
    }
    if pretrain is not None:
        doc["setup"]["pretrain"] = {
            str(seed): json.loads((Path(path) / "pretrain.json").read_text())
            for seed, path in pretrained.items()
        }
    for seat in seats:
        for name in methods:
            cell = doc["results"].setdefault(name, {}).get(seat)
            done = {
                r["seed"]: r
                for r in (cell or {}).get("runs", [])
                if r["iterations"] == iterations
                and run_budget_seconds(r) == max_seconds
                and r.get("pretrained") == pretrained.get(r["seed"])
                and r.get("eval_average", 0.0) == average
            }
            runs = []
            for seed in seeds:
                if seed in done:
                    log(f"{name} / {seat} / seed {seed}: kept from {out}")
                    runs.append(done[seed])
                    continue
                run_dir = _new_run_dir(parent, f"{name}_{seat}_seed{seed}_{int(time.time())}")
                start_model = pretrained.get(seed)
                extra = [*overrides, *([f"policy.model={start_model}"] if start_model else [])]
                pretrain_seconds = (
                    doc["setup"]["pretrain"][str(seed)]["seconds"] if start_model else 0.0
                )
                rl_seconds = _rl_seconds(max_seconds, pretrain_seconds)
                budget = f"{iterations} iterations" + (f" or {minutes:g} min" if minutes else "")
                if start_model and minutes:
                    budget += f" ({pretrain_seconds:.0f}s of them pretraining)"
                log(f"{name} / {seat} / seed {seed}: training {budget} in {run_dir}")

                def show(point: dict[str, Any], name: str = name, seat: str = seat) -> None:
                    ev = ", ".join(f"{v:+.3f}" for v in point["ev_by_episode"])
                    if "average" in point:
                        avg = ", ".join(f"{v:+.3f}" for v in point["average"]["ev_by_episode"])
                        ev += f"]  average [{avg}"
                    log(
                        f"  {name} {seat} iter {point['iteration']:>4} "
                        f"train {point['train_seconds']:7.1f}s  ev@k [{ev}]"
                    )

                run_started = time.time()
                result = run_method(
                    METHODS[name],
                    seat,
                    base_config=config,
                    iterations=iterations,
                    eval_every=eval_every,
                    seed=seed,
                    deal_seeds=deal_seeds,
                    run_dir=run_dir,
                    extra=extra,
                    on_point=show,
                    max_train_seconds=rl_seconds,
                    average=average,
                )
                result["pretrained"] = start_model
                result["pretrain_seconds"] = pretrain_seconds
                result["budget_seconds"] = max_seconds
                argv = None if command is None else list(command)
                result["provenance"] = provenance(started=run_started, argv=argv)
                runs.append(result)
                doc["results"][name][seat] = aggregate(runs)
                doc = save_cell(out, doc, name, seat, started, command)
            doc["results"][name][seat] = aggregate(runs)
            doc = save_cell(out, doc, name, seat, started, command)
    plot_curves(doc, out.with_name(out.stem + "_curves.png"))
    return doc


def _rl_seconds(budget_seconds: float | None, pretrain_seconds: float) -> float | None:
    """What a time budget leaves for RL once pretraining has taken its part."""
    if budget_seconds is None:
        return None
    left = budget_seconds - pretrain_seconds
    if left <= 0:
        raise ValueError(
            f"pretraining took {pretrain_seconds:.0f}s, the whole --minutes "
            f"{budget_seconds / 60:g} budget; give more minutes or pretrain less (fewer "
            "batches or epochs)"
        )
    return left


def _pretrained_model(
    config: str | Path,
    overrides: Sequence[str],
    seed: int,
    settings: PretrainSettings,
    parent: Path,
    log: Callable[[str], None],
) -> str:
    """The pretrained model of one seed: made once, then reused by every method and seat."""
    from dataclasses import asdict, replace

    from mage_rl.rl.pretrain import SUMMARY_FILE, pretrain

    settings = replace(settings, seed=seed)
    path = parent / f"pretrained_seed{seed}"
    summary_file = path / SUMMARY_FILE
    if summary_file.exists():
        if json.loads(summary_file.read_text())["settings"] != asdict(settings):
            raise FileExistsError(
                f"{path} holds a model pretrained with other settings; move it away or use "
                "another --runs-dir"
            )
        log(f"pretrained model of seed {seed}: kept from {path}")
        return str(path)
    cfg = load_config(config, [*overrides, f"rollout.seed={seed}"])
    log(f"pretraining the model of seed {seed} on transcripts of both seats, into {path}")
    summary = pretrain(cfg, path, settings, seats=SEATS, log=log)
    log(f"  pretrained in {summary['seconds']:.0f}s")
    return str(path)


def _new_run_dir(parent: Path, name: str) -> Path:
    """A run folder no other run has, even one started in the same second elsewhere."""
    parent.mkdir(parents=True, exist_ok=True)
    for n in range(1, 1000):
        path = parent / (name if n == 1 else f"{name}-{n}")
        try:
            path.mkdir()  # atomic: two studies never get the same folder
        except FileExistsError:
            continue
        return path
    raise FileExistsError(f"no free run folder for {name} in {parent}")
