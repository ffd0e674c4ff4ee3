"""Returns and scores of one meta-episode (MAGE eq. 5-7, SPEC §3-4), checked by hand."""

from __future__ import annotations

import numpy as np
import pytest

from mage_rl.records import EpisodeResult, MetaEpisodeRecord, Turn
from mage_rl.rl.returns import (
    ReturnConfig,
    compute_sample_targets,
    differential_rewards,
    episode_scores,
    length_weight,
    sample_penalties,
    sample_targets,
    step_returns,
)

# One meta-episode, K = 3, in time order:
#   episode 0: p0, p1           (lost,  R_0 = -10)
#   episode 1: r1, p2, p3       (won,   R_1 = +10)
#   episode 2: r2, p4           (won,   R_2 = +10)
KINDS = ["play", "play", "reflect", "play", "play", "reflect", "play"]
EPISODES = [0, 0, 1, 1, 1, 2, 2]
R = [-10.0, 10.0, 10.0]
NO_FLAGS = [False] * 7
LENGTHS = [10] * 7
L_MAX = 100


def test_differential_reward_by_hand() -> None:
    # D_0 = R_0 = -10; D_1 = 10 - (-10) = 20; D_2 = 10 - 10 = 0.
    d = differential_rewards(R)
    np.testing.assert_allclose(d, [-10.0, 20.0, 0.0])
    # The D_k telescope to the last episode's reward.
    assert d.sum() == pytest.approx(R[-1])
    rng = np.random.default_rng(0)
    for _ in range(20):
        rewards = rng.choice([-10.0, 0.0, 10.0], size=rng.integers(1, 6))
        assert differential_rewards(rewards).sum() == pytest.approx(rewards[-1])


def test_differential_returns_by_hand() -> None:
    # m = D = [-10, 20, 0], gamma_step = 0.95, gamma_traj = 0.6.
    # episode 2: G(p4) = D_2 = 0;                     G(r2) = G(p4) = 0
    # episode 1: G(p3) = 20 + 0.6 * G(p4) = 20;       G(p2) = 0.95 * 20 = 19;  G(r1) = 19
    # episode 0: G(p1) = -10 + 0.6 * G(p2) = 1.4;     G(p0) = 0.95 * 1.4 = 1.33
    returns, scores = sample_targets(KINDS, EPISODES, R, NO_FLAGS, LENGTHS, L_MAX, ReturnConfig())
    np.testing.assert_allclose(returns, [1.33, 1.4, 19.0, 19.0, 20.0, 0.0, 0.0])
    # Scores: D_k on play turns, 0 on reflect turns (no penalties here).
    np.testing.assert_allclose(scores, [-10.0, -10.0, 0.0, 20.0, 20.0, 0.0, 0.0])


def test_reward_to_go_returns_by_hand() -> None:
    # D = [-10, 20, 0]; the past terms -R_{k-1} are [0, 10, -10].
    # episode 2: G(p4) = R_2 = 10 (MAGE: 0 = 10 - R_1);          G(r2) = 10
    # episode 1: G(p3) = R_1 + 0.6 * D_2 = 10;  G(p2) = 9.5;      G(r1) = 9.5
    # episode 0: no past episode, so MAGE's returns: 1.4 and 1.33.
    cfg = ReturnConfig(reward_to_go=True)
    returns, scores = sample_targets(KINDS, EPISODES, R, NO_FLAGS, LENGTHS, L_MAX, cfg)
    np.testing.assert_allclose(returns, [1.33, 1.4, 9.5, 9.5, 10.0, 10.0, 10.0])
    np.testing.assert_allclose(scores, [-10.0, -10.0, 0.0, 10.0, 10.0, 0.0, 10.0])


