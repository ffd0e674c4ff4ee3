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
plugins and play settings of the run's ``config.yaml``, as ``mage eval`` plays it; it
samples from a local engine over the checkpoint, or from an OpenAI-compatible endpoint
(``endpoint=``, such as ``mage serve RUN``). ``agent.as_graph()`` is the agent as a
compiled LangGraph, a node of the caller's own graph (:class:`AgentState`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from mage_rl.cluster.backends import trainer_class
from mage_rl.defaults import EVAL_TEMPERATURE, EVAL_TOP_K, EVAL_TOP_P
from mage_rl.provenance import mark_start

if TYPE_CHECKING:
    from mage_rl.config import RunConfig, TrainConfig
    from mage_rl.envs.base import TextEnv
    from mage_rl.graphs import MetaEpisodeGraph
    from mage_rl.graphs.rollouts import TaskInstance
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

    mark_start()
    cfg = EvalConfig(agents=parse_agents(list(agents), model), **settings)
    return run_evaluation(cfg, out, progress=progress)


class AgentState(TypedDict, total=False):
    """The state of :meth:`TrainedAgent.as_graph`: the caller gives the first three keys,
    the agent sets the last three."""

    # A mage_rl.envs.base.TextEnv. Annotated Any because LangGraph resolves the schema's
    # annotations when it builds the graph, and importing the environments costs ~0.5 s.
    env: Any
    """The environment to play, bound to its opponent and seat (``make_env(...)``)."""
    task_seed: int
    """The task seed: it fixes the deal or board of every episode (default 0)."""
    opponent: str
    """The opponent id (default: the environment's opponent spec, else ``""``)."""
    episodes: list[dict[str, Any]]
    """One :class:`~mage_rl.records.EpisodeResult` dict per episode played (``index``,
    ``outcome``, ``reward``, ``payoff``, ``turns``, ``invalid_actions``)."""
    reflections: list[str]
    """The reflections written between episodes."""
    record: dict[str, Any]
    """The whole :class:`~mage_rl.records.MetaEpisodeRecord` as a dict (turns included);
    ``MetaEpisodeRecord.from_dict`` turns it back."""


