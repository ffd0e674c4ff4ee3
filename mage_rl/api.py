"""The Python API: load a config, train, evaluate, load a trained agent.

The functions do what the commands do (``mage train``, ``mage eval``) and are importable
from the package itself::

    import mage_rl

    cfg = mage_rl.load_config("configs/rps_smollm2.yaml", ["train.iterations=2"])
    summary = mage_rl.train(cfg, "runs/rps_try")
    results = mage_rl.evaluate(["mage=runs/rps_try", "reflexion=smollm2"], "runs/eval/try", n=16)
    with mage_rl.load_agent("runs/rps_try") as agent:
        record = agent.play(seed=3)
        print(record.episode_rewards)

A trained agent is loaded from its run folder (or a checkpoint in it) with the graph,
plugins and play settings of the run's ``config.yaml``, as ``mage eval`` plays it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mage_rl.eval.settings import EVAL_TEMPERATURE, EVAL_TOP_K, EVAL_TOP_P

if TYPE_CHECKING:
    from mage_rl.config import RunConfig, TrainConfig
    from mage_rl.graphs import MetaEpisodeGraph
    from mage_rl.records import MetaEpisodeRecord


def load_config(path: str | Path | None, overrides: Sequence[str] = ()) -> TrainConfig:
    """A run config from a YAML file (training sections optional) with ``key=value``
    overrides, checked as ``mage train`` checks it.

    Raises:
        FileNotFoundError: No such file.
        ValueError: What is wrong, naming the key (and the file and line for YAML).
    """
    from mage_rl.config import load_config as load

    return load(path, list(overrides))  # type: ignore[no-any-return]


def train(
    config: TrainConfig | str | Path,
    run_dir: str | Path | None = None,
    *,
    resume: bool = False,
    progress: bool = False,
) -> dict[str, Any]:
    """Train as ``mage train`` does; returns the run's summary (paths, last evaluation).

    Args:
        config: A config from :func:`load_config`, or the path of a YAML file.
        run_dir: The run folder (default: ``train.out_dir / train.run_name``, or the
            file's name).
        resume: Continue from the newest complete checkpoint in ``run_dir``.
        progress: Show the progress display.
    """
    from mage_rl.cluster.backends import trainer_class
    from mage_rl.provenance import mark_start

    mark_start()
    name = "run"
    if isinstance(config, str | Path):
        name = Path(config).stem
        config = load_config(config)
    if run_dir is None:
        run_dir = Path(config.train.out_dir) / (config.train.run_name or name)
    trainer = trainer_class(config.train.backend)(config, run_dir, resume=resume, progress=progress)
    return trainer.run()  # type: ignore[no-any-return]


def evaluate(
    agents: Sequence[str],
    out: str | Path,
    *,
    model: str = "smollm2",
    progress: bool = False,
    **settings: Any,
) -> dict[str, Any]:
    """Evaluate agents on identical tasks as ``mage eval`` does; returns ``results.json``.

    Args:
        agents: ``STYLE[=MODEL][@LABEL]`` specs, as ``--agent`` takes them; a trained
            agent is ``NAME=RUN_DIR`` and plays as its run says.
        out: The evaluation's folder (resumed if it exists).
        model: The model of agents given without ``=MODEL``.
        progress: Show progress bars.
        **settings: Any field of :class:`~mage_rl.eval.settings.EvalSettings` (``n``,
            ``envs``, ``opponents``, ``max_tokens``...).
    """
    from mage_rl.eval.harness import EvalConfig, parse_agents, run_evaluation
    from mage_rl.provenance import mark_start

    mark_start()
    cfg = EvalConfig(agents=parse_agents(list(agents), model), **settings)
    return run_evaluation(cfg, out, progress=progress)


@dataclass
class TrainedAgent:
    """A trained agent, ready to play: its run config, graph and engine.

    Use it as a context manager, or call :meth:`close`, to free the engine.
    """

    name: str
    config: RunConfig
    graph: MetaEpisodeGraph
    engine: Any
    temperature: float = EVAL_TEMPERATURE
    top_p: float = EVAL_TOP_P
    top_k: int = EVAL_TOP_K

    def play(
        self, seed: int = 0, opponent: str | None = None, seat: str | None = None
    ) -> MetaEpisodeRecord:
        """One meta-episode against ``opponent`` (default: drawn from the run's
        population with ``seed``), in the seat ``seat`` (default: the run's rule)."""
        from mage_rl import runtime
        from mage_rl.envs import make_env, resolve_seat
        from mage_rl.rl.rollout import TaskInstance, record_from_state

        task = runtime.tasks_for(self.config, 1, seed)[0]
        if opponent is not None or seat is not None:
            chosen = resolve_seat(seat, task.seed) if seat is not None else task.seat
            task = TaskInstance(task.seed, opponent or task.opponent, chosen)
        env = make_env(self.config.env.name, task.opponent, seat=task.seat,
                       max_turns=self.config.env.max_turns)  # fmt: skip
        llm = runtime.chat_model(
            self.engine, temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
            max_tokens=self.config.policy.max_tokens,
        )  # fmt: skip
        state = asyncio.run(self.graph.run(env, llm, task_seed=task.seed, opponent=task.opponent))
        return record_from_state(
            state, task=task, rollout=0, env_name=self.config.env.name, agent=self.name
        )

    def close(self) -> None:
        close = getattr(self.engine, "close", None)
        if close is not None:
            close()

    def __enter__(self) -> TrainedAgent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def load_agent(run: str | Path, overrides: Sequence[str] = ()) -> TrainedAgent:
    """The agent a training run trained: its newest checkpoint (or the checkpoint
    named), with the run's graph, plugins and play settings; ``overrides`` are
    ``key=value`` changes of the run config (``policy.max_tokens=20``).

    Raises:
        ValueError: ``run`` is no training run, or an override breaks a config rule.
    """
    from mage_rl import runtime
    from mage_rl.config import RunConfig
    from mage_rl.config_yaml import parse_overrides, set_path
    from mage_rl.eval.play import run_config
    from mage_rl.rl.run_folder import find_run

    found = find_run(str(run))
    if found is None:
        raise ValueError(
            f"{run} is not a training run: give its folder (it holds config.yaml and "
            "checkpoints/) or one of its checkpoints"
        )
    run_dir, model_dir = found
    data = run_config(run_dir)
    set_path(data, "policy.model", str(model_dir))
    set_path(data, "policy.explore", 0.0)
    for key, value in parse_overrides(list(overrides)):
        set_path(data, key, value)
    cfg = RunConfig.model_validate(data)
    engine = runtime.build_engine(cfg.policy)
    return TrainedAgent(run_dir.name, cfg, runtime.build_graph(cfg), engine)
