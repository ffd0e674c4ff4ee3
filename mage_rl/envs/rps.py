"""Rock-paper-scissors against opponents with habits: the smallest identification game.

One round is one episode, so a meta-episode of K rounds asks exactly MAGE's question:
can the agent read, from the rounds it has seen, the habit of the opponent it meets
again, and exploit it in the last round? OpenSpiel's ``matrix_rps`` is a simultaneous-
move game; its turn-based wrapper lets the shared adapter play it (the opponent's choice
is hidden until the round is over, when the feedback states it).

Opponents (``rps:NAME``):

- ``always_rock``, ``always_paper``, ``always_scissors``: the same move every round
  (population ``rps_train``, weights 1/3 each);
- ``mostly_rock``, ``mostly_paper``, ``mostly_scissors``: the habit 3 rounds in 5, each
  other move 1 in 5, drawn afresh each round (population ``rps_unseen``);
- ``cycle``: ROCK, PAPER, SCISSORS, ... from the meta-episode's first round;
- ``uniform``: each move with probability 1/3 (the Nash equilibrium; nothing to read).

Rewards (SPEC §3): win +10, loss -10, draw 0; the payoff is +1, -1 or 0 per round.
Exact values for a population (best fixed answer, best response to each opponent, and
the Bayes value of the last of K rounds) come from :func:`rps_values` and ``mage oracle
rps``.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import asdict, dataclass
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


class MixedHabit(Opponent):
    """Plays move ``a`` with probability ``probs[a]``, drawn afresh every round."""

    def __init__(self, probs: Sequence[float]) -> None:
        self.probs = np.asarray(probs, dtype=float)
        self._rng = np.random.default_rng(0)

    def reset(self, seed: int) -> None:
        self._rng = np.random.default_rng(seed)

    def act(self, state: Any, player: int) -> int:
        return int(self._rng.choice(3, p=self.probs))

    def action_probabilities(self, state: Any, player: int) -> dict[int, float]:
        return {a: float(p) for a, p in enumerate(self.probs)}


class Cycle(Opponent):
    """ROCK, then PAPER, then SCISSORS, ... over the rounds of one meta-episode.

    Every meta-episode builds its own opponent, and ``reset`` runs before each round.
    """

    def __init__(self) -> None:
        self.rounds = 0

    def reset(self, seed: int) -> None:
        self.rounds += 1

    def act(self, state: Any, player: int) -> int:
        return (self.rounds - 1) % 3


def habit_probs(name: str) -> tuple[float, float, float] | None:
    """The per-round move distribution of a stationary opponent, or ``None`` (``cycle``)."""
    if name == "uniform":
        return (1 / 3, 1 / 3, 1 / 3)
    kind, _, move = name.partition("_")
    if move.upper() not in MOVES or kind not in ("always", "mostly"):
        return None
    habit = MOVES.index(move.upper())
    share = 1.0 if kind == "always" else HABIT_SHARE
    probs = [(1 - share) / 2] * 3
    probs[habit] = share
    return (probs[0], probs[1], probs[2])


def _factory(name: str):
    def build(args: Sequence[str]) -> Opponent:
        if args:
            raise ValueError(f"opponent rps:{name} takes no arguments, got {list(args)}")
        if name == "cycle":
            return Cycle()
        probs = habit_probs(name)
        assert probs is not None
        return MixedHabit(probs)

    return build


OPPONENTS = (
    *(f"always_{m.lower()}" for m in MOVES),
    *(f"mostly_{m.lower()}" for m in MOVES),
    "cycle",
    "uniform",
)


def register_opponents() -> None:
    """Register the opponents and presets; called by :mod:`mage_rl.envs.builtins`."""
    for name in OPPONENTS:
        register_opponent_factory(GAME, name, _factory(name), f"rps:{name}")
    register_population("rps_train", ",".join(f"rps:always_{m.lower()}=1" for m in MOVES))
    register_population("rps_unseen", ",".join(f"rps:mostly_{m.lower()}=1" for m in MOVES))


# -- exact values ----------------------------------------------------------------------


@dataclass
class RpsValues:
    """Exact values of one round, per round in wins minus losses, for a population.

    Attributes:
        population: Opponent spec -> weight (normalised).
        episodes: K, the rounds of a meta-episode.
        best_fixed: The best answer that ignores what it has seen (any constant answer
            against a symmetric population): the value of a first round, and of a last
            round without memory.
        best_response: Per opponent, the value of the best answer to it alone.
        ceiling: The population mean of ``best_response``: knowing the opponent.
        bayes_last: The last round's value when the first K-1 rounds are seen and the
            last answer best-responds to the posterior over the opponents (whatever the
            agent played before: the opponents here do not react to it).
        win_best_fixed, win_bayes_last: The same two as win rates.
    """

    population: dict[str, float]
    episodes: int
    best_fixed: float
    best_response: dict[str, float]
    ceiling: float
    bayes_last: float
    win_best_fixed: float
    win_bayes_last: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def rps_values(population: dict[str, float], episodes: int = 3) -> RpsValues:
    """Exact values of :class:`RpsValues` by enumeration of the observed moves.

    Raises:
        ValueError: An opponent whose moves are not i.i.d. across rounds (``cycle``), an
            opponent of another game, or ``episodes < 1``.
    """
    if episodes < 1:
        raise ValueError(f"episodes must be >= 1, got {episodes}")
    specs, weights, probs = [], [], []
    total = sum(population.values())
    for spec, weight in population.items():
        game, _, name = spec.partition(":")
        if game not in ("rps", GAME):
            raise ValueError(f"{spec!r} is not a rock-paper-scissors opponent")
        p = habit_probs(name)
        if p is None:
            raise ValueError(
                f"{spec!r} changes its moves from round to round; exact values need "
                "opponents whose moves are drawn the same way every round"
            )
        specs.append(f"{GAME}:{name}")
        weights.append(weight / total)
        probs.append(np.asarray(p))
    value = np.array([[payoff(a, b) for b in range(3)] for a in range(3)], dtype=float)
    win = (value > 0).astype(float)

    def best(mix: np.ndarray) -> tuple[float, float]:
        """Value and win rate of the best answer to a move distribution."""
        a = int(np.argmax(value @ mix))
        return float(value[a] @ mix), float(win[a] @ mix)

    pooled = sum(w * p for w, p in zip(weights, probs, strict=True))
    best_fixed, win_fixed = best(pooled)
    best_response = {s: best(p)[0] for s, p in zip(specs, probs, strict=True)}
    bayes, bayes_win = 0.0, 0.0
    for seen in itertools.product(range(3), repeat=episodes - 1):
        joint = np.array(
            [w * np.prod([p[m] for m in seen]) for w, p in zip(weights, probs, strict=True)]
        )
        mass = float(joint.sum())
        if mass == 0:
            continue
        mix = sum(j * p for j, p in zip(joint, probs, strict=True)) / mass
        v, wr = best(mix)
        bayes += mass * v
        bayes_win += mass * wr
    return RpsValues(
        population=dict(zip(specs, weights, strict=True)),
        episodes=episodes,
        best_fixed=best_fixed,
        best_response=best_response,
        ceiling=sum(w * best_response[s] for s, w in zip(specs, weights, strict=True)),
        bayes_last=bayes,
        win_best_fixed=win_fixed,
        win_bayes_last=bayes_win,
    )
