"""Rock-paper-scissors against opponents with habits and strategies: the smallest
identification game.

One round is one episode, so a meta-episode of K rounds asks exactly MAGE's question:
can the agent read, from the rounds it has seen, how the opponent it meets again plays,
and exploit it in the last round? OpenSpiel's ``matrix_rps`` is a simultaneous-move game;
its turn-based wrapper lets the shared adapter play it (the opponent's choice is hidden
until the round is over, when the feedback states it).

Opponents (``rps:NAME``), by family (:data:`FAMILIES`):

- habits: ``always_rock``, ``always_paper``, ``always_scissors``, the same move every
  round (population ``rps_train``, the main job's, weights 1/3 each);
- biased: ``mostly_rock``, ``mostly_paper``, ``mostly_scissors``, the habit 3 rounds in 5,
  each other move 1 in 5, drawn afresh each round (population ``rps_unseen``);
- reactive: ``copies_you``, ``beats_you``, ``loses_to_you``, the agent's previous move,
  the move that beats it, the move that loses to it (a random first move);
- cycles: ``cycle_up`` (ROCK -> PAPER -> SCISSORS) and ``cycle_down`` (the other way), from
  a random first move;
- outcome: ``win_stay_lose_shift`` and ``win_shift_lose_stay``, which react to their own
  previous result (a random first move);
- ``cycle``: ROCK, PAPER, SCISSORS, ... from the meta-episode's first round;
- ``uniform``: each move with probability 1/3 (the Nash equilibrium; nothing to read).

``rps_families_train`` holds the habits, biased, reactive and cycle families, each weighing
a quarter; ``rps_families_unseen`` the outcome family, held out; ``rps_sequences_train``
the habits and the cycles, each weighing a half (opponents whose next move follows from
their own earlier moves). Every opponent is a
:data:`Model`, the distribution of its next move given the earlier rounds, which the live
opponent draws from and the exact values (:mod:`mage_rl.envs.rps_values`, ``mage oracle
rps``) enumerate.

Rewards (SPEC §3): win +10, loss -10, draw 0; the payoff is +1, -1 or 0 per round.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from mage_rl.envs.openspiel_env import FinalScore, GameRules
from mage_rl.envs.opponents import Opponent, register_opponent_factory, register_population

MOVES = ("ROCK", "PAPER", "SCISSORS")  # matrix_rps action ids 0, 1, 2
GAME = "rock_paper_scissors"
HABIT_SHARE = 0.6  # a ``mostly_*`` opponent's habit; each other move gets half the rest


def payoff(mine: int, theirs: int) -> int:
    """+1 when ``mine`` beats ``theirs``, -1 when it loses, 0 on a draw."""
    return 0 if mine == theirs else (1 if (mine - theirs) % 3 == 1 else -1)


def counter(move: int) -> int:
    """The move that beats ``move``."""
    return (move + 1) % 3


class RockPaperScissorsRules(GameRules):
    game_name = "turn_based_simultaneous_game(game=matrix_rps())"
    invalid_penalty = 0.5
    default_max_turns = 2
    payoff_unit = "wins minus losses per round"

    def task_description(self, seat: int) -> str:
        return (
            "You play rock-paper-scissors. ROCK beats SCISSORS, SCISSORS beats PAPER, "
            "PAPER beats ROCK. Each round, answer with one move inside the tags: "
            "<action>ROCK</action>, <action>PAPER</action> or <action>SCISSORS</action>."
        )

    def brief_description(self, seat: int) -> str:
        return (
            "Rock-paper-scissors: ROCK beats SCISSORS, SCISSORS beats PAPER, PAPER beats "
            "ROCK. Answer <action>ROCK</action>, <action>PAPER</action> or "
            "<action>SCISSORS</action>."
        )

    def render(self, state, seat: int) -> str:
        return "Choose your move: ROCK, PAPER or SCISSORS."

    def action_text(self, state, player: int, action: int) -> str:
        return MOVES[action]

    def parse(self, text: str, state, seat: int) -> int | str:
        word = text.strip().upper()
        if word not in MOVES:
            return f"{text.strip()!r} is not a move; write ROCK, PAPER or SCISSORS"
        return MOVES.index(word)

    def describe_move(self, state, player: int, action: int, seat: int) -> str:
        return f"You played {MOVES[action]}" if player == seat else "The opponent chose."

    def score(self, state, seat: int) -> FinalScore:
        final = super().score(state, seat)
        history = state.history()  # the two players' choices, in seat order
        mine, theirs = MOVES[history[seat]], MOVES[history[1 - seat]]
        final.feedback = f"You played {mine}, the opponent played {theirs}."
        final.payoff = float(state.returns()[seat])
        return final


# -- opponents -------------------------------------------------------------------------

Round = tuple[int | None, int]
"""One finished round as an opponent remembers it: (the agent's move, its own move);
the agent's move is ``None`` when the round ended without one (invalid answers)."""

Model = Callable[[tuple[Round, ...]], tuple[float, float, float]]
"""An opponent's strategy: the distribution of its next move given the earlier rounds of
the meta-episode. The live opponent and the exact values (:mod:`~mage_rl.envs.rps_values`)
both draw from it, so they cannot disagree."""

UNIFORM = (1 / 3, 1 / 3, 1 / 3)


def _pure(move: int) -> tuple[float, float, float]:
    probs = [0.0, 0.0, 0.0]
    probs[move % 3] = 1.0
    return (probs[0], probs[1], probs[2])


def habit_probs(name: str) -> tuple[float, float, float] | None:
    """The per-round move distribution of a stationary opponent, or ``None`` for one
    whose moves depend on the earlier rounds."""
    if name == "uniform":
        return UNIFORM
    kind, _, move = name.partition("_")
    if move.upper() not in MOVES or kind not in ("always", "mostly"):
        return None
    habit = MOVES.index(move.upper())
    share = 1.0 if kind == "always" else HABIT_SHARE
    probs = [(1 - share) / 2] * 3
    probs[habit] = share
    return (probs[0], probs[1], probs[2])


def _reacts_to_you(shift: int) -> Model:
    """Plays the agent's previous move shifted by ``shift`` (0 copies it, +1 beats it, -1
    loses to it); a random move in the first round or after a round without one."""

    def model(history: tuple[Round, ...]) -> tuple[float, float, float]:
        if not history or history[-1][0] is None:
            return UNIFORM
        return _pure(history[-1][0] + shift)

    return model


def _cycles(step: int) -> Model:
    """A random first move, then ``step`` on from its own previous move every round."""

    def model(history: tuple[Round, ...]) -> tuple[float, float, float]:
        return _pure(history[-1][1] + step) if history else UNIFORM

    return model


def _after_result(on_win: int, otherwise: int) -> Model:
    """A random first move; then its own previous move shifted by ``on_win`` after a
    round it won, by ``otherwise`` after a draw or a loss (0 repeats it, +1 moves on
    ROCK -> PAPER -> SCISSORS); a random move after a round without the agent's move."""

    def model(history: tuple[Round, ...]) -> tuple[float, float, float]:
        if not history or history[-1][0] is None:
            return UNIFORM
        agent, own = history[-1]
        return _pure(own + (on_win if payoff(own, agent) > 0 else otherwise))

    return model


def _cycle_from_rock(history: tuple[Round, ...]) -> tuple[float, float, float]:
    return _pure(len(history))


HISTORY_MODELS: dict[str, tuple[Model, str]] = {
    "copies_you": (_reacts_to_you(0), "plays your previous move"),
    "beats_you": (_reacts_to_you(1), "plays the move that beats your previous move"),
    "loses_to_you": (_reacts_to_you(-1), "plays the move that loses to your previous move"),
    "cycle_up": (_cycles(1), "ROCK -> PAPER -> SCISSORS -> ..., from a random first move"),
    "cycle_down": (_cycles(-1), "ROCK -> SCISSORS -> PAPER -> ..., from a random first move"),
    "win_stay_lose_shift": (
        _after_result(0, 1),
        "repeats its move after a win, moves on (ROCK -> PAPER -> SCISSORS) otherwise",
    ),
    "win_shift_lose_stay": (
        _after_result(1, 0),
        "moves on (ROCK -> PAPER -> SCISSORS) after a win, repeats its move otherwise",
    ),
    "cycle": (_cycle_from_rock, "ROCK, PAPER, SCISSORS, ... from the meta-episode's first round"),
}
"""The opponents whose moves depend on the earlier rounds, with what each does."""


_PLUGGED: dict[str, Model] = {}


def opponent_model(name: str) -> Model:
    """The strategy of ``rps:NAME`` (a built-in one or one of :func:`register_rps_opponent`).

    Raises:
        ValueError: An unknown name.
    """
    probs = habit_probs(name)
    if probs is not None:
        return lambda history: probs
    if name in HISTORY_MODELS:
        return HISTORY_MODELS[name][0]
    if name in _PLUGGED:
        return _PLUGGED[name]
    known = ", ".join([*OPPONENTS, *_PLUGGED])
    raise ValueError(
        f"unknown rock-paper-scissors opponent {name!r} (exact values exist for the built-in "
        f"ones and those of register_rps_opponent): known: {known}"
    )


def register_rps_opponent(name: str, model: Model) -> None:
    """Register ``rps:NAME``, an opponent that plays ``model``: the distribution of its
    next move (ROCK, PAPER, SCISSORS) given the earlier rounds of the meta-episode, a
    tuple of (the agent's move or ``None``, its own move) pairs. It plays in every
    command, and ``mage oracle rps`` and the training report give its exact values.

    Raises:
        ValueError: A built-in name, or a model whose answer to the first round is not a
            distribution over the three moves.
    """
    if name in OPPONENTS:
        raise ValueError(f"rps:{name} is built in; choose another name")
    first = tuple(float(p) for p in model(()))
    if len(first) != 3 or min(first) < 0 or abs(sum(first) - 1) > 1e-9:
        raise ValueError(
            f"rps:{name}: the model must return three probabilities summing to 1, got {first}"
        )
    _PLUGGED[name] = model
    register_opponent_factory(GAME, name, _factory(name), f"rps:{name}")


class ModelOpponent(Opponent):
    """Plays a :data:`Model`: each round it draws its move from the model's distribution
    given the rounds this meta-episode has had, with the round's own seed.

    Every meta-episode builds its own opponent, and ``reset`` runs before each round;
    :meth:`observe` records what the agent played once the round is over.
    """

    def __init__(self, model: Model) -> None:
        self.model = model
        self.history: list[Round] = []
        self._rng = np.random.default_rng(0)
        self._open = False  # a round started and not yet recorded
        self._own: int | None = None

    def reset(self, seed: int) -> None:
        if self._open:  # the last round ended without a result: the agent's move unknown
            self.history.append((None, self._own if self._own is not None else 0))
        self._rng = np.random.default_rng(seed)
        self._open, self._own = True, None

    def act(self, state: Any, player: int) -> int:
        probs = np.asarray(self.model(tuple(self.history)), dtype=float)
        self._own = int(self._rng.choice(3, p=probs))
        return self._own

    def observe(self, state: Any, player: int) -> None:
        moves = state.history()  # both seats' choices, in seat order
        self.history.append((int(moves[1 - player]), int(moves[player])))
        self._open = False

    def action_probabilities(self, state: Any, player: int) -> dict[int, float]:
        return {a: float(p) for a, p in enumerate(self.model(tuple(self.history)))}


def _factory(name: str):
    model = opponent_model(name)

    def build(args: Sequence[str]) -> Opponent:
        if args:
            raise ValueError(f"opponent rps:{name} takes no arguments, got {list(args)}")
        return ModelOpponent(model)

    return build


OPPONENTS = (
    *(f"always_{m.lower()}" for m in MOVES),
    *(f"mostly_{m.lower()}" for m in MOVES),
    *HISTORY_MODELS,
    "uniform",
)

FAMILIES: dict[str, tuple[str, ...]] = {
    "habits": tuple(f"always_{m.lower()}" for m in MOVES),
    "reactive": ("copies_you", "beats_you", "loses_to_you"),
    "cycles": ("cycle_up", "cycle_down"),
    "biased": tuple(f"mostly_{m.lower()}" for m in MOVES),
    "outcome": ("win_stay_lose_shift", "win_shift_lose_stay"),
}
"""Opponent families: how the next move depends on the history. ``rps_families_train``
holds the first four, every family weighing the same; ``rps_families_unseen`` holds the
held-out family, ``outcome`` (the opponent reacts to its own previous result)."""

TRAIN_FAMILIES = ("habits", "reactive", "cycles", "biased")
UNSEEN_FAMILIES = ("outcome",)
SEQUENCE_FAMILIES = ("habits", "cycles")


def family_of(spec: str) -> str | None:
    """The family of an opponent spec (``rps:beats_you`` -> ``reactive``), if any."""
    name = spec.rpartition(":")[2]
    return next((f for f, names in FAMILIES.items() if name in names), None)


def _families_population(families: Sequence[str]) -> str:
    """Every family weighs the same; opponents within a family too (weights as integers)."""
    size = int(np.lcm.reduce([len(FAMILIES[f]) for f in families]))
    return ",".join(
        f"rps:{name}={size // len(FAMILIES[f])}" for f in families for name in FAMILIES[f]
    )


def register_opponents() -> None:
    """Register the opponents and presets; called by :mod:`mage_rl.envs.builtins`."""
    for name in OPPONENTS:
        register_opponent_factory(GAME, name, _factory(name), f"rps:{name}")
    register_population("rps_train", ",".join(f"rps:always_{m.lower()}=1" for m in MOVES))
    register_population("rps_unseen", ",".join(f"rps:mostly_{m.lower()}=1" for m in MOVES))
    register_population("rps_families_train", _families_population(TRAIN_FAMILIES))
    register_population("rps_families_unseen", _families_population(UNSEEN_FAMILIES))
    register_population("rps_sequences_train", _families_population(SEQUENCE_FAMILIES))
