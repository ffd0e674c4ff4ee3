"""Exact values of the showdown (SPEC §11): what each objective plays, and what it earns.

A meta-episode is K bets by one opponent drawn from a population of bettors, each of
which bets a weak hand with its own probability. What the agent knows before episode k
is the prior and the hands its calls have shown, so the posterior after ``w`` weak and
``s`` strong hands is a sufficient state; the values below come from backward induction
over ``(k, w, s)``, exact up to float rounding.

Two kinds of objective are solved:

- **What a player maximises** (:func:`objective_weights`): the last episode's payoff
  (``final``, MAGE's objective), the sum of all episodes (``sum``, cumulative credit),
  or each episode on its own (``greedy``, single-episode credit: greedy play with
  memory). The first two are ordinary Bayes-optimal control problems.
- **What a learner's credit rewards** (:func:`credit_weights`). The learner credits the
  answer of episode k with ``A_E + omega * A_S`` (SPEC §5): its episode-level score
  (``D_k`` or ``R_k``: that episode's result) plus ``omega`` times its step-wise return
  (SPEC §4). Baselines aside, the answer of episode k then climbs a weighted sum of the
  episodes from k on, a different sum for each k. Each episode's answer best-responds to
  the later ones': a subgame-perfect plan, which is where policy-gradient learning with
  these advantages can settle. Under MAGE's differential return with ``gamma_traj = 1``
  the answer of episode k weighs its own episode once and the last one ``omega`` times:
  not purely the last episode, so the first probe has to pay for itself partly.

Ties go to FOLD (the answer that reveals nothing); :class:`Plan` records the margin of
the first decision, so a tie is visible as a margin of 0.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from functools import cache
from typing import Any

from mage_rl.envs.showdown import ANSWERS, LOSS, bluff_rate

Weights = Callable[[int, int], Sequence[float]]  # (k, K) -> weights over R_k..R_{K-1}
OBJECTIVES = ("final", "sum", "greedy")
CREDIT_MODES = ("differential", "cumulative", "single_episode")


def objective_weights(objective: str) -> Weights:
    """Weights over ``R_k..R_{K-1}`` that the answer of episode k maximises.

    Raises:
        ValueError: An unknown objective.
    """
    if objective == "final":
        return lambda k, episodes: [0.0] * (episodes - k - 1) + [1.0]
    if objective == "sum":
        return lambda k, episodes: [1.0] * (episodes - k)
    if objective == "greedy":
        return lambda k, episodes: [1.0] + [0.0] * (episodes - k - 1)
    raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")


def credit_weights(mode: str, gamma_traj: float = 1.0, omega: float = 1.0) -> Weights:
    """Weights over ``R_k..R_{K-1}`` that GiGPO's combined advantage credits episode k with.

    With one answer per episode, the step-wise return of episode k is
    ``sum_j gamma^(j-k) m_j`` over ``j >= k`` and its score is ``m_k`` (SPEC §4), where
    ``m_j`` is ``D_j = R_j - R_{j-1}`` (differential) or ``R_j``. A term the history
    already fixes (``-R_{k-1}``) moves no answer and is dropped, so the differential score
    counts as ``R_k``, and its return as ``sum_j gamma^(j-k) (1 - gamma) R_j`` for
    ``j < K-1`` plus ``gamma^(K-1-k) R_{K-1}``. ``single_episode`` has ``gamma_traj = 0``.

    Raises:
        ValueError: An unknown mode or a discount outside [0, 1].
    """
    if mode not in CREDIT_MODES:
        raise ValueError(f"mode must be one of {CREDIT_MODES}, got {mode!r}")
    if not 0.0 <= gamma_traj <= 1.0:
        raise ValueError(f"gamma_traj must be in [0, 1], got {gamma_traj}")
    g = 0.0 if mode == "single_episode" else gamma_traj

    def weights(k: int, episodes: int) -> list[float]:
        n = episodes - k
        if mode == "differential":
            ret = [g**i * (1.0 - g) for i in range(n)]
            ret[-1] = g ** (n - 1)
        else:
            ret = [g**i for i in range(n)]
        out = [omega * r for r in ret]
        out[0] += 1.0
        return out

    return weights


@dataclass
class Plan:
    """The plan one objective leads to, and what it earns.

    Attributes:
        first_answer: CALL (probe) or FOLD at the first episode.
        first_margin: The first decision's own objective, CALL minus FOLD (0: a tie,
            played as FOLD).
        probe_episode: The first episode (1-based) at which the plan calls with nothing
            seen yet, or ``None`` when it never probes.
        episode_values: The expected payoff of each episode, chips.
        last: The last episode's expected payoff.
        total: The sum over the episodes.
    """

    first_answer: str
    first_margin: float
    probe_episode: int | None
    episode_values: list[float]
    last: float
    total: float


@dataclass
class ShowdownValues:
    """Exact values of one population and K.

    Attributes:
        population: Opponent spec -> weight (normalised).
        bluff: Opponent spec -> probability of a weak hand.
        episodes: K.
        loss: Chips lost by a call against a strong hand.
        call_prior: The value of a call knowing nothing: the best fixed (non-adaptive)
            policy earns ``max(0, call_prior)`` in every episode.
        best_fixed: ``max(0, call_prior)``.
        ceiling: Knowing the opponent: each type's best answer, weighted.
        objectives: Per objective of :data:`OBJECTIVES`, its Bayes-optimal :class:`Plan`.
        credit: Per credit mode of :data:`CREDIT_MODES`, the :class:`Plan` its
            advantages settle on (``gamma_traj`` and ``omega`` as given).
        gamma_traj, omega: The discount and step weight ``credit`` was solved for.
    """

    population: dict[str, float]
    bluff: dict[str, float]
    episodes: int
    loss: float
    call_prior: float
    best_fixed: float
    ceiling: float
    objectives: dict[str, Plan] = field(default_factory=dict)
    credit: dict[str, Plan] = field(default_factory=dict)
    gamma_traj: float = 1.0
    omega: float = 1.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def solve(
    bluffs: Sequence[float],
    weights: Sequence[float],
    episodes: int,
    plan_weights: Weights,
    loss: float = LOSS,
) -> Plan:
    """Backward induction over ``(k, weak seen, strong seen)`` for one weighting.

    Args:
        bluffs: Each type's probability of a weak hand.
        weights: Each type's prior weight (normalised here).
        episodes: K.
        plan_weights: ``(k, K) -> weights over R_k..R_{K-1}`` that episode k's answer
            maximises, given the answers after it.
        loss: Chips lost by a call against a strong hand.
    """
    total = float(sum(weights))
    prior = [w / total for w in weights]

    @cache
    def node(k: int, weak: int, strong: int) -> tuple[tuple[float, ...], float, int | None]:
        """Expected ``R_k..R_{K-1}``, the margin at this node, and the probe episode."""
        if k == episodes:
            return (), 0.0, None
        joint = [p * b**weak * (1.0 - b) ** strong for p, b in zip(prior, bluffs, strict=True)]
        mass = sum(joint)
        if mass <= 0.0:  # a history no type can produce
            return (0.0,) * (episodes - k), 0.0, None
        p_weak = sum(j * b for j, b in zip(joint, bluffs, strict=True)) / mass
        folded, _, fold_probe = node(k + 1, weak, strong)
        after_weak = node(k + 1, weak + 1, strong)[0]
        after_strong = node(k + 1, weak, strong + 1)[0]
        call = (p_weak - (1.0 - p_weak) * loss,) + tuple(
            p_weak * a + (1.0 - p_weak) * b for a, b in zip(after_weak, after_strong, strict=True)
        )
        fold = (0.0, *folded)
        w = plan_weights(k, episodes)
        margin = sum(x * c for x, c in zip(w, call, strict=True)) - sum(
            x * f for x, f in zip(w, fold, strict=True)
        )
        if margin > 1e-12:
            return call, margin, k + 1
        return fold, margin, fold_probe

    values, margin, probe = node(0, 0, 0)
    return Plan(
        first_answer=ANSWERS[1] if margin > 1e-12 else ANSWERS[0],
        first_margin=margin,
        probe_episode=probe if weights else None,
        episode_values=list(values),
        last=values[-1],
        total=float(sum(values)),
    )


def showdown_values(
    population: dict[str, float],
    episodes: int = 2,
    *,
    gamma_traj: float = 1.0,
    omega: float = 1.0,
    loss: float = LOSS,
) -> ShowdownValues:
    """All exact values of :class:`ShowdownValues` for a population of showdown bettors.

    Raises:
        ValueError: ``episodes < 1``, a bad discount, or an opponent that is not a
            showdown bettor (``showdown:bluffer[:B]``, ``showdown:honest``).
    """
    if episodes < 1:
        raise ValueError(f"episodes must be >= 1, got {episodes}")
    specs = list(population)
    bluffs = [bluff_rate(s) for s in specs]
    total = float(sum(population.values()))
    weights = [population[s] / total for s in specs]
    call_prior = sum(w * (b - (1 - b) * loss) for w, b in zip(weights, bluffs, strict=True))
    values = ShowdownValues(
        population=dict(zip(specs, weights, strict=True)),
        bluff=dict(zip(specs, bluffs, strict=True)),
        episodes=episodes,
        loss=loss,
        call_prior=call_prior,
        best_fixed=max(0.0, call_prior),
        ceiling=sum(w * max(0.0, b - (1 - b) * loss) for w, b in zip(weights, bluffs, strict=True)),
        gamma_traj=gamma_traj,
        omega=omega,
    )
    for name in OBJECTIVES:
        values.objectives[name] = solve(bluffs, weights, episodes, objective_weights(name), loss)
    for mode in CREDIT_MODES:
        plan_weights = credit_weights(mode, gamma_traj, omega)
        values.credit[mode] = solve(bluffs, weights, episodes, plan_weights, loss)
    return values
