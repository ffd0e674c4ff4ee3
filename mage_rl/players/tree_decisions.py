"""The agent's decisions in a two-player game's tree, and reading its policy there.

A :class:`Decision` is one information state of the agent's seat as the agent sees it:
the play prompt its graph would render there (:func:`decision_at` replays the state's
history through the text environment and the graph's own prompt code), and the
constrained answer of every legal action. A reader (:class:`ActionReader`, say
:class:`~mage_rl.players.model_reader.ModelReader`) turns decisions into ``pi(a | s)``;
:func:`read_policy` checks and tabulates it. Exploitability
(:mod:`mage_rl.eval.exploitability`) and the language-model opponents
(:mod:`mage_rl.players.seat_player`) are built on these.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import pyspiel

from mage_rl.envs import make_env
from mage_rl.envs.openspiel_env import OpenSpielEnv, decision_states
from mage_rl.envs.opponents import PlaceholderOpponent
from mage_rl.nodes.conversation import step_message
from mage_rl.nodes.core import action_choices, play_prompt
from mage_rl.nodes.prompts import Message
from mage_rl.nodes.state import GraphOptions, MetaEpisodeContext, MetaEpisodeState

if TYPE_CHECKING:
    from mage_rl.envs.policy_opponents import PolicyTable


@dataclass(frozen=True)
class Decision:
    """One information state of the agent's seat, as the agent sees it in episode 1 (or,
    after earlier hands, in a later episode: :class:`Past`).

    Attributes:
        seat: The agent's seat (0 or 1), the player to act.
        key: OpenSpiel's information state string.
        actions: The legal OpenSpiel action ids.
        choices: The constrained answer of each action, in the same order.
        messages: The play prompt (re-rendered layout), or the chat's first prompt
            (conversation layout).
        turns: Conversation layout only: per earlier decision of the episode, the answer
            given there and the user message appended after it; empty otherwise.
        layout: ``rerendered`` or ``conversation``.
        chat: Conversation layout, a later episode only: the chat before it (a
            :class:`~mage_rl.policy.conversation.Conversation`); ``messages`` is then the
            user message that starts the episode.
    """

    seat: int
    key: str
    actions: tuple[int, ...]
    choices: tuple[str, ...]
    messages: tuple[Message, ...]
    turns: tuple[tuple[str, Message], ...] = ()
    layout: str = "rerendered"
    chat: Any = None


class ActionReader(Protocol):
    """Anything that gives ``pi(a | s)``: one probability per ``decision.actions``."""

    def __call__(self, decisions: Sequence[Decision]) -> list[list[float]]: ...


@dataclass(frozen=True)
class Past:
    """What a meta-episode shows before its episode ``episode`` (0-based): the earlier
    episodes' ``history`` entries and the ``memory`` (reflections), as the graph holds
    them, and in the conversation layout the chat so far (``chat``)."""

    episode: int
    history: tuple[dict[str, Any], ...] = ()
    memory: tuple[str, ...] = ()
    chat: Any = None


FIRST = Past(0)
"""Nothing before: the first episode."""


def _graph_state(
    step: int, initial: str, moves: list[str], observation: str, past: Past = FIRST
) -> MetaEpisodeState:
    """The graph state at a decision (as ``reset_episode``/``env_step`` leave it)."""
    return MetaEpisodeState(
        episode=past.episode, step=step, observation=observation, initial_observation=initial,
        moves=list(moves), invalid_reason="", memory=list(past.memory),
        history=list(past.history),
    )  # fmt: skip


def decision_at(
    env: OpenSpielEnv, ctx: MetaEpisodeContext, state: pyspiel.State, past: Past = FIRST
) -> Decision:
    """The :class:`Decision` of ``state``: replay its history as the environment plays it.

    ``past``: what came before this episode (default: nothing, the first episode).
    """
    seat, rules = env.seat, env.rules
    replay = env.game.new_initial_state()
    points: list[tuple[pyspiel.State, MetaEpisodeState]] = []  # the agent's decisions so far
    taken: list[int] = []  # the agent's action at each of them
    moves: list[str] = []
    initial = ""
    for action in state.history():
        if not replay.is_chance_node() and replay.current_player() == seat:
            observation = rules.render(replay, seat)
            initial = initial or observation
            points.append(
                (replay.clone(), _graph_state(len(points), initial, moves, observation, past))
            )
            taken.append(int(action))
        if points and not replay.is_chance_node():  # reset's own moves are not listed
            moves.append(rules.describe_move(replay, replay.current_player(), action, seat))
        replay.apply_action(action)
    observation = rules.render(replay, seat)
    points.append(
        (replay, _graph_state(len(points), initial or observation, moves, observation, past))
    )
    if len(points) > env.max_turns:
        raise ValueError(
            f"{env.name} has hands with {len(points)} decisions of seat {seat}, but "
            f"env.max_turns={env.max_turns} ends them earlier; raise env.max_turns"
        )

    def view(i: int) -> MetaEpisodeState:
        env.state = points[i][0].clone()  # what the env's properties (legal actions, lead) read
        return points[i][1]

    turns: list[tuple[str, Message]] = []
    if ctx.options.layout == "conversation":
        # The episode's first call starts the chat, or after earlier episodes continues it.
        messages = play_prompt(view(0), ctx) if past.chat is None else [step_message(view(0), ctx)]
        for i in range(1, len(points)):
            view(i - 1)  # the answer given there: its lead and legal actions read the env
            legal = [int(a) for a in points[i - 1][0].legal_actions(seat)]
            reply = action_choices(ctx)[legal.index(taken[i - 1])]
            turns.append((reply, step_message(view(i), ctx)))
    else:
        messages = play_prompt(view(len(points) - 1), ctx)
    view(len(points) - 1)
    return Decision(
        seat=seat,
        key=state.information_state_string(seat),
        actions=tuple(int(a) for a in state.legal_actions(seat)),
        choices=tuple(action_choices(ctx)),
        messages=tuple(messages),
        turns=tuple(turns),
        layout=ctx.options.layout,
        chat=past.chat if ctx.options.layout == "conversation" else None,
    )


def agent_decisions(
    env_name: str, options: GraphOptions, max_turns: int | None = None
) -> list[Decision]:
    """Every information state of both seats with the prompt of episode 1 there.

    Args:
        env_name: A two-player OpenSpiel environment (``kuhn_poker``, ``leduc_poker``...).
        options: The graph options the agent plays with (``runtime.graph_options``).
        max_turns: ``env.max_turns`` of the config (the game's default when ``None``).

    Raises:
        ValueError: The environment is no two-player OpenSpiel game, or its turn limit
            would end a hand before the game does.
    """
    decisions = []
    for seat in (0, 1):
        env = make_env(env_name, PlaceholderOpponent(), seat=seat, max_turns=max_turns)
        if not isinstance(env, OpenSpielEnv):
            raise ValueError(
                f"{env_name} is no two-player OpenSpiel game; exploitability needs its game tree"
            )
        env.reset(0)
        ctx = MetaEpisodeContext(env=env, llm=None, options=options)  # type: ignore[arg-type]
        for state in decision_states(env.game):
            if state.current_player() == seat:
                decisions.append(decision_at(env, ctx, state))
    return decisions


# -- reading a policy --------------------------------------------------------------------


def read_policy(decisions: Sequence[Decision], reader: ActionReader) -> PolicyTable:
    """``{information state: [(action, probability), ...]}`` for every decision.

    Raises:
        ValueError: A distribution that is not one (negative, or not summing to 1 within
            1e-4: the reader does not read a constrained policy).
    """
    dists = reader(decisions)
    table: PolicyTable = {}
    for decision, probs in zip(decisions, dists, strict=True):
        total = float(sum(probs))
        if len(probs) != len(decision.actions) or min(probs) < 0 or abs(total - 1) > 1e-4:
            raise ValueError(
                f"the reader gave {list(probs)} at {decision.key!r} (seat {decision.seat}) for "
                f"{len(decision.actions)} actions; it must give a probability distribution"
            )
        # Float32 sums are 1 within ~1e-7; normalise so OpenSpiel sees a distribution.
        table[decision.key] = [
            (a, float(p) / total) for a, p in zip(decision.actions, probs, strict=True)
        ]
    return table
