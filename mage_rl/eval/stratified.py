"""Stratified evaluation of two-player games: every opponent, seat and last deal alike.

Most of the spread of a poker payoff is the luck of the deal: holding the king wins,
holding the jack loses, whatever the policy does. An evaluation that draws deals at
random needs hundreds of meta-episodes before its interval on ev@K is narrow enough to
tell two policies apart. Stratified sampling removes that part of the spread:

1. The strata are every (opponent, seat, chance outcomes of the last episode before the
   agent's first move), e.g. 3 opponents x 2 seats x 6 Kuhn deals = 36 strata.
2. :func:`stratified_tasks` finds, for each stratum, ``per_stratum`` task seeds whose last
   episode deals exactly that (a task seed fixes every episode's deal), so each stratum
   is played equally often. Earlier episodes are dealt as usual.
3. Each stratum has a weight: the opponent's population weight, times the seat's share
   (one half each under ``seat: sampled``), times the chance probability of the deal.
4. :func:`~mage_rl.eval.stats.stratified_mean` estimates a mean payoff as ``sum_h W_h * mean_h``, with the
   variance ``sum_h W_h**2 * s_h**2 / n_h`` of the within-stratum spreads only
   (Cochran, *Sampling Techniques*, ch. 5), and a Student-t interval with ``n - H``
   degrees of freedom.

The estimate is unbiased for the same population-weighted value that plain sampling
estimates; only its interval is narrower, by how much of the payoff's variance the deal,
seat and opponent explain.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyspiel

from mage_rl.envs import env_spec, make_env
from mage_rl.envs.base import episode_seed
from mage_rl.envs.openspiel_env import OpenSpielEnv
from mage_rl.eval.stats import stratified_mean
from mage_rl.graphs.rollouts import TaskInstance
from mage_rl.records import MetaEpisodeRecord

MAX_SCAN = 200_000


@dataclass(frozen=True)
class StratifiedDesign:
    """The tasks of a stratified evaluation and each stratum's weight.

    Attributes:
        tasks: ``per_stratum`` task instances per stratum, stratum by stratum.
        strata: The stratum key of each task (``opponent|seat|deal``).
        weights: The weight of each stratum key (they sum to 1).
    """

    tasks: list[TaskInstance]
    strata: list[str]
    weights: dict[str, float]

    def key_of(self, record: MetaEpisodeRecord) -> str:
        """The stratum of a record played from one of :attr:`tasks`."""
        return self._keys[(record.seed, record.opponent, record.seat)]

    @property
    def _keys(self) -> dict[tuple[int, str, int], str]:
        return {
            (t.seed, t.opponent, t.seat): k for t, k in zip(self.tasks, self.strata, strict=True)
        }


def _seats(seat: str) -> list[tuple[int, float]]:
    if seat == "sampled":
        return [(0, 0.5), (1, 0.5)]
    if seat in ("first", "second"):
        return [(0 if seat == "first" else 1, 1.0)]
    raise ValueError(f"stratified evaluation: unknown seat {seat!r} (first, second, sampled)")


def _last_deal(env: Any, task_seed: int, num_episodes: int, protocol: str) -> tuple[int, ...]:
    """The chance outcomes of the last episode before the agent first acts."""
    env.reset(episode_seed(task_seed, num_episodes - 1, protocol))
    return tuple(int(a.action) for a in env.state.full_history() if a.player < 0)


def _deal_probability(game: Any, deal: tuple[int, ...]) -> float:
    state = game.new_initial_state()
    prob = 1.0
    for action in deal:
        prob *= dict(state.chance_outcomes())[action]
        state.apply_action(action)
    return prob


def stratified_tasks(
    env_name: str,
    population: Any,
    seat: str,
    *,
    per_stratum: int,
    num_episodes: int,
    protocol: str,
    base_seed: int,
    max_scan: int = MAX_SCAN,
) -> StratifiedDesign:
    """The tasks of a stratified evaluation (see the module docstring).

    Args:
        env_name: A registered two-player OpenSpiel environment (Kuhn Poker, Leduc...).
        population: The opponents (:class:`~mage_rl.envs.Population`).
        seat: ``first``, ``second`` or ``sampled``.
        per_stratum: Task instances per stratum (at least 2, for a spread).
        num_episodes: K; the last episode's deal defines the stratum.
        protocol: ``fresh`` or ``replay`` (under ``replay`` every episode has that deal).
        base_seed: Task seeds are scanned upwards from here.
        max_scan: Most seeds scanned before giving up.

    Raises:
        ValueError: The environment is not a two-player OpenSpiel game, or
            ``per_stratum < 2``. A game without chance moves is stratified over opponent
            and seat only.
        RuntimeError: ``max_scan`` seeds do not cover every deal.
    """
    if per_stratum < 2:
        raise ValueError(f"stratified evaluation needs per_stratum >= 2, got {per_stratum}")
    seats = _seats(seat)
    probe = make_env(env_name, population.specs[0], seat=seats[0][0])
    if not isinstance(probe, OpenSpielEnv):
        raise ValueError(
            f"stratified evaluation needs a two-player OpenSpiel game with chance moves; "
            f"{env_name} is not one (turn eval.stratify off)"
        )
    # The deal comes from the chance seed alone: one probe environment finds every seed.
    seeds_by_deal: dict[tuple[int, ...], list[int]] = defaultdict(list)
    deals = _all_first_deals(probe.game, probe.seat)
    if not deals:
        raise ValueError(f"{env_name} has no state where the agent acts; nothing to stratify")
    # A game without chance moves (rock-paper-scissors) has one deal, (): its strata are
    # the opponents and seats alone.
    wanted = len(deals) * per_stratum
    found = 0
    for seed in range(base_seed, base_seed + max_scan):
        deal = _last_deal(probe, seed, num_episodes, protocol)
        if len(seeds_by_deal[deal]) < per_stratum:
            seeds_by_deal[deal].append(seed)
            found += 1
            if found == wanted:
                break
    else:
        raise RuntimeError(
            f"{max_scan} task seeds did not cover the {len(deals)} deals of {env_name}"
        )
    tasks, strata, weights = [], [], {}
    for spec, opp_weight in zip(population.specs, population.weights, strict=True):
        for seat_index, seat_share in seats:
            for deal in sorted(seeds_by_deal):
                key = f"{spec}|{seat_index}|{'.'.join(map(str, deal))}"
                weights[key] = float(opp_weight) * seat_share * _deal_probability(probe.game, deal)
                for seed in seeds_by_deal[deal]:
                    tasks.append(TaskInstance(seed, spec, seat_index))
                    strata.append(key)
    total = sum(weights.values())
    return StratifiedDesign(tasks, strata, {k: w / total for k, w in weights.items()})


def _all_first_deals(game: Any, seat: int) -> list[tuple[int, ...]]:
    """Every sequence of chance outcomes from the start until a player moves."""
    out: list[tuple[int, ...]] = []

    def walk(state: Any, deal: tuple[int, ...]) -> None:
        if state.is_chance_node():
            for action, _ in state.chance_outcomes():
                walk(state.child(action), deal + (int(action),))
        else:
            out.append(deal)

    walk(game.new_initial_state(), ())
    return out


def payoff_range(env_name: str) -> tuple[float | None, float | None]:
    """The smallest and largest payoff of one episode of an OpenSpiel game (its
    utilities), or ``(None, None)`` for a task without a game."""
    rules = env_spec(env_name).rules
    if rules is None:
        return None, None
    if rules.payoff_bounds is not None:
        return rules.payoff_bounds
    game = pyspiel.load_game(rules.game_name)
    return float(game.min_utility()), float(game.max_utility())


def stratified_ev(
    records: Sequence[MetaEpisodeRecord],
    design: StratifiedDesign,
    num_episodes: int,
    level: float = 0.95,
    bounds: tuple[float | None, float | None] = (None, None),
) -> dict[str, Any]:
    """Stratified ev@k (k = 1..K), overall and per seat, as ``Estimate`` dicts, their
    intervals inside ``bounds`` (the payoff range of one episode) when given.

    An episode without a chip payoff (abandoned after invalid answers) counts as 0 chips
    here, unlike plain ev@k, which leaves it out: a stratified mean needs every task.
    """

    def block(recs: Sequence[MetaEpisodeRecord]) -> list[dict[str, Any]]:
        keys = [design.key_of(r) for r in recs]
        out = []
        for k in range(num_episodes):
            values = [
                float(r.episodes[k].payoff or 0.0) if len(r.episodes) > k else 0.0 for r in recs
            ]
            out.append(stratified_mean(values, keys, design.weights, level, bounds).to_dict())
        return out

    by_seat = {
        name: {"ev@k": block([r for r in records if r.seat == index])}
        for index, name in ((0, "first"), (1, "second"))
        if any(r.seat == index for r in records)
    }
    return {"ev@k": block(records), "by_seat": by_seat}
