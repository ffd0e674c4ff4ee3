"""Opponents, the opponent registry, and weighted populations.

An opponent is a fixed strategy for the other seat of a game. Every opponent is named
by a *spec string* of the form ``GAME:NAME[:ARG...]`` usable in YAML configs, for
example ``kuhn:aggressive``, ``kuhn:cfr``, ``ttt:mcts:100``,
``ttt:pattern:corners_first`` or ``ttt:random``.

Users register their own: any callable ``fn(state, player)`` (or
``fn(state, player, rng)`` for a randomised one) that returns a legal OpenSpiel action
id becomes an opponent::

    from mage_rl.envs import register_opponent

    def always_bet(state, player):
        return 1  # Kuhn Poker: 0 = PASS, 1 = BET

    register_opponent("kuhn", "always_bet", always_bet)
    # now "kuhn:always_bet" works in populations and configs
"""

from __future__ import annotations

import inspect
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mage_rl.envs.base import derive_seed
from mage_rl.envs.names import ENVS, canonical_game
from mage_rl.registry import PLUGIN_HINT


class Opponent(ABC):
    """A fixed strategy for one seat.

    Attributes:
        spec: The spec string this opponent was made from; it is the opponent id used
            in group and anchor keys.
    """

    spec: str = ""

    def reset(self, seed: int) -> None:  # noqa: B027 - deterministic opponents need nothing
        """Seed the opponent's own randomness for a new episode."""

    @abstractmethod
    def act(self, state: Any, player: int) -> int:
        """Choose a legal action id for ``player`` in the OpenSpiel ``state``."""

    def observe(self, state: Any, player: int) -> None:  # noqa: B027 - most keep nothing
        """The episode ended in a result: ``state`` is the terminal OpenSpiel state (what
        both seats played) and ``player`` this opponent's seat. An opponent that reacts
        to the agent's earlier play keeps what it needs here; the same object plays
        every episode of one meta-episode."""

    def hand_over(self, reward: float) -> None:  # noqa: B027 - most opponents keep nothing
        """The episode ended in a result; ``reward`` is the opponent seat's reward."""


class CallableOpponent(Opponent):
    """Wraps a user function ``fn(state, player[, rng])`` as an opponent."""

    def __init__(self, fn: Callable[..., int], spec: str) -> None:
        self.fn = fn
        self.spec = spec
        params = [
            p
            for p in inspect.signature(fn).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
        ]
        self._wants_rng = len(params) >= 3
        self._rng = np.random.default_rng(0)

    def reset(self, seed: int) -> None:
        self._rng = np.random.default_rng(seed)

    def act(self, state: Any, player: int) -> int:
        action = self.fn(state, player, self._rng) if self._wants_rng else self.fn(state, player)
        action = int(action)
        if action not in state.legal_actions(player):
            raise ValueError(
                f"opponent {self.spec!r} chose action {action}, which is not legal "
                f"(legal: {state.legal_actions(player)})"
            )
        return action


class PlaceholderOpponent(Opponent):
    """The other seat while prompts are built (no game is played with it): it moves only in ``reset`` (the prompts
    then set the environment's state themselves and never step it)."""

    def act(self, state: Any, player: int) -> int:
        return int(state.legal_actions(player)[0])


OpponentFactory = Callable[[Sequence[str]], Opponent]
_REGISTRY: dict[str, dict[str, tuple[OpponentFactory, str]]] = {}


def register_opponent_factory(
    game: str, name: str, factory: OpponentFactory, usage: str = ""
) -> None:
    """Register a factory that builds an opponent from the spec's extra arguments.

    Args:
        game: Game name or alias.
        name: Opponent name (the part after ``game:``).
        factory: Called with the remaining spec parts (``["100"]`` for ``ttt:mcts:100``).
        usage: How the spec is written, for error messages (defaults to ``game:name``).
    Raises:
        ValueError: The game is not a registered environment (register it first with
            :func:`~mage_rl.envs.register_env`), or the name holds a ``:``.
    """
    game = canonical_game(game)
    if not name or any(c in name for c in ":=, "):
        raise ValueError(f"opponent name {name!r} must be non-empty without ':', '=', ',' or space")
    _REGISTRY.setdefault(game, {})[name] = (factory, usage or f"{game}:{name}")


