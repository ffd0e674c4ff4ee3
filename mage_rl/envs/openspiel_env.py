"""One adapter from OpenSpiel games to the text-environment interface.

The adapter owns everything games share: chance sampling from the episode seed,
letting the opponent move until it is the agent's turn, parsing the ``<action>`` tag,
invalid-action handling, ``max_turns``, and the SPEC §3 rewards. A game adds a
:class:`GameRules` object with only what differs: how a state is shown, how an action is
read from text, how moves are described, and how a final state is scored.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyspiel

from mage_rl.envs.base import (
    LOSS_REWARD,
    NO_ACTION_TAG,
    WIN_REWARD,
    Outcome,
    StepInfo,
    StepResult,
    TextEnv,
    derive_seed,
)
from mage_rl.envs.opponents import Opponent


@dataclass
class FinalScore:
    """How a terminal state is scored for the agent.

    Attributes:
        outcome: ``won``, ``lost`` or ``draw``.
        reward: The task reward (SPEC §3).
        payoff: The game's payoff (chips; +1 / -1 in Liar's Dice), where it has one.
        feedback: Text shown after the episode (for example the revealed cards).
        extra: Game-specific details.
    """

    outcome: Outcome
    reward: float
    payoff: float | None = None
    feedback: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


class GameRules(ABC):
    """What one OpenSpiel game adds to the shared adapter.

    Attributes:
        game_name: OpenSpiel game name.
        invalid_penalty: ``c_inv`` (SPEC §3).
        length_penalty: ``c_len`` (SPEC §3).
        default_max_turns: Agent turns per episode, invalid ones included.
        payoff_unit: What ``info.payoff`` counts, in words for tables and reports.
        agent_seats: The seats an agent may take in a config (a game where only one
            side makes a real choice, such as the showdown's answerer, names that one);
            the exploitability of the first episode needs both.
        payoff_bounds: The smallest and largest payoff of one episode for the agent,
            where they are narrower than the game's utilities (which span both seats);
            intervals of payoffs are kept inside them.
    """

    game_name: str
    payoff_unit: str = "payoff per game"
    agent_seats: tuple[int, ...] = (0, 1)
    payoff_bounds: tuple[float, float] | None = None
    invalid_penalty: float = 0.5
    length_penalty: float = 2.0
    default_max_turns: int = 8

    @abstractmethod
    def task_description(self, seat: int) -> str:
        """Rules, the agent's seat and the answer format."""

    def brief_description(self, seat: int) -> str:
        """A short version for the ``compact`` prompt template (default: the full one)."""
        return self.task_description(seat)

    def brief_render(self, state: pyspiel.State, seat: int) -> str:
        """The state in few tokens for the ``compact`` template (default: :meth:`render`)."""
        return self.render(state, seat)

    def brief_summary(self, state: pyspiel.State, seat: int) -> str:
        """One short line about a finished game (default: none, see ``TextEnv``)."""
        return ""

    @abstractmethod
    def render(self, state: pyspiel.State, seat: int) -> str:
        """The agent's observation of ``state`` (only what its seat may see)."""

    @abstractmethod
    def action_text(self, state: pyspiel.State, player: int, action: int) -> str:
        """The text an agent writes for ``action`` (``BET``, ``(2, 3)``)."""

    @abstractmethod
    def parse(self, text: str, state: pyspiel.State, seat: int) -> int | str:
        """Read an action id from the tag's content, or return why it is invalid."""

    @abstractmethod
    def describe_move(self, state: pyspiel.State, player: int, action: int, seat: int) -> str:
        """One transcript line for a move (``state`` is the state before the move)."""

    def score(self, state: pyspiel.State, seat: int) -> FinalScore:
        """Win +10, loss -10, draw 0 from OpenSpiel's returns (games override)."""
        value = state.returns()[seat]
        if value > 0:
            return FinalScore("won", WIN_REWARD)
        if value < 0:
            return FinalScore("lost", LOSS_REWARD)
        return FinalScore("draw", 0.0)


def decision_states(game: pyspiel.Game) -> list[pyspiel.State]:
    """One state per (player, information set) of a game tree, in first-visit order."""
    seen: dict[tuple[int, str], pyspiel.State] = {}

    def walk(state: pyspiel.State) -> None:
        if state.is_terminal():
            return
        if state.is_chance_node():
            for action, _ in state.chance_outcomes():
                walk(state.child(action))
            return
        player = state.current_player()
        seen.setdefault((player, state.information_state_string(player)), state)
        for action in state.legal_actions():
            walk(state.child(action))

    walk(game.new_initial_state())
    return list(seen.values())


class OpenSpielEnv(TextEnv):
    """A two-player OpenSpiel game against a fixed opponent, seen as text.

    Args:
        rules: The game's :class:`GameRules`.
        opponent: The opponent in the other seat.
        seat: The agent's seat index.
        max_turns: Agent turns per episode; defaults to the game's.
    """

    def __init__(
        self,
        rules: GameRules,
        opponent: Opponent,
        seat: int = 0,
        max_turns: int | None = None,
    ) -> None:
        self.rules = rules
        self.game = pyspiel.load_game(rules.game_name)
        if self.game.num_players() != 2:
            raise ValueError(f"{rules.game_name} has {self.game.num_players()} players; need 2")
        if seat not in (0, 1):
            raise ValueError(f"seat must be 0 or 1, got {seat}")
        self.name = rules.game_name
        self.opponent = opponent
        self.seat = seat
        self.max_turns = max_turns or rules.default_max_turns
        if self.max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {self.max_turns}")
        self.invalid_penalty = rules.invalid_penalty
        self.length_penalty = rules.length_penalty
        self.state: pyspiel.State | None = None
        self.turns = 0
        self.done = True
        self._rng = np.random.default_rng(0)
        self._transcript: list[str] = []
        self._initial_observation = ""

    # -- episode control -------------------------------------------------------------

    def reset(self, seed: int) -> str:
        self._rng = np.random.default_rng(derive_seed("chance", seed))
        self.opponent.reset(derive_seed("opponent", seed))
        self.state = self.game.new_initial_state()
        self.turns = 0
        self.done = False
        self._transcript = []
        self._advance()
        if self.state.is_terminal():  # no game here ends before the agent's first move
            raise RuntimeError(f"{self.name} ended before the agent could act")
        self._initial_observation = self.rules.render(self.state, self.seat)
        return self._initial_observation

    def step(self, response: str) -> StepResult:
        info, content = self._start_step(response, started=self.state is not None)
        parsed: int | str
        if content is None:
            parsed = NO_ACTION_TAG
        else:
            parsed = self.rules.parse(content, self.state, self.seat)
        if isinstance(parsed, str):
            info.invalid, info.invalid_reason = True, parsed
        else:
            info.action = self.rules.action_text(self.state, self.seat, parsed)
            self._apply(parsed, info)
            self._advance(info)

        reward = 0.0
        if self.state.is_terminal():
            final = self.rules.score(self.state, self.seat)
            reward = final.reward
            info.outcome, info.payoff = final.outcome, final.payoff
            info.feedback, info.extra = final.feedback, final.extra
            self.opponent.observe(self.state, 1 - self.seat)
            self.opponent.hand_over(self.rules.score(self.state, 1 - self.seat).reward)
            self.done = True
        elif self.turns >= self.max_turns:
            info.outcome = "unfinished"
            info.feedback = f"The episode ran out of turns ({self.max_turns}) without a result."
            self.done = True
        return StepResult(self.rules.render(self.state, self.seat), reward, self.done, info)

    def legal_actions(self) -> list[str]:
        if self.state is None or self.state.is_terminal():
            return []
        return [
            self.rules.action_text(self.state, self.seat, a)
            for a in self.state.legal_actions(self.seat)
        ]

    # -- views -----------------------------------------------------------------------

    @property
    def task_description(self) -> str:
        return self.rules.task_description(self.seat)

    @property
    def brief_description(self) -> str:
        return self.rules.brief_description(self.seat)

    @property
    def brief_observation(self) -> str:
        if self.state is None:
            raise RuntimeError("brief_observation before reset()")
        return self.rules.brief_render(self.state, self.seat)

    @property
    def brief_summary(self) -> str:
        if self.state is None or not self.state.is_terminal():
            return ""
        return self.rules.brief_summary(self.state, self.seat)

    # -- internals -------------------------------------------------------------------

    def _apply(self, action: int, info: StepInfo | None = None) -> None:
        assert self.state is not None
        player = self.state.current_player()
        line = self.rules.describe_move(self.state, player, action, self.seat)
        self.state.apply_action(action)
        self._transcript.append(line)
        if info is not None:
            info.events.append(line)

    def _advance(self, info: StepInfo | None = None) -> None:
        """Play chance events and opponent moves until the agent must act."""
        assert self.state is not None
        while not self.state.is_terminal():
            if self.state.is_chance_node():
                actions, probs = zip(*self.state.chance_outcomes(), strict=True)
                self.state.apply_action(int(self._rng.choice(actions, p=probs)))
            elif self.state.current_player() == self.seat:
                return
            else:
                player = self.state.current_player()
                self._apply(self.opponent.act(self.state, player), info)