def test_reward_to_go_drops_only_what_the_turn_has_seen() -> None:
    # Undiscounted, every turn's target is the last episode's reward: MAGE's objective.
    flat = ReturnConfig(gamma_step=1.0, gamma_traj=1.0, reward_to_go=True)
    rng = np.random.default_rng(1)
    for _ in range(20):
        rewards = rng.choice([-10.0, -5.0, 5.0, 10.0], size=3)
        returns, _ = sample_targets(KINDS, EPISODES, rewards, NO_FLAGS, LENGTHS, L_MAX, flat)
        np.testing.assert_allclose(returns, rewards[-1])
    # Discounted, a turn of episode k differs from MAGE by a multiple of R_{k-1} alone:
    # changing the rewards of episode k and later leaves the difference as it is.
    mage, rtg = ReturnConfig(), ReturnConfig(reward_to_go=True)

    def gap(rewards: list[float]) -> np.ndarray:
        a, _ = sample_targets(KINDS, EPISODES, rewards, NO_FLAGS, LENGTHS, L_MAX, mage)
        b, _ = sample_targets(KINDS, EPISODES, rewards, NO_FLAGS, LENGTHS, L_MAX, rtg)
        return b - a

    base = gap([-10.0, 10.0, 10.0])
    np.testing.assert_allclose(base[:2], 0.0)  # episode 0 has no past
    np.testing.assert_allclose(gap([-10.0, -5.0, 5.0])[2:5], base[2:5])  # R_0 fixed
    np.testing.assert_allclose(gap([0.0, 10.0, -10.0])[5:], base[5:])  # R_1 fixed
    with pytest.raises(ValueError, match="differential"):
        ReturnConfig(mode="cumulative", reward_to_go=True)


def test_cumulative_returns_by_hand() -> None:
    # LaMer: m = R = [-10, 10, 10].
    # G(p4) = 10;                    G(r2) = 10
    # G(p3) = 10 + 0.6 * 10 = 16;    G(p2) = 0.95 * 16 = 15.2;  G(r1) = 15.2
    # G(p1) = -10 + 0.6 * 15.2 = -0.88;  G(p0) = 0.95 * -0.88 = -0.836
    cfg = ReturnConfig(mode="cumulative")
    returns, scores = sample_targets(KINDS, EPISODES, R, NO_FLAGS, LENGTHS, L_MAX, cfg)
    np.testing.assert_allclose(returns, [-0.836, -0.88, 15.2, 15.2, 16.0, 10.0, 10.0])
    np.testing.assert_allclose(scores, [-10.0, -10.0, 0.0, 10.0, 10.0, 0.0, 10.0])


def test_single_episode_returns_by_hand() -> None:
    # gamma_traj = 0: no propagation across episodes, m = R.
    # G(p4) = 10; G(p3) = 10, G(p2) = 9.5; G(p1) = -10, G(p0) = -9.5; reflect = first play.
    cfg = ReturnConfig(mode="single_episode", gamma_traj=0.6)  # gamma_traj is ignored
    returns, scores = sample_targets(KINDS, EPISODES, R, NO_FLAGS, LENGTHS, L_MAX, cfg)
    np.testing.assert_allclose(returns, [-9.5, -10.0, 9.5, 9.5, 10.0, 10.0, 10.0])
    np.testing.assert_allclose(scores, [-10.0, -10.0, 0.0, 10.0, 10.0, 0.0, 10.0])


def test_two_gamma_recursion_general_values() -> None:
    # Three play turns in episode 0, two in episode 1; m = [1, 2], gamma_step 0.5, gamma_traj 0.25.
    # G(e1,t1) = 2;           G(e1,t0) = 0.5 * 2 = 1
    # G(e0,t2) = 1 + 0.25 * 1 = 1.25;  G(e0,t1) = 0.625;  G(e0,t0) = 0.3125
    kinds = ["play"] * 5
    g = step_returns(kinds, [0, 0, 0, 1, 1], [1.0, 2.0], gamma_step=0.5, gamma_traj=0.25)
    np.testing.assert_allclose(g, [0.3125, 0.625, 1.25, 1.0, 2.0])


def test_undiscounted_return_of_first_turn_is_last_reward() -> None:
    # With both gammas 1, the first turn's differential return is sum(D_k) = R_last.
    cfg = ReturnConfig(gamma_step=1.0, gamma_traj=1.0)
    returns, _ = sample_targets(KINDS, EPISODES, R, NO_FLAGS, LENGTHS, L_MAX, cfg)
    assert returns[0] == pytest.approx(R[-1])


def test_length_weight_piecewise() -> None:
    # L_max = 100, L_s = 50: w = 0 up to 50, (L - 50) / 50 between, 1 from 100 on.
    w = length_weight([0, 50, 60, 75, 99, 100, 140], 100)
    np.testing.assert_allclose(w, [0.0, 0.0, 0.2, 0.5, 0.98, 1.0, 1.0])
    # Per-sample limits; an unknown limit (0) gives no penalty.
    np.testing.assert_allclose(length_weight([30, 30, 500], [40, 0, 0]), [0.5, 0.0, 0.0])