def register_opponent(game: str, name: str, fn: Callable[..., int]) -> None:
    """Register a user strategy ``fn(state, player[, rng]) -> action id`` under a name.

    The opponent is then available as ``"{game}:{name}"`` everywhere a spec is taken.
    """
    game_name = canonical_game(game)

    def factory(args: Sequence[str]) -> Opponent:
        if args:
            raise ValueError(f"opponent {game}:{name} takes no arguments, got {list(args)}")
        return CallableOpponent(fn, f"{game_name}:{name}")

    register_opponent_factory(game_name, name, factory)


def available_opponents(game: str | None = None) -> list[str]:
    """Usage strings of every registered opponent (of one game, or of all)."""
    games = [canonical_game(game)] if game else sorted(_REGISTRY)
    return sorted(usage for g in games for _, usage in _REGISTRY.get(g, {}).values())


def make_opponent(spec: str) -> Opponent:
    """Build an opponent from its spec string (``kuhn:aggressive``, ``ttt:mcts:100``...).

    Raises:
        ValueError: The spec names an unknown game or opponent; the message lists the
            valid ones.
    """
    parts = spec.split(":")
    if len(parts) < 2:
        raise ValueError(
            f"opponent spec {spec!r} must look like GAME:NAME[:ARG]; "
            f"valid: {', '.join(available_opponents())}"
        )
    game = canonical_game(parts[0])
    name, args = parts[1], parts[2:]
    entry = _REGISTRY.get(game, {}).get(name)
    if entry is None:
        valid = ", ".join(available_opponents(game)) or "none registered"
        raise ValueError(
            f"unknown opponent {spec!r}; valid for {game}: {valid}. To use your own, {PLUGIN_HINT}"
        )
    opponent = entry[0](args)
    opponent.spec = canonical_spec(spec)
    return opponent


def canonical_spec(spec: str) -> str:
    """The spec with the game alias expanded: ``kuhn:cfr`` -> ``kuhn_poker:cfr``."""
    parts = spec.split(":")
    return ":".join([canonical_game(parts[0]), *parts[1:]])


_WEIGHT_RULE = "weights must be finite numbers above 0"


class WeightError(ValueError):
    """A population weight that is not a finite number above 0."""


def _parse_weight(spec: str, text: str) -> float:
    """The weight written after ``spec=``: a finite number above 0."""
    try:
        weight = float(text)
    except ValueError:
        raise WeightError(
            f"opponent {spec!r} has weight {text.strip()!r}, not a number; {_WEIGHT_RULE}"
        ) from None
    if not math.isfinite(weight) or weight <= 0:
        raise WeightError(f"opponent {spec!r} has weight {text.strip()}; {_WEIGHT_RULE}")
    return weight


@dataclass(frozen=True)
class Population:
    """A weighted set of opponents; each meta-episode samples one (SPEC §1).

    Attributes:
        members: ``(spec, weight)`` pairs; weights are normalised on use.
    """

    members: tuple[tuple[str, float], ...]

    def __post_init__(self) -> None:
        if not self.members:
            raise ValueError("a population needs at least one opponent")
        for spec, weight in self.members:
            if not math.isfinite(weight) or weight < 0:
                kind = "negative weight" if weight < 0 else "weight"
                raise WeightError(f"opponent {spec!r} has {kind} {weight}; {_WEIGHT_RULE}")
            make_opponent(spec)  # validates the spec early, with the list of valid ones
        if sum(w for _, w in self.members) <= 0:
            raise ValueError("population weights must not all be zero")

    @property
    def specs(self) -> list[str]:
        return [canonical_spec(s) for s, _ in self.members]

    @property
    def weights(self) -> np.ndarray:
        w = np.array([w for _, w in self.members], dtype=float)
        return w / w.sum()

    def sample(self, seed: int) -> str:
        """The opponent of the meta-episode with this task seed (deterministic)."""
        rng = np.random.default_rng(derive_seed("population", seed))
        return self.specs[int(rng.choice(len(self.members), p=self.weights))]

    def systematic(self, n: int, seed: int) -> list[str]:
        """``n`` opponents for one batch by systematic sampling, in a random order.

        One uniform offset ``u`` picks the members at the cumulative weights
        ``(u + i) / n`` for ``i < n``: every member appears ``floor(n * w)`` or
        ``ceil(n * w)`` times, and each of the ``n`` draws (after the shuffle) is member
        ``j`` with probability ``w_j``, as with independent draws.
        """
        rng = np.random.default_rng(seed)
        edges = np.cumsum(self.weights)
        edges[-1] = 1.0
        points = (rng.random() + np.arange(n)) / n
        picks = np.minimum(np.searchsorted(edges, points, side="right"), len(edges) - 1)
        rng.shuffle(picks)
        return [self.specs[int(j)] for j in picks]

    @classmethod
    def parse(cls, text: str, game: str | None = None) -> Population:
        """Parse ``"a=0.3,b=0.7"``, a single spec, or a preset name.

        Bare names get the ``game`` prefix: ``conservative=0.3`` with ``game="kuhn"``
        means ``kuhn:conservative=0.3``.
        """
        if text in POPULATION_PRESETS:
            return POPULATION_PRESETS[text]
        members = []
        for item in text.split(","):
            item = item.strip()
            if not item:
                continue
            spec, _, weight = item.partition("=")
            spec = spec.strip()
            # Bare names take the game's prefix: "aggressive" and "mcts:300" alike.
            if game and spec.split(":")[0] not in ENVS:
                spec = f"{game}:{spec}"
            members.append((spec, _parse_weight(spec, weight) if weight else 1.0))
        return cls(tuple(members))


