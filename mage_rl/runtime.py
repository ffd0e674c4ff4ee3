"""Build the pieces a config describes: model, engine, chat model, graph, tasks.

The rollout, training and evaluation commands share these, so a config means the same
thing in each of them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from mage_rl.config import PolicyConfig, RunConfig
from mage_rl.envs import Population, make_env, resolve_seat
from mage_rl.envs.base import derive_seed
from mage_rl.envs.llm_opponent import is_self, without_self
from mage_rl.envs.opponents import PlaceholderOpponent
from mage_rl.graphs import MetaEpisodeGraph, agent_graph
from mage_rl.graphs.rollouts import TaskInstance, collect_rollouts, sample_tasks
from mage_rl.nodes.conversation import reflect_message, step_message
from mage_rl.nodes.core import play_prompt
from mage_rl.nodes.state import MetaEpisodeContext, graph_options
from mage_rl.players.seat_player import install as install_llm_opponents
from mage_rl.plugins import load_plugins, load_process_plugins
from mage_rl.policy.chat_model import PolicyChatModel
from mage_rl.policy.conversation import (
    ConversationTemplate,
    check_conversation_fits,
    conversation_token_bound,
)
from mage_rl.policy.engine import LocalEngine
from mage_rl.policy.models import load_model
from mage_rl.policy.vllm_engine import VLLMEngine
from mage_rl.records import MetaEpisodeRecord

# GAME:llm:RUN_OR_MODEL opponents get their model half in every process that plays.
install_llm_opponents()


def build_graph(cfg: RunConfig) -> MetaEpisodeGraph:
    """The agent graph named by ``meta.agent`` with the config's options.

    Loads the config's plugins first (and those of the command that started this
    process), so a rollout worker in another process knows the names they register.
    """
    load_process_plugins()
    load_plugins(cfg.plugins)
    return agent_graph(cfg.meta.agent, graph_options(cfg))


def build_engine(policy: PolicyConfig, model: Any = None, tokenizer: Any = None) -> Any:
    """The rollout engine ``policy.engine`` names, for ``policy.model``.

    ``local``: a batched :class:`~mage_rl.policy.engine.LocalEngine` (over ``model`` and
    ``tokenizer`` when given). ``vllm``: a :class:`~mage_rl.policy.vllm_engine.VLLMEngine`,
    a vLLM server started on ``policy.model`` (``model`` is not used: the server loads its
    own copy, and ``update_weights`` brings it up to date).
    """
    if policy.engine == "vllm":
        return VLLMEngine(
            policy.model, dtype=policy.dtype, max_batch_size=policy.max_batch_size,
            name=policy.model,
        )  # fmt: skip

    if model is None:
        model, tokenizer = load_model(policy.model, dtype=policy.dtype)
    return LocalEngine(model, tokenizer, max_batch_size=policy.max_batch_size, name=policy.model)


def chat_model(
    engine: Any,
    *,
    temperature: float,
    top_p: float = 1.0,
    top_k: int = 0,
    max_tokens: int = 96,
    seed: int | None = None,
    explore: float = 0.0,
) -> Any:
    """A LangChain chat model over a policy, with default sampling settings.

    ``seed`` fixes the sampler seed of every call (benchmarks that must play the same
    games in every mode); ``None`` lets each call draw its own.
    """
    return PolicyChatModel(
        policy=engine, temperature=temperature, top_p=top_p, top_k=top_k, max_tokens=max_tokens,
        seed=seed, explore=explore,
    )  # fmt: skip


def rollout_chat_model(cfg: RunConfig, engine: Any) -> Any:
    """The chat model of training rollouts: the config's ``policy`` sampling settings."""
    p = cfg.policy
    return chat_model(
        engine,
        temperature=p.temperature,
        top_p=p.top_p,
        top_k=p.top_k,
        max_tokens=p.max_tokens,
        explore=p.explore,
    )


def eval_chat_model(cfg: Any, engine: Any) -> Any:
    """The chat model of periodic evaluation: the ``eval`` section's sampling settings."""
    e = cfg.eval
    return chat_model(
        engine,
        temperature=e.temperature,
        top_p=e.top_p,
        top_k=e.top_k,
        max_tokens=cfg.policy.max_tokens,
    )


def population(cfg: RunConfig) -> Population:
    """The config's opponent population."""
    return Population.parse(cfg.env.population, game=cfg.env.name)


def eval_population(cfg: RunConfig) -> Population:
    """The population evaluations and oracles use: the config's without ``GAME:self``
    (the policy itself, which no fixed value describes).

    Raises:
        ValueError: The population is ``GAME:self`` alone.
    """
    kept = without_self(population(cfg))
    if kept is None:
        raise ValueError(
            f"env.population={cfg.env.population!r} is self-play alone, which leaves nothing "
            "to evaluate against: give fixed opponents a share beside it (`mage opponents "
            f"{cfg.env.name}` lists them), say 'self=0.5,OPPONENT=0.5'"
        )
    return kept