def test_penalties_lower_scores_not_returns() -> None:
    # p1 invalid (c_inv = 0.5); r1 is 75 of 100 tokens: w = 0.5, c_len = 2 -> 1.0.
    invalid = [False, True, False, False, False, False, False]
    lengths = [10, 10, 75, 10, 10, 10, 10]
    cfg = ReturnConfig()
    returns, scores = sample_targets(KINDS, EPISODES, R, invalid, lengths, L_MAX, cfg)
    clean_returns, _ = sample_targets(KINDS, EPISODES, R, NO_FLAGS, LENGTHS, L_MAX, cfg)
    np.testing.assert_allclose(returns, clean_returns)
    # scores: p1 = -10 - 0.5 = -10.5; r1 = 0 - 2 * 0.5 = -1.0
    np.testing.assert_allclose(scores, [-10.0, -10.5, -1.0, 20.0, 20.0, 0.0, 0.0])
    np.testing.assert_allclose(
        sample_penalties(invalid, lengths, L_MAX, 0.5, 2.0)[:3], [0, 0.5, 1.0]
    )


def test_episode_without_play_turns_is_a_virtual_step() -> None:
    # Episode 1 has only its reflect turn: it acts as one step carrying D_1.
    # R = [0, 10, 10] -> D = [0, 10, 0].
    # G(p e2) = 0; episode 1 virtual: 10 + 0.6 * 0 = 10 -> G(r1) = 10;
    # G(p e0) = 0 + 0.6 * 10 = 6; G(r2) = 0.
    kinds = ["play", "reflect", "reflect", "play"]
    g = step_returns(kinds, [0, 1, 2, 2], differential_rewards([0.0, 10.0, 10.0]), 0.95, 0.6)
    np.testing.assert_allclose(g, [6.0, 10.0, 0.0, 0.0])
    s = episode_scores(kinds, [0, 1, 2, 2], [0.0, 10.0, 0.0], np.zeros(4))
    np.testing.assert_allclose(s, [0.0, 0.0, 0.0, 0.0])


def _record(rewards: list[float] | None = None) -> MetaEpisodeRecord:
    turns = [
        Turn(
            kind=kind,  # type: ignore[arg-type]
            episode=k,
            step=0,
            response_length=10,
            max_response_length=L_MAX,
            reward=0.0,
        )
        for kind, k in zip(KINDS, EPISODES, strict=True)
    ]
    # The task reward sits on the last play turn of each episode.
    turns[1].reward, turns[4].reward, turns[6].reward = R
    episodes = [] if rewards is None else [EpisodeResult(i, "x", r) for i, r in enumerate(rewards)]
    return MetaEpisodeRecord("uid", 0, "kuhn_poker", 1, "aggressive", 0, episodes, turns)


def test_compute_sample_targets_from_record() -> None:
    expected = sample_targets(KINDS, EPISODES, R, NO_FLAGS, LENGTHS, L_MAX, ReturnConfig())
    for record in (_record(R), _record(None)):  # episode results, or rewards read off turns
        returns, scores = compute_sample_targets(record, ReturnConfig())
        np.testing.assert_allclose(returns, expected[0])
        np.testing.assert_allclose(scores, expected[1])


def test_returns_scale_linearly_with_rewards() -> None:
    # Invariance: the recursion is linear in the rewards (penalty-free scores too).
    base = sample_targets(KINDS, EPISODES, R, NO_FLAGS, LENGTHS, L_MAX, ReturnConfig())
    scaled = sample_targets(
        KINDS, EPISODES, [3 * r for r in R], NO_FLAGS, LENGTHS, L_MAX, ReturnConfig()
    )
    np.testing.assert_allclose(scaled[0], 3 * base[0])
    np.testing.assert_allclose(scaled[1], 3 * base[1])


def test_bad_layouts_and_configs_raise() -> None:
    with pytest.raises(ValueError, match="time order"):
        step_returns(["play", "play"], [1, 0], [1.0, 1.0], 0.9, 0.9)
    with pytest.raises(ValueError, match="episode indices"):
        step_returns(["play"], [3], [1.0], 0.9, 0.9)
    with pytest.raises(ValueError, match="kinds"):
        step_returns(["act"], [0], [1.0], 0.9, 0.9)
    with pytest.raises(ValueError, match="mode"):
        ReturnConfig(mode="final")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="gamma_traj"):
        ReturnConfig(gamma_traj=1.5)
    with pytest.raises(ValueError, match="invalid_penalty"):
        ReturnConfig(invalid_penalty=-0.5)
    record = _record(R)
    record.episodes[1].index = 5
    with pytest.raises(ValueError, match="indexed 0..K-1"):
        compute_sample_targets(record, ReturnConfig())