def _ttt_training_population() -> Population:
    patterns = [
        "centre_first",
        "corners_first",
        "edges_first",
        "diagonal",
        "anti_diagonal",
        "reversed",
    ]
    others = [f"tic_tac_toe:pattern:{p}" for p in patterns] + ["tic_tac_toe:random"]
    members = [("tic_tac_toe:mcts:100", 0.5)] + [(s, 0.5 / len(others)) for s in others]
    return Population(tuple(members))


class _Presets(dict):
    """Named populations, built on first use (building validates every spec)."""

    _builders: dict[str, Callable[[], Population]] = {
        "kuhn_train": lambda: Population(
            (
                ("kuhn_poker:conservative", 0.3),
                ("kuhn_poker:aggressive", 0.3),
                ("kuhn_poker:intermediate", 0.4),
            )
        ),
        "kuhn_unseen": lambda: Population((("kuhn_poker:cfr", 1.0),)),
        "ttt_train": _ttt_training_population,
        "ttt_unseen": lambda: Population((("tic_tac_toe:mcts:1000", 1.0),)),
        "sokoban_train": lambda: Population((("sokoban:boxes:2", 1.0),)),
        "sokoban_unseen": lambda: Population((("sokoban:boxes:1", 0.5), ("sokoban:boxes:3", 0.5))),
    }

    def __contains__(self, key: object) -> bool:
        return key in self._builders

    def __missing__(self, key: str) -> Population:
        if key not in self._builders:
            raise KeyError(f"unknown population preset {key!r}; valid: {sorted(self._builders)}")
        self[key] = self._builders[key]()
        return self[key]

    def names(self) -> list[str]:
        return sorted(self._builders)

    def register(self, name: str, population: Population | str | Callable[[], Population]) -> None:
        """Add a preset: a :class:`Population`, a ``"spec=w,..."`` string, or a builder."""
        if not name or any(c in name for c in ":=, "):
            raise ValueError(
                f"preset name {name!r} must be non-empty without ':', '=', ',' or space"
            )
        if isinstance(population, Population):
            self._builders = {**self._builders, name: lambda: population}
        elif isinstance(population, str):
            text = population
            self._builders = {**self._builders, name: lambda: Population.parse(text)}
        else:
            self._builders = {**self._builders, name: population}
        self.pop(name, None)


POPULATION_PRESETS = _Presets()
"""The training and evaluation populations of SPEC §7, by name: ``kuhn_train``,
``kuhn_unseen``, ``ttt_train``, ``ttt_unseen``, and for Sokoban the room variants
``sokoban_train`` (2 boxes) and ``sokoban_unseen`` (1 and 3 boxes)."""


def register_population(name: str, population: Population | str | Callable[[], Population]) -> None:
    """Register a population preset, usable as ``env.population: NAME`` and ``--opponents``.

    Args:
        name: Preset name.
        population: A :class:`Population`, a string such as
            ``"kuhn:always_bet=0.5,kuhn:aggressive=0.5"``, or a function that builds one
            (validated on first use, so it may name opponents registered later).
    """
    POPULATION_PRESETS.register(name, population)
