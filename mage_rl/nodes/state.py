"""State schema and run context of the meta-episode graph.

The state holds only plain data (strings, numbers, lists, dicts), so LangGraph
checkpointers can store it. Channels that grow over the meta-episode (reflection memory,
finished episodes, turn records) are append-only through the ``operator.add`` reducer;
the rest describe the current episode and are overwritten by the node that changes them.

Things that are not data (the environment, the chat model, the tracer that records
every call of the chat model) travel in the run context (:class:`MetaEpisodeContext`),
given to ``graph.ainvoke(..., context=...)``.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Annotated, Any, TypedDict

from langchain_core.language_models import BaseChatModel

from mage_rl.envs.base import PROTOCOLS, TextEnv
from mage_rl.nodes.tracing import Tracer

CONTEXT_MODES = ("reflection", "history", "history+reflection", "none")
PROMPT_TEMPLATES = ("standard", "compact")
LAYOUTS = ("rerendered", "conversation")
MAX_EPISODES = 10


class MetaEpisodeState(TypedDict, total=False):
    """The meta-episode graph's state.

    Attributes:
        episode: Index k of the current episode.
        step: Play turns taken in the current episode.
        observation: The latest observation (what the next play turn acts on).
        initial_observation: The current episode's first observation.
        moves: Moves of the current episode so far, as text.
        invalid_reason: Why the last answer was invalid ("" when it was valid).
        action: The response the environment consumes at the next ``env_step`` (the
            text ``play``, or the policy graph standing in its place, produced).
        invalid_steps: Invalid answers in the current episode so far.
        conversation: The conversation layout's chat as token ids
            (:class:`~mage_rl.policy.conversation.Conversation` as a dict); absent in the
            re-rendered layout.
        episode_done: The current episode has ended.
        meta_done: The meta-episode has ended.
        memory: Reflections, appended by ``reflect`` (the state channel of SPEC §2).
        history: Finished episodes (``PastEpisode`` dicts) for the history context.
        episodes: ``EpisodeResult`` dicts of finished episodes.
        turns: ``Turn`` dicts of every traced LLM call, in time order; filled from the
            tracer when the meta-episode ends (:meth:`MetaEpisodeGraph.run`).
    """

    episode: int
    step: int
    observation: str
    initial_observation: str
    moves: list[str]
    invalid_reason: str
    action: str
    invalid_steps: int
    conversation: dict[str, Any] | None
    episode_done: bool
    meta_done: bool
    memory: Annotated[list[str], operator.add]
    history: Annotated[list[dict[str, Any]], operator.add]
    episodes: Annotated[list[dict[str, Any]], operator.add]
    turns: Annotated[list[dict[str, Any]], operator.add]


@dataclass(frozen=True)
class GraphOptions:
    """How the meta-episode graph plays (validated when the graph is built).

    Attributes:
        num_episodes: K, episodes per meta-episode.
        context: What earlier episodes put into play prompts: ``reflection``,
            ``history``, ``history+reflection`` or ``none``.
        protocol: ``replay`` (same deal every episode) or ``fresh``.
        stop_on_success: End the meta-episode after a won episode.
        react: Ask for a ``Thought:`` line before the action (ReAct prompting).
        max_tokens: ``L_max`` for play turns.
        reflect_max_tokens: ``L_max`` for reflect turns.
        prompt: Play-prompt template: ``standard`` or ``compact`` (short, for small
            models; see :func:`~mage_rl.nodes.prompts.compact_play_messages`).
        constrain_actions: Constrained decoding on play turns: the response is one of
            ``<action>A</action>`` for the environment's legal actions ``A``, sampled from
            the restricted distribution (the chat model must accept ``choices``).
        layout: ``rerendered`` (every call gets a fresh prompt; the paper's) or
            ``conversation`` (the meta-episode is one growing chat of token ids, SPEC §2;
            needs a chat model over the local engine; see :mod:`mage_rl.nodes.conversation`).
    """

    num_episodes: int = 3
    context: str = "reflection"
    protocol: str = "replay"
    stop_on_success: bool = True
    react: bool = False
    max_tokens: int = 96
    reflect_max_tokens: int = 160
    prompt: str = "standard"
    constrain_actions: bool = False
    layout: str = "rerendered"

    def __post_init__(self) -> None:
        if not 1 <= self.num_episodes <= MAX_EPISODES:
            raise ValueError(
                f"num_episodes must be in 1..{MAX_EPISODES} (SPEC §1: K up to 10), "
                f"got {self.num_episodes}"
            )
        if self.context not in CONTEXT_MODES:
            raise ValueError(
                f"unknown context mode {self.context!r}; valid: {', '.join(CONTEXT_MODES)}"
            )
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"unknown protocol {self.protocol!r}; valid: {', '.join(PROTOCOLS)}")
        if self.max_tokens < 1 or self.reflect_max_tokens < 1:
            raise ValueError("max_tokens and reflect_max_tokens must be >= 1")
        if self.prompt not in PROMPT_TEMPLATES:
            raise ValueError(
                f"unknown prompt template {self.prompt!r}; valid: {', '.join(PROMPT_TEMPLATES)}"
            )
        if self.layout not in LAYOUTS:
            raise ValueError(f"unknown layout {self.layout!r}; valid: {', '.join(LAYOUTS)}")
        if self.constrain_actions and self.react:
            raise ValueError(
                "constrain_actions restricts the answer to the action tag, so the ReAct "
                "Thought line cannot be written; use the mage or reflexion agent"
            )

    @property
    def reflects(self) -> bool:
        """Whether a reflect turn runs between episodes."""
        return "reflection" in self.context


@dataclass
class MetaEpisodeContext:
    """Per-run objects handed to the graph's nodes.

    Attributes:
        env: The environment, already bound to the opponent and seat.
        llm: Any LangChain chat model; training needs one that returns token ids and
            log-probs in ``response_metadata`` (``PolicyChatModel``).
        options: The graph's options (set by :func:`run_meta_episode`).
        task_seed: Seed of the task instance; fixes every episode's deal.
        opponent: Opponent id (spec string).
        extra: Free room for nodes added by users (the dict passed to ``run(extra=)``,
            the same object).
        tracer: Records every call of ``llm`` as a sample (see
            :mod:`mage_rl.nodes.tracing`); nodes may :meth:`~Tracer.mark` a call.
    """

    env: TextEnv
    llm: BaseChatModel
    options: GraphOptions
    task_seed: int = 0
    opponent: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    tracer: Tracer = field(default_factory=Tracer)


def graph_options(cfg: Any) -> GraphOptions:
    """The meta-episode graph options of a run config (:class:`~mage_rl.config.RunConfig`)."""
    return GraphOptions(
        num_episodes=cfg.meta.episodes,
        context=cfg.meta.context,
        protocol=cfg.env.protocol,
        stop_on_success=cfg.meta.stop_on_success,
        react=cfg.meta.agent == "react",
        max_tokens=cfg.policy.max_tokens,
        reflect_max_tokens=max(cfg.policy.max_tokens, 2 * cfg.policy.max_tokens),
        prompt=cfg.meta.prompt,
        constrain_actions=cfg.policy.constrain_actions,
        layout=cfg.meta.layout,
    )