@dataclass
class TrainedAgent:
    """A trained agent, ready to play: its run config, graph and engine (a local engine,
    or an endpoint client).

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
        from mage_rl.graphs.rollouts import TaskInstance

        task = runtime.tasks_for(self.config, 1, seed)[0]
        if opponent is not None or seat is not None:
            chosen = resolve_seat(seat, task.seed) if seat is not None else task.seat
            task = TaskInstance(task.seed, opponent or task.opponent, chosen)
        env = make_env(self.config.env.name, task.opponent, seat=task.seat,
                       max_turns=self.config.env.max_turns)  # fmt: skip
        return self._play(env, task)

    def as_graph(self) -> Any:
        """The agent as a compiled LangGraph named after it, to add to your own graph
        (``builder.add_node("agent", agent.as_graph())``) or invoke alone.

        Its state is :class:`AgentState`: given ``env`` (and optionally ``task_seed``
        and ``opponent``), its one node plays one meta-episode of the run's K episodes,
        as :meth:`play` does, and sets ``episodes``, ``reflections`` and ``record``. It
        runs under ``invoke`` and ``ainvoke``.

        Raises:
            ValueError: (when invoked) The state has no ``env``.
        """
        from langchain_core.runnables import RunnableLambda
        from langgraph.graph import END, START, StateGraph

        builder = StateGraph(AgentState)
        play = RunnableLambda(self._play_state, afunc=self._aplay_state, name="play")
        builder.add_node("play", play)
        builder.add_edge(START, "play")
        builder.add_edge("play", END)
        return builder.compile(name=self.name)

    def close(self) -> None:
        close = getattr(self.engine, "close", None)
        if close is not None:
            close()

    def __enter__(self) -> TrainedAgent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _play(self, env: TextEnv, task: TaskInstance) -> MetaEpisodeRecord:
        """One meta-episode in an event loop of its own."""

        async def once() -> MetaEpisodeRecord:
            try:
                return await self._aplay(env, task)
            finally:
                aclose = getattr(self.engine, "aclose", None)
                if aclose is not None:  # an endpoint client belongs to this event loop
                    await aclose()

        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(once())
        # Called from a running loop (a notebook cell, a sync invoke inside async code),
        # where asyncio.run refuses: run the loop in a thread and wait for it.
        with ThreadPoolExecutor(1) as pool:
            return pool.submit(asyncio.run, once()).result()

    async def _aplay(self, env: TextEnv, task: TaskInstance) -> MetaEpisodeRecord:
        from mage_rl import runtime
        from mage_rl.envs import canonical_game
        from mage_rl.graphs.rollouts import record_from_state

        llm = runtime.chat_model(
            self.engine, temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
            max_tokens=self.config.policy.max_tokens,
        )  # fmt: skip
        state = await self.graph.run(env, llm, task_seed=task.seed, opponent=task.opponent)
        # The record names the game the opponent spec names (an environment's own name
        # may be OpenSpiel's); the run's game for an opponent without one.
        try:
            env_name = canonical_game(task.opponent.split(":")[0])
        except ValueError:
            env_name = self.config.env.name
        return record_from_state(state, task=task, rollout=0, env_name=env_name, agent=self.name)

    def _play_state(self, state: AgentState) -> AgentState:
        return _agent_output(self._play(*_agent_input(state)))

    async def _aplay_state(self, state: AgentState) -> AgentState:
        # No aclose here: the endpoint client belongs to the caller's event loop, where
        # other meta-episodes may be using it.
        return _agent_output(await self._aplay(*_agent_input(state)))


def _agent_input(state: AgentState) -> tuple[TextEnv, TaskInstance]:
    """The environment and task of an :class:`AgentState` input, with the defaults."""
    from mage_rl.graphs.rollouts import TaskInstance

    env = state.get("env")
    if env is None:
        raise ValueError(
            f"the agent graph needs 'env' in its input (got keys {sorted(state)}): an "
            "environment bound to its opponent and seat, such as "
            "make_env('kuhn_poker', 'kuhn_poker:aggressive', seat=0)"
        )
    opponent = state.get("opponent")
    if opponent is None:
        opponent = str(getattr(getattr(env, "opponent", None), "spec", "") or "")
    return env, TaskInstance(int(state.get("task_seed", 0)), opponent, int(env.seat))


def _agent_output(record: MetaEpisodeRecord) -> AgentState:
    data = asdict(record)
    return {"episodes": data["episodes"], "reflections": data["reflections"], "record": data}


def load_agent(
    run: str | Path,
    overrides: Sequence[str] = (),
    *,
    endpoint: str | None = None,
    endpoint_model: str | None = None,
) -> TrainedAgent:
    """The agent a training run trained: its newest checkpoint (or the checkpoint
    named), with the run's graph, plugins and play settings.

    Args:
        run: The run folder, or one of its checkpoints.
        overrides: ``key=value`` changes of the run config (``policy.max_tokens=20``).
        endpoint: An OpenAI-compatible endpoint (``http://HOST:PORT/v1``) that serves
            the trained model, such as ``mage serve RUN``; the agent then samples from
            it instead of loading the checkpoint into a local engine.
        endpoint_model: The name the endpoint serves the model under (``mage serve
            RUN`` serves it under ``RUN`` as typed, or ``--served-model-name``);
            required with ``endpoint``.

    Raises:
        ValueError: ``run`` is no training run, an override breaks a config rule, or
            ``endpoint`` is given without ``endpoint_model`` or for a run that plays
            with constrained decoding or in the conversation layout (both need the
            local engine).
    """
    from mage_rl import runtime
    from mage_rl.players.play_settings import trained_config

    if endpoint is not None and not endpoint_model:
        raise ValueError(
            f"load_agent(endpoint={endpoint!r}) needs endpoint_model=NAME, the name the "
            "endpoint serves the model under (mage serve RUN serves it under RUN as typed, "
            "or under --served-model-name)"
        )
    run_dir, cfg = trained_config(run, list(overrides))
    if endpoint is None:
        engine = runtime.build_engine(cfg.policy)
    else:
        from mage_rl.policy.openai_client import OpenAIPolicy

        if cfg.policy.constrain_actions or cfg.meta.layout == "conversation":
            raise ValueError(
                f"{run} plays with policy.constrain_actions={cfg.policy.constrain_actions} "
                f"and meta.layout={cfg.meta.layout}: constrained decoding and the "
                "conversation layout sample on the local engine (restricted log-probs, the "
                "chat's token ids), not through an endpoint; load it without endpoint=, or "
                "play it otherwise with overrides=['policy.constrain_actions=false', "
                "'meta.layout=rerendered']"
            )
        engine = OpenAIPolicy(endpoint, str(endpoint_model))
    return TrainedAgent(run_dir.name, cfg, runtime.build_graph(cfg), engine)