def eval_population_named(cfg: RunConfig) -> dict[str, Population]:
    """``{label: eval_population(cfg)}``: labelled ``env.population`` as written, or, when
    ``GAME:self`` was left out, by its members (``spec=weight,...``)."""
    pop = eval_population(cfg)
    if pop.specs == population(cfg).specs:
        return {cfg.env.population: pop}
    return {",".join(f"{s}={w:.4g}" for s, w in zip(pop.specs, pop.weights, strict=True)): pop}


def tasks_for(
    cfg: RunConfig,
    n: int,
    base_seed: int,
    iteration: int = 0,
    balanced: bool = False,
    pop: Population | None = None,
) -> list[TaskInstance]:
    """``n`` task instances drawn from ``pop`` (default: the config's population) and
    the config's seat setting (``balanced``: opponents by systematic sampling, see
    :func:`sample_tasks`)."""
    return sample_tasks(
        pop or population(cfg), n, base_seed=base_seed, iteration=iteration,
        seat=cfg.env.seat, balanced=balanced,
    )  # fmt: skip


def training_tasks(cfg: Any, iteration: int) -> tuple[list[TaskInstance], int]:
    """The tasks of one training batch and the rollouts per task.

    Under ``stationary`` grouping (MAGE) each of the B task instances has one opponent and
    is played ``group_size`` times. Under ``mixed`` grouping (the ablation) the G rollouts
    of a task seed each draw their own opponent from the population, so the group that
    shares a baseline spans opponents; every rollout is then its own task instance.
    """
    balanced = cfg.rollout.opponents == "balanced"
    tasks = tasks_for(cfg, cfg.rollout.tasks, cfg.rollout.seed, iteration, balanced)
    if cfg.advantages.grouping != "mixed":
        return tasks, cfg.rollout.group_size
    pop = population(cfg)
    mixed = [
        TaskInstance(task.seed, pop.sample(derive_seed("mixed", task.seed, r)), task.seat, draw=r)
        for task in tasks
        for r in range(cfg.rollout.group_size)
    ]
    return mixed, 1


def run_rollouts(
    cfg: RunConfig,
    graph: MetaEpisodeGraph,
    llm: Any,
    tasks: list[TaskInstance],
    group_size: int,
    on_done: Callable[[MetaEpisodeRecord], None] | None = None,
) -> list[MetaEpisodeRecord]:
    """Collect ``len(tasks) x group_size`` meta-episodes (blocking)."""
    return asyncio.run(
        collect_rollouts(
            graph,
            llm,
            env_name=cfg.env.name,
            tasks=tasks,
            group_size=group_size,
            concurrency=cfg.rollout.concurrency,
            max_turns=cfg.env.max_turns,
            on_done=on_done,
        )
    )


def check_conversation_budget(cfg: RunConfig, tokenizer: Any, context_window: int) -> int:
    """Refuse a conversation-layout config whose meta-episode could outgrow the context.

    The bound (:func:`~mage_rl.policy.conversation.conversation_token_bound`) takes K,
    the turns per episode and the response limits from the config, and measures the
    prompt pieces on the task itself: the first play prompt, and the fragments before a
    play and a reflect call, each doubled (observations and feedback vary in length).

    Returns:
        The bound in tokens (0 in the re-rendered layout, which is not checked here).

    Raises:
        ValueError: The bound exceeds ``context_window``; the message says how to fix it.
    """
    if cfg.meta.layout != "conversation":
        return 0

    options = graph_options(cfg)
    # Any opponent gives the prompt pieces; the policy itself (self) is not playing yet.
    opponent: Any = next((s for s in population(cfg).specs if not is_self(s)), None)
    opponent = opponent or PlaceholderOpponent()
    env = make_env(cfg.env.name, opponent, seat=resolve_seat(cfg.env.seat, 0),
                   max_turns=cfg.env.max_turns)  # fmt: skip
    obs = env.reset(0)
    state: dict[str, Any] = {
        "episode": 1, "step": 1, "observation": obs, "initial_observation": obs,
        "moves": [], "memory": [], "history": [{"index": 0, "initial_observation": obs,
        "moves": [], "feedback": "x " * 60, "outcome": "lost", "brief": ""}],
        "invalid_reason": "x " * 30,
    }  # fmt: skip
    ctx = MetaEpisodeContext(env=env, llm=None, options=options)  # type: ignore[arg-type]
    template = ConversationTemplate(tokenizer)
    conv = template.start(play_prompt(state, ctx))
    first = len(conv.ids)
    conv = template.append_response(conv, [tokenizer.eos_token_id or 0], "")
    turn_end, step = template.message_ids(conv, [step_message(state, ctx)])
    _, reflect = template.message_ids(conv, [reflect_message(state, ctx)])
    bound = conversation_token_bound(
        episodes=options.num_episodes,
        max_turns=env.max_turns,
        max_play_tokens=options.max_tokens,
        max_reflect_tokens=options.reflect_max_tokens if options.reflects else 0,
        first_prompt_tokens=first,
        message_tokens=2 * len(step),
        reflect_message_tokens=2 * len(reflect) if options.reflects else 0,
        turn_end_tokens=len(turn_end) + 1,
    )
    check_conversation_fits(bound, context_window)
    return bound
