"""Showdown: a bet to call or fold, where finding out what the opponent is costs chips.

The smallest game in which MAGE's final-episode objective and per-episode credit want
different first moves (SPEC §11). Each episode the opponent bets; the agent answers CALL
or FOLD. FOLD pays 0 and shows nothing. CALL pays +1 chip when the opponent bet a weak
hand (a bluff) and -1.5 when it bet a strong one, and the showdown shows which. The
opponent is one of two hidden types, kept for the whole meta-episode:

- ``showdown:bluffer[:B]``: bets a weak hand with probability ``B`` (default 1), a
  strong one otherwise, drawn afresh every episode;
- ``showdown:honest``: always bets a strong hand.

Against ``showdown_train`` (each type 1/2) calling blind loses 0.25 chips an episode,
so play that judges an episode by itself folds, learns nothing, and earns 0 in every
episode. One call shows the type: a last episode that exploits it (call the bluffer,
fold to the honest bettor) earns +0.5. Whether the first call is worth its price is
exactly what the objectives disagree on; :mod:`mage_rl.envs.showdown_values` and
``mage oracle showdown`` give the exact optimum of each.

The game is a two-player OpenSpiel game written in Python (``python_mage_showdown``):
player 0 (the opponent) picks the hand it bets, player 1 (the agent, seat ``second``)
answers without seeing it. Rewards follow SPEC §3 at 10 per chip: a won call +10, a lost
one -15, a fold 0 (a draw).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyspiel

from mage_rl.envs.openspiel_env import FinalScore, GameRules
from mage_rl.envs.opponents import Opponent, register_opponent_factory, register_population

GAME = "showdown"
GAME_NAME = "python_mage_showdown"
LOSS = 1.5  # chips lost by a call against a strong hand; a won call pays 1
REWARD_PER_CHIP = 10.0
HANDS = ("weak", "strong")  # the opponent's actions: 0 bets a weak hand, 1 a strong one
ANSWERS = ("FOLD", "CALL")  # the agent's actions
WEAK, STRONG = 0, 1
FOLD, CALL = 0, 1
BET_SEAT, ANSWER_SEAT = 0, 1

_GAME_TYPE = pyspiel.GameType(
    short_name=GAME_NAME,
    long_name="mage-rl showdown (call or fold a bet)",
    dynamics=pyspiel.GameType.Dynamics.SEQUENTIAL,
    chance_mode=pyspiel.GameType.ChanceMode.DETERMINISTIC,
    information=pyspiel.GameType.Information.IMPERFECT_INFORMATION,
    utility=pyspiel.GameType.Utility.ZERO_SUM,
    reward_model=pyspiel.GameType.RewardModel.TERMINAL,
    max_num_players=2,
    min_num_players=2,
    provides_information_state_string=True,
    provides_information_state_tensor=False,
    provides_observation_string=True,
    provides_observation_tensor=False,
    provides_factored_observation_string=False,
)
_GAME_INFO = pyspiel.GameInfo(
    num_distinct_actions=2,
    max_chance_outcomes=0,
    num_players=2,
    min_utility=-LOSS,
    max_utility=LOSS,
    utility_sum=0.0,
    max_game_length=2,
)


class ShowdownGame(pyspiel.Game):
    """The OpenSpiel game: the bettor picks a hand, the answerer calls or folds."""

    def __init__(self, params: dict[str, Any] | None = None) -> None:
        super().__init__(_GAME_TYPE, _GAME_INFO, params or {})

    def new_initial_state(self) -> ShowdownState:
        return ShowdownState(self)

    def make_py_observer(self, iig_obs_type=None, params=None) -> _Observer:
        return _Observer()


class ShowdownState(pyspiel.State):
    """One bet: ``moves`` holds the hand bet, then the answer."""

    def __init__(self, game: ShowdownGame) -> None:
        super().__init__(game)
        self.moves: list[int] = []

    def current_player(self) -> int:
        if len(self.moves) >= 2:
            return pyspiel.PlayerId.TERMINAL
        return len(self.moves)

    def _legal_actions(self, player: int) -> list[int]:
        return [0, 1]

    def _apply_action(self, action: int) -> None:
        self.moves.append(int(action))

    def _action_to_string(self, player: int, action: int) -> str:
        return (HANDS if player == BET_SEAT else ANSWERS)[action]

    def is_terminal(self) -> bool:
        return len(self.moves) >= 2

    def returns(self) -> list[float]:
        if len(self.moves) < 2 or self.moves[1] == FOLD:
            return [0.0, 0.0]
        won = 1.0 if self.moves[0] == WEAK else -LOSS
        return [-won, won]

    def __str__(self) -> str:
        return " ".join(self._action_to_string(p, a) for p, a in enumerate(self.moves))


class _Observer:
    """What each seat knows: the bettor its hand; the answerer only that a bet came,
    and the hand once it called."""

    def __init__(self) -> None:
        self.tensor = np.zeros(0, np.float32)
        self.dict: dict[str, np.ndarray] = {}

    def set_from(self, state: ShowdownState, player: int) -> None:
        pass

    def string_from(self, state: ShowdownState, player: int) -> str:
        if player == BET_SEAT:
            return f"p0 {str(state)}"
        seen = "bet"
        if len(state.moves) >= 2:
            seen += f" {ANSWERS[state.moves[1]]}"
            if state.moves[1] == CALL:
                seen += f" {HANDS[state.moves[0]]}"
        return f"p1 {seen}"


pyspiel.register_game(_GAME_TYPE, ShowdownGame)


class ShowdownRules(GameRules):
    """The showdown as text; the agent answers the bet (seat ``second``)."""

    game_name = GAME_NAME
    payoff_unit = "chips per episode"
    invalid_penalty = 0.5
    length_penalty = 2.0
    default_max_turns = 2
    agent_seats = (ANSWER_SEAT,)
    payoff_bounds = (-LOSS, 1.0)

    def task_description(self, seat: int) -> str:
        return (
            "Each round the opponent bets. Some opponents bluff (bet weak hands), others "
            "never do; the same opponent plays every round. Answer "
            "<action>CALL</action> or <action>FOLD</action>. FOLD: 0 chips and its hand "
            f"stays hidden. CALL: its hand is shown; you win 1 chip against a weak hand "
            f"and lose {LOSS:g} chips against a strong one."
        )

    def brief_description(self, seat: int) -> str:
        return (
            "The opponent bets each round. CALL: +1 if it bluffed (weak hand), "
            f"-{LOSS:g} if strong; its hand is shown. FOLD: 0, hand hidden. Answer "
            "<action>CALL</action> or <action>FOLD</action>."
        )

    def render(self, state: pyspiel.State, seat: int) -> str:
        return "The opponent bets. CALL or FOLD?"

    def action_text(self, state: pyspiel.State, player: int, action: int) -> str:
        return (HANDS if player == BET_SEAT else ANSWERS)[action]

    def parse(self, text: str, state: pyspiel.State, seat: int) -> int | str:
        word = text.strip(" \t\r\n").strip(".!")
        if word.isascii() and word.upper() in ANSWERS:
            return ANSWERS.index(word.upper())
        return f"{text.strip()[:40]!r} is not an answer; write CALL or FOLD"

    def describe_move(self, state: pyspiel.State, player: int, action: int, seat: int) -> str:
        if player == seat:
            return f"You: {ANSWERS[action]}"
        return "The opponent bets."

    def brief_summary(self, state: pyspiel.State, seat: int) -> str:
        hand, answer = state.moves
        if answer == FOLD:
            return "you FOLD, hand hidden, +0"
        return f"you CALL, opp {HANDS[hand]}, {float(state.returns()[seat]):+g}"

    def score(self, state: pyspiel.State, seat: int) -> FinalScore:
        hand, answer = state.moves
        payoff = float(state.returns()[seat])
        extra: dict[str, Any] = {"answer": ANSWERS[answer]}
        if answer == FOLD:
            return FinalScore(
                "draw", 0.0, 0.0, "You folded; the hand stays hidden. 0 chips.", extra
            )
        extra["opponent_hand"] = HANDS[hand]
        if hand == WEAK:
            feedback = "You called: the opponent showed a weak hand, a bluff. You won 1 chip."
            return FinalScore("won", REWARD_PER_CHIP * payoff, payoff, feedback, extra)
        feedback = f"You called: the opponent showed a strong hand. You lost {LOSS:g} chips."
        return FinalScore("lost", REWARD_PER_CHIP * payoff, payoff, feedback, extra)


class Bettor(Opponent):
    """Bets a weak hand with probability ``bluff``, a strong one otherwise, each episode."""

    def __init__(self, bluff: float) -> None:
        self.bluff = float(bluff)
        self._rng = np.random.default_rng(0)

    def reset(self, seed: int) -> None:
        self._rng = np.random.default_rng(seed)

    def act(self, state: Any, player: int) -> int:
        return WEAK if self._rng.random() < self.bluff else STRONG

    def action_probabilities(self, state: Any, player: int) -> dict[int, float]:
        return {WEAK: self.bluff, STRONG: 1.0 - self.bluff}


def bluff_rate(spec: str) -> float:
    """The probability that the opponent named by ``spec`` bets a weak hand.

    Raises:
        ValueError: Not a showdown opponent, or a bluff rate outside [0, 1].
    """
    game, _, rest = spec.partition(":")
    if game not in (GAME, GAME_NAME):
        raise ValueError(f"{spec!r} is not a showdown opponent")
    name, *args = rest.split(":")
    if name == "honest" and not args:
        return 0.0
    if name == "bluffer" and len(args) <= 1:
        try:
            rate = float(args[0]) if args else 1.0
        except ValueError:
            rate = float("nan")
        if 0.0 <= rate <= 1.0:
            return rate
        raise ValueError(f"{spec!r}: the bluff rate must be a number in [0, 1]")
    raise ValueError(
        f"unknown showdown opponent {spec!r}: write showdown:bluffer[:B] (B in [0, 1], "
        "default 1) or showdown:honest"
    )


def _factory(name: str):
    def build(args: Sequence[str]) -> Opponent:
        return Bettor(bluff_rate(":".join((GAME, name, *args))))

    return build


def register_opponents() -> None:
    """Register the two types and their populations; called by :mod:`mage_rl.envs.builtins`."""
    register_opponent_factory(GAME, "bluffer", _factory("bluffer"), "showdown:bluffer[:B]")
    register_opponent_factory(GAME, "honest", _factory("honest"), "showdown:honest")
    register_population("showdown_train", "showdown:bluffer=1,showdown:honest=1")
    register_population("showdown_unseen", "showdown:bluffer:0.8=1,showdown:honest=1")
