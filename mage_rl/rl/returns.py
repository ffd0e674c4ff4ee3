"""Per-sample learning targets of one meta-episode: step-wise returns and episode scores.

References:
    MAGE (arXiv 2603.03680), section 3.2.1, eq. 5-7; SPEC.md sections 3 and 4.
    LaMer (arXiv 2512.16848) for the ``cumulative`` variant.

Every LLM call of a meta-episode is one sample, laid out in time order: the reflect turn
of episode k (k >= 1) comes first, then the calls of episode k's steps. Each step has at
most one *acting* call (kind ``play``: the environment consumed its response); a graph
may make other, non-acting calls (kind ``call``: a plan, a critique) and reflect turns
are non-acting too. For each sample this module computes two numbers that the advantage
estimators of :mod:`mage_rl.rl.advantages` consume:

1. Per-episode signal ``m_k`` from the episode rewards ``R_k``: the differential
   meta-reward ``D_k`` (eq. 5; ``D_0 = R_0``, ``D_k = R_k - R_{k-1}``) in the MAGE mode,
   the raw ``R_k`` in the ``cumulative`` and ``single_episode`` modes.
2. Step-wise return ``G`` (eq. 6-7): ``m_k`` is placed on the last play turn of episode k
   and discounted backwards, by ``gamma_step`` inside an episode and by ``gamma_traj``
   across an episode boundary. A reflect turn takes the return of the first play turn of
   its episode. ``single_episode`` cuts the cross-episode term (``gamma_traj = 0``).
3. Episode-level score ``S``: ``m_k`` (``D_k`` or ``R_k``) for the play turns of episode
   k, 0 for a reflect turn, minus the sample's own penalties (invalid output, length).
   Penalties reduce the score only; the step returns carry task reward alone.
4. Non-acting ``call`` samples (SPEC §4, "any LLM call of a user's graph is a sample"):
   the return of the next acting call in time order, undiscounted (or, with none after
   it, of the last acting call before it), and that acting call's ``m_k`` as the score,
   minus the call's own penalties. A reflect turn keeps rule 2-3 (the return of its
   episode's first step, score 0), which is this rule for the call that precedes the
   episode's first acting call, except for the score: SPEC §4 scores reflect turns 0,
   and the special case keeps that.

All functions are pure and work on numpy arrays of one meta-episode. Shapes: ``N`` samples,
``K`` episodes.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from mage_rl.records import TURN_KINDS, MetaEpisodeRecord
from mage_rl.sections import REWARD_MODES, ReturnConfig, RewardMode

ArrayLike = npt.ArrayLike


def differential_rewards(episode_rewards: ArrayLike) -> np.ndarray:
    """Differential meta-reward (MAGE, paper eq. 5).

    ``D_0 = R_0`` and ``D_k = R_k - R_{k-1}``; the ``D_k`` telescope to ``R_{K-1}``, the
    reward of the last episode played.

    Args:
        episode_rewards: ``R_k`` of every episode played, shape ``(K,)``.

    Returns:
        ``D_k``, shape ``(K,)``, float64.
    """
    rewards = np.asarray(episode_rewards, dtype=np.float64).reshape(-1)
    return np.diff(rewards, prepend=0.0)


def episode_signals(episode_rewards: ArrayLike, mode: RewardMode) -> np.ndarray:
    """Per-episode signal ``m_k`` placed on the last play turn and used as the score.

    Args:
        episode_rewards: ``R_k``, shape ``(K,)``.
        mode: ``"differential"`` gives ``D_k`` (eq. 5); ``"cumulative"`` and
            ``"single_episode"`` give ``R_k``.

    Returns:
        ``m_k``, shape ``(K,)``, float64.
    """
    if mode not in REWARD_MODES:
        raise ValueError(f"mode must be one of {REWARD_MODES}, got {mode!r}")
    if mode == "differential":
        return differential_rewards(episode_rewards)
    return np.asarray(episode_rewards, dtype=np.float64).reshape(-1).copy()


def length_weight(response_lengths: ArrayLike, max_lengths: ArrayLike) -> np.ndarray:
    """Soft over-length weight ``w(L)`` of SPEC §3.

    With ``L_s = L_max / 2``: ``w = 0`` if ``L <= L_s``, ``(L - L_s) / (L_max - L_s)`` if
    ``L_s < L < L_max`` and ``1`` if ``L >= L_max``. A sample whose limit is unknown
    (``L_max <= 0``) gets ``w = 0``.

    Args:
        response_lengths: ``L`` per sample, shape ``(N,)``.
        max_lengths: ``L_max`` per sample, shape ``(N,)`` or a scalar.

    Returns:
        ``w(L)`` in ``[0, 1]``, shape ``(N,)``.
    """
    lengths = np.asarray(response_lengths, dtype=np.float64).reshape(-1)
    limits = np.broadcast_to(np.asarray(max_lengths, dtype=np.float64), lengths.shape)
    known = limits > 0
    soft_start = limits / 2.0
    span = np.where(known, limits - soft_start, 1.0)
    weight = np.clip((lengths - soft_start) / span, 0.0, 1.0)
    return np.where(known, weight, 0.0)


def sample_penalties(
    invalid: ArrayLike,
    response_lengths: ArrayLike,
    max_lengths: ArrayLike,
    invalid_penalty: float,
    length_penalty: float,
) -> np.ndarray:
    """Size of each sample's own penalty, ``c_inv * invalid + c_len * w(L)`` (SPEC §3).

    Args:
        invalid: Whether each sample was an invalid response, shape ``(N,)``.
        response_lengths: ``L`` per sample, shape ``(N,)``.
        max_lengths: ``L_max`` per sample, shape ``(N,)`` or a scalar.
        invalid_penalty: ``c_inv >= 0``.
        length_penalty: ``c_len >= 0``.

    Returns:
        Non-negative penalties, shape ``(N,)``; the score subtracts them.
    """
    flags = np.asarray(invalid, dtype=bool).reshape(-1).astype(np.float64)
    return invalid_penalty * flags + length_penalty * length_weight(response_lengths, max_lengths)


def _check_layout(kinds: Sequence[str], episode_idx: ArrayLike, num_episodes: int) -> np.ndarray:
    """Validate the time-ordered sample layout and return the episode indices as ints."""
    episodes = np.asarray(episode_idx, dtype=np.int64).reshape(-1)
    if len(kinds) != len(episodes):
        raise ValueError(
            f"kinds and episode_idx must have the same length, got {len(kinds)} and {len(episodes)}"
        )
    bad_kinds = sorted({k for k in kinds if k not in TURN_KINDS})
    if bad_kinds:
        raise ValueError(f"turn kinds must be one of {TURN_KINDS}, got {bad_kinds}")
    if len(episodes) and (episodes.min() < 0 or episodes.max() >= num_episodes):
        raise ValueError(
            f"episode indices must lie in [0, {num_episodes}) (one reward per episode), "
            f"got indices from {episodes.min()} to {episodes.max()}"
        )
    if np.any(np.diff(episodes) < 0):
        raise ValueError("samples must be in time order: episode indices may not decrease")
    return episodes


def credit_sources(kinds: Sequence[str]) -> np.ndarray:
    """The acting sample each non-acting ``call`` sample takes its credit from (SPEC §4).

    A ``call`` takes the next ``play`` sample in time order; with none after it, the
    last ``play`` sample before it; with none at all, -1. ``play`` samples point at
    themselves and ``reflect`` samples get -1 (they follow their own rule).

    Args:
        kinds: ``"play"``, ``"reflect"`` or ``"call"`` per sample, time order, length ``N``.

    Returns:
        Source index per sample, shape ``(N,)``, int64.
    """
    n = len(kinds)
    sources = np.full(n, -1, dtype=np.int64)
    next_play = -1
    for i in range(n - 1, -1, -1):
        if kinds[i] == "play":
            next_play = i
            sources[i] = i
        elif kinds[i] == "call":
            sources[i] = next_play
    last_play = -1
    for i in range(n):
        if kinds[i] == "play":
            last_play = i
        elif kinds[i] == "call" and sources[i] < 0:
            sources[i] = last_play
    return sources


def step_returns(
    kinds: Sequence[str],
    episode_idx: ArrayLike,
    episode_rewards: ArrayLike,
    gamma_step: float,
    gamma_traj: float,
) -> np.ndarray:
    """Two-gamma step-wise return (MAGE, paper eq. 6-7; SPEC §4).

    The reward of a sample is ``m_k`` on the last play turn of episode k and 0 elsewhere.
    Walking backwards over the play turns, ``G_i = r_i + gamma * G_next`` with
    ``gamma = gamma_step`` when the next play turn is in the same episode and
    ``gamma_traj`` when it is in the next episode. A reflect turn takes the return of the
    first play turn of its episode (it acts before that turn and changes nothing in the
    environment), so it adds no discount of its own. A non-acting ``call`` takes the
    return of its :func:`credit_sources` sample, undiscounted (with no acting sample in the
    meta-episode, the return its episode's reflect turn would take).

    An episode without play turns (possible only in truncated records) acts as one
    virtual step that carries its ``m_k``: its return is
    ``m_k + gamma_traj * G_next_episode``, its reflect turn takes that return, and the
    previous episode discounts it by ``gamma_traj`` like any next episode. This keeps
    every ``m_k`` in the returns, so the ``D_k`` still add up to the last reward.

    Args:
        kinds: ``"play"``, ``"reflect"`` or ``"call"`` per sample, time order, length ``N``.
        episode_idx: Episode index k per sample, shape ``(N,)``, non-decreasing.
        episode_rewards: Per-episode signal ``m_k`` (``D_k`` or ``R_k``), shape ``(K,)``.
        gamma_step: Discount inside an episode.
        gamma_traj: Discount across an episode boundary (0 disables propagation).

    Returns:
        ``G`` per sample, shape ``(N,)``, float64.
    """
    signal = np.asarray(episode_rewards, dtype=np.float64).reshape(-1)
    num_episodes = len(signal)
    episodes = _check_layout(kinds, episode_idx, num_episodes)

    plays: list[list[int]] = [[] for _ in range(num_episodes)]
    reflects: list[list[int]] = [[] for _ in range(num_episodes)]
    for i, (kind, k) in enumerate(zip(kinds, episodes, strict=True)):
        if kind == "play":
            plays[k].append(i)
        elif kind == "reflect":
            reflects[k].append(i)

    returns = np.zeros(len(episodes), dtype=np.float64)
    entry = np.zeros(num_episodes, dtype=np.float64)  # return of episode k's first step
    next_entry = 0.0  # return of the first (possibly virtual) step of episode k + 1
    for k in range(num_episodes - 1, -1, -1):
        g = signal[k] + gamma_traj * next_entry
        if plays[k]:
            returns[plays[k][-1]] = g
            for i in reversed(plays[k][:-1]):
                g = gamma_step * g
                returns[i] = g
        returns[reflects[k]] = g
        entry[k] = g
        next_entry = g
    for i, source in enumerate(credit_sources(kinds)):
        if kinds[i] == "call":
            returns[i] = returns[source] if source >= 0 else entry[episodes[i]]
    return returns


def episode_scores(
    kinds: Sequence[str],
    episode_idx: ArrayLike,
    episode_rewards: ArrayLike,
    penalties: ArrayLike,
) -> np.ndarray:
    """Episode-level score ``S`` of each sample (SPEC §4).

    ``S = m_k - penalty`` for a play turn of episode k, ``S = 0 - penalty`` for a
    reflect turn, and for a non-acting ``call`` the ``m_k`` of the acting sample it takes
    its credit from (:func:`credit_sources`; its own episode's with none) minus its own
    penalty.

    Args:
        kinds: ``"play"``, ``"reflect"`` or ``"call"`` per sample, length ``N``.
        episode_idx: Episode index per sample, shape ``(N,)``.
        episode_rewards: Per-episode score ``D_k`` or ``R_k``, shape ``(K,)``.
        penalties: Non-negative penalty per sample, shape ``(N,)``.

    Returns:
        ``S`` per sample, shape ``(N,)``, float64.
    """
    signal = np.asarray(episode_rewards, dtype=np.float64).reshape(-1)
    episodes = _check_layout(kinds, episode_idx, len(signal))
    sources = credit_sources(kinds)
    base = np.zeros(len(episodes), dtype=np.float64)
    for i, kind in enumerate(kinds):
        if kind == "play":
            base[i] = signal[episodes[i]]
        elif kind == "call":
            base[i] = signal[episodes[sources[i] if sources[i] >= 0 else i]]
    return base - np.asarray(penalties, dtype=np.float64).reshape(-1)


def sample_targets(
    kinds: Sequence[str],
    episode_idx: ArrayLike,
    episode_rewards: ArrayLike,
    invalid: ArrayLike,
    response_lengths: ArrayLike,
    max_lengths: ArrayLike,
    cfg: ReturnConfig,
) -> tuple[np.ndarray, np.ndarray]:
    """Step-wise returns and episode-level scores of one meta-episode.

    Args:
        kinds: ``"play"``, ``"reflect"`` or ``"call"`` per sample, time order, length ``N``.
        episode_idx: Episode index per sample, shape ``(N,)``.
        episode_rewards: Raw task rewards ``R_k`` of the episodes played, shape ``(K,)``.
        invalid: Invalid-response flag per sample, shape ``(N,)``.
        response_lengths: ``L`` per sample, shape ``(N,)``.
        max_lengths: ``L_max`` per sample, shape ``(N,)`` or a scalar.
        cfg: Reward mode, discounts and penalty sizes.

    Returns:
        ``(returns, scores)``, each of shape ``(N,)``, float64.
    """
    signal = episode_signals(episode_rewards, cfg.mode)
    returns = step_returns(kinds, episode_idx, signal, cfg.gamma_step, cfg.effective_gamma_traj)
    penalties = sample_penalties(
        invalid, response_lengths, max_lengths, cfg.invalid_penalty, cfg.length_penalty
    )
    if cfg.reward_to_go:
        # -R_{k-1}, the past term of D_k, discounted inside episode k only: what it adds
        # to the returns of episode k's own turns. Its share in the returns of earlier
        # episodes (through gamma_traj) stays.
        raw = np.asarray(episode_rewards, dtype=np.float64).reshape(-1)
        past = -np.concatenate(([0.0], raw[:-1]))
        returns = returns - step_returns(kinds, episode_idx, past, cfg.gamma_step, 0.0)
        signal = signal - past  # D_k + R_{k-1} = R_k
    scores = episode_scores(kinds, episode_idx, signal, penalties)
    return returns, scores


def record_episode_rewards(record: MetaEpisodeRecord) -> list[float]:
    """``R_k`` of a record, from its episode results.

    When a record carries no episode results (hand-built records), ``R_k`` falls back to
    the sum of the task rewards on the turns of episode k.

    Raises:
        ValueError: If the episode results are not indexed 0..K-1 in order.
    """
    if record.episodes:
        indices = [e.index for e in record.episodes]
        if indices != list(range(len(indices))):
            raise ValueError(
                f"record {record.uid!r} (rollout {record.rollout}): episode results must be "
                f"indexed 0..K-1 in order, got {indices}"
            )
        return record.episode_rewards
    num_episodes = max((t.episode for t in record.turns), default=-1) + 1
    rewards = [0.0] * num_episodes
    for turn in record.turns:
        rewards[turn.episode] += turn.reward
    return rewards


def compute_sample_targets(
    record: MetaEpisodeRecord, cfg: ReturnConfig
) -> tuple[np.ndarray, np.ndarray]:
    """Returns and scores for every turn of a record, aligned with ``record.turns``.

    Args:
        record: One meta-episode, turns in time order.
        cfg: Reward mode, discounts and penalty sizes.

    Returns:
        ``(returns, scores)``, each of shape ``(len(record.turns),)``.
    """
    turns = record.turns
    try:
        return sample_targets(
            kinds=[t.kind for t in turns],
            episode_idx=[t.episode for t in turns],
            episode_rewards=record_episode_rewards(record),
            invalid=[t.invalid for t in turns],
            response_lengths=[t.response_length for t in turns],
            max_lengths=[t.max_response_length for t in turns],
            cfg=cfg,
        )
    except ValueError as err:
        raise ValueError(f"record {record.uid!r} (rollout {record.rollout}): {err}") from err
