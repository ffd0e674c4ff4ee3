"""Opponents given as policies rather than rules: uniform random, and CFR+ solutions.

Approximate equilibria of OpenSpiel games are solved once and cached on disk.

OpenSpiel's CFR+ (C++) runs for a given number of iterations; its average policy,
``{information state: [(action, probability), ...]}``, is written to
``$MAGE_RL_CACHE/cfr_plus_{game}_{iterations}.json`` so that a process does not solve it
again. Two users: the ``cfr`` opponent of Leduc (the argmax of that policy) and the
oracles, which bound a game's Nash value with it (see :mod:`mage_rl.eval.game_oracles`).
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

import numpy as np
import pyspiel

from mage_rl.cache import cache_root
from mage_rl.envs.openspiel_env import decision_states
from mage_rl.envs.opponents import Opponent
from mage_rl.fileio import atomic_write_json

PolicyTable = dict[str, list[tuple[int, float]]]


@lru_cache(maxsize=4)
def solve_cfr_plus(game_name: str, iterations: int) -> PolicyTable:
    """CFR+ average policy of ``game_name`` after ``iterations`` iterations (cached).

    Raises:
        ValueError: ``iterations`` is below 1.
    """
    if iterations < 1:
        raise ValueError(f"CFR+ needs at least one iteration, got {iterations}")
    path = cache_root() / f"cfr_plus_{game_name}_{iterations}.json"
    if path.exists():
        try:
            raw = json.loads(path.read_text())
            return {k: [(int(a), float(p)) for a, p in v] for k, v in raw.items()}
        except (ValueError, OSError, TypeError):
            pass  # a damaged cache file is solved again and overwritten
    game = pyspiel.load_game(game_name)
    solver = pyspiel.CFRPlusSolver(game)
    for _ in range(iterations):
        solver.evaluate_and_update_policy()
    average = solver.average_policy()
    table: PolicyTable = {}
    for state in decision_states(game):
        key = state.information_state_string(state.current_player())
        table[key] = [(int(a), float(p)) for a, p in average.get_state_policy(key)]
    # A cache: solving again is the cost of a lost write, so no fsync.
    atomic_write_json(path, table, indent=None, fsync=False, sort_keys=True)
    return table


class SolvedPolicyOpponent(Opponent):
    """Plays the most likely action of the CFR+ average policy (ties: lowest action id).

    The policy is solved (or read from the cache) on the first move, not on
    construction, so that naming the opponent in a population costs nothing.
    """

    def __init__(self, game_name: str, iterations: int) -> None:
        if iterations < 1:
            raise ValueError(f"the cfr opponent needs at least one iteration, got {iterations}")
        self.game_name = game_name
        self.iterations = iterations

    def act(self, state: pyspiel.State, player: int) -> int:
        table = solve_cfr_plus(self.game_name, self.iterations)
        probs = table[state.information_state_string(player)]
        return max(sorted(probs), key=lambda ap: ap[1])[0]


class UniformRandomOpponent(Opponent):
    """Uniform over the legal actions, seeded at every reset (OpenSpiel's random bot)."""

    def __init__(self) -> None:
        self._rng = np.random.default_rng(0)

    def reset(self, seed: int) -> None:
        self._rng = np.random.default_rng(seed)

    def act(self, state: Any, player: int) -> int:
        return int(self._rng.choice(state.legal_actions(player)))

    def action_probabilities(self, state: Any, player: int) -> dict[int, float]:
        """The exact distribution of :meth:`act`, for the oracles."""
        legal = state.legal_actions(player)
        return {int(a): 1.0 / len(legal) for a in legal}
