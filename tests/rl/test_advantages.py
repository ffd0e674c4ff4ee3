"""GiGPO with opponent grouping and the GRPO baseline (SPEC §5), checked by hand."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import numpy as np
import pytest

from mage_rl.records import EpisodeResult, MetaEpisodeRecord, Turn
from mage_rl.rl.advantages import (
    AdvantageConfig,
    anchor_id,
    compute_advantages,
    episode_level_advantages,
    gigpo_advantages,
    group_id,
    grpo_advantages,
    step_level_advantages,
)
from mage_rl.rl.returns import ReturnConfig

ENV, SEED, SEAT = "kuhn_poker", 7, 0


def make_record(
    opponent: str, rollout: int, episodes: list[tuple[float, list[str]]]
) -> MetaEpisodeRecord:
    """A meta-episode: per episode (R_k, anchors of its play turns); reflect turns before k >= 1."""
    turns: list[Turn] = []
    results = []
    for k, (reward, anchors) in enumerate(episodes):
        if k > 0:
            turns.append(Turn("reflect", k, 0, anchor="reflection", opponent=opponent))
        for t, anchor in enumerate(anchors):
            turns.append(Turn("play", k, t, anchor=anchor, opponent=opponent))
        turns[-1].reward = reward
        results.append(EpisodeResult(k, "won" if reward > 0 else "lost", reward))
    uid = group_id(ENV, SEED, opponent, SEAT)
    return MetaEpisodeRecord(uid, rollout, ENV, SEED, opponent, SEAT, results, turns)


# Rollout A: lost then won (R = [-10, 10]); rollout B: won twice (R = [10, 10]).
# Each: play "s0" in episode 0, reflect, play "s0" in episode 1.
REC_A = make_record("aggressive", 0, [(-10.0, ["s0"]), (10.0, ["s0"])])
REC_B = make_record("aggressive", 1, [(10.0, ["s0"]), (10.0, ["s0"])])


def test_gigpo_tiny_group_by_hand() -> None:
    # S = [1, 3, 5, 7], one group: mean 4 -> A_E = [-3, -1, 1, 3].
    # G = [2, 4, 6, 10], anchors [a, a, b, c]: anchor a mean 3 -> [-1, 1]; b, c alone -> 0.
    # A = A_E + A_S = [-4, 0, 1, 3]; with omega = 0.5: [-3.5, -0.5, 1, 3].
    groups = ["g"] * 4
    anchors = ["a", "a", "b", "c"]
    scores, returns = [1.0, 3.0, 5.0, 7.0], [2.0, 4.0, 6.0, 10.0]
    np.testing.assert_allclose(episode_level_advantages(scores, groups), [-3, -1, 1, 3])
    np.testing.assert_allclose(step_level_advantages(returns, groups, anchors), [-1, 1, 0, 0])
    np.testing.assert_allclose(gigpo_advantages(scores, returns, groups, anchors), [-4, 0, 1, 3])
    np.testing.assert_allclose(
        gigpo_advantages(scores, returns, groups, anchors, omega=0.5), [-3.5, -0.5, 1, 3]
    )


def test_mean_std_norm_by_hand() -> None:
    # S = [1, 3, 5, 7]: mean 4, unbiased std = sqrt((9 + 1 + 1 + 9) / 3) = sqrt(20 / 3).
    std = math.sqrt(20 / 3)
    a_e = episode_level_advantages([1.0, 3.0, 5.0, 7.0], ["g"] * 4, norm="mean_std_norm")
    np.testing.assert_allclose(a_e, np.array([-3, -1, 1, 3]) / (std + 1e-6))
    # A constant group has std 0 and gets 0, not a division by zero.
    flat = episode_level_advantages([2.0, 2.0], ["g", "g"], norm="mean_std_norm")
    np.testing.assert_allclose(flat, [0.0, 0.0])
    # Step level, anchor [a, a] with G = [0, 4]: mean 2, std sqrt(8) -> [-2, 2] / sqrt(8).
    a_s = step_level_advantages([0.0, 4.0], ["g", "g"], ["a", "a"], norm="mean_std_norm")
    np.testing.assert_allclose(a_s, np.array([-2, 2]) / (math.sqrt(8) + 1e-6))


def test_group_of_one_and_anchor_of_one() -> None:
    # A group of one has mean 0 and std 1: A_E = S (divided by 1 + eps under mean_std_norm).
    np.testing.assert_allclose(episode_level_advantages([5.0], ["g"]), [5.0])
    np.testing.assert_allclose(
        episode_level_advantages([5.0], ["g"], norm="mean_std_norm"), [5.0 / (1 + 1e-6)]
    )
    # An anchor group of one gets 0, whatever its return.
    np.testing.assert_allclose(step_level_advantages([42.0], ["g"], ["a"]), [0.0])
    # Same anchor text in two different groups: two anchor groups of one.
    np.testing.assert_allclose(step_level_advantages([1.0, 9.0], ["g1", "g2"], ["a", "a"]), [0, 0])


def test_compute_advantages_on_records_by_hand() -> None:
    # Differential: A has D = [-10, 20], B has D = [10, 0]; gamma_traj 0.6.
    # Returns  A: G(a2) = 20, G(a1) = 20 (reflect), G(a0) = -10 + 0.6 * 20 = 2
    #          B: G(b2) = 0,  G(b1) = 0,             G(b0) = 10 + 0.6 * 0 = 10
    # Scores   A: [-10, 0, 20]   B: [10, 0, 0]   -> group mean 20 / 6
    # A_E      A: [-10 - 10/3, -10/3, 20 - 10/3]   B: [10 - 10/3, -10/3, -10/3]
    # Global anchors: "s0" = {a0: 2, a2: 20, b0: 10, b2: 0}, mean 8 -> [-6, 12, 2, -8];
    #                 reflection = {a1: 20, b1: 0}, mean 10 -> [10, -10].
    m = 10 / 3
    adv = compute_advantages([REC_A, REC_B], ReturnConfig(), AdvantageConfig())
    np.testing.assert_allclose(adv[0], [-10 - m - 6, -m + 10, 20 - m + 12])
    np.testing.assert_allclose(adv[1], [10 - m + 2, -m - 10, -m - 8])


def test_step_only_is_the_step_level_part_alone() -> None:
    cfg = AdvantageConfig(omega=2.0)
    step = compute_advantages([REC_A, REC_B], adv_cfg=cfg, step_only=True)
    both = compute_advantages([REC_A, REC_B], adv_cfg=cfg)
    episode = compute_advantages([REC_A, REC_B], adv_cfg=AdvantageConfig(omega=0.0))
    for s, b, e in zip(step, both, episode, strict=True):
        np.testing.assert_allclose(s, (np.array(b) - np.array(e)) / 2.0)
    assert any(abs(x) > 1e-9 for row in step for x in row)
    with pytest.raises(ValueError, match="gigpo"):
        compute_advantages([REC_A], adv_cfg=AdvantageConfig(estimator="grpo"), step_only=True)


def test_local_anchor_differs_from_global() -> None:
    # Local anchors split "s0" by episode: e0 = {a0: 2, b0: 10} mean 6 -> [-4, 4];
    # e1 = {a2: 20, b2: 0} mean 10 -> [10, -10]; reflections are all in episode 1 (unchanged).
    m = 10 / 3
    local = compute_advantages([REC_A, REC_B], ReturnConfig(), AdvantageConfig(anchor="local"))
    np.testing.assert_allclose(local[0], [-10 - m - 4, -m + 10, 20 - m + 10])
    np.testing.assert_allclose(local[1], [10 - m + 4, -m - 10, -m - 10])
    global_ = compute_advantages([REC_A, REC_B], ReturnConfig(), AdvantageConfig())
    assert not np.allclose(local[0], global_[0])


def test_stationary_vs_mixed_grouping() -> None:
    # Rollout C: same task and seat, another opponent; lost then won, R = [-10, 10].
    rec_c = make_record("conservative", 0, [(-10.0, ["s0"]), (10.0, ["s0"])])
    stationary = compute_advantages([REC_A, REC_B, rec_c], ReturnConfig(), AdvantageConfig())
    alone = compute_advantages([REC_A, REC_B], ReturnConfig(), AdvantageConfig())
    # Stationary: C forms its own group and does not touch the baselines of A and B.
    np.testing.assert_allclose(stationary[0], alone[0])
    np.testing.assert_allclose(stationary[1], alone[1])
    # C alone: G = [2, 20, 20], S = [-10, 0, 20] with mean 10/3; its two "s0" turns form
    # an anchor group {2, 20} with mean 11 -> [-9, 9]; its reflection is alone -> 0.
    np.testing.assert_allclose(stationary[2], [-10 - 10 / 3 - 9, -10 / 3, 20 - 10 / 3 + 9])
    # Mixed: one group of 9 samples; scores sum 10 + 10 + 10 = 30 -> mean 30 / 9. Anchor "s0"
    # drops the opponent: {A: 2, 20; B: 10, 0; C: 2, 20} mean 54 / 6 = 9; reflections
    # {20, 0, 20} mean 40 / 3.
    mixed = compute_advantages(
        [REC_A, REC_B, rec_c], ReturnConfig(), AdvantageConfig(grouping="mixed")
    )
    m = 30 / 9
    np.testing.assert_allclose(mixed[2], [-10 - m + (2 - 9), -m + (20 - 40 / 3), 20 - m + (20 - 9)])
    np.testing.assert_allclose(mixed[1], [10 - m + (10 - 9), -m + (0 - 40 / 3), -m + (0 - 9)])


def test_stationary_rejects_group_with_two_opponents() -> None:
    bad = make_record("conservative", 2, [(10.0, ["s0"])])
    bad.uid = REC_A.uid
    with pytest.raises(ValueError, match="one opponent per uid group"):
        compute_advantages([REC_A, bad])


def _keyed(records: list[MetaEpisodeRecord], adv: list[list[float]]) -> dict:
    return {(r.uid, r.rollout): a for r, a in zip(records, adv, strict=True)}


@pytest.mark.parametrize(
    "adv_cfg",
    [
        AdvantageConfig(),
        AdvantageConfig(norm="mean_std_norm", anchor="local"),
        AdvantageConfig(grouping="mixed"),
        AdvantageConfig(estimator="grpo"),
    ],
)
def test_invariant_to_record_order_and_batch_split(adv_cfg: AdvantageConfig) -> None:
    rng = np.random.default_rng(0)
    records = []
    for opponent in ("aggressive", "conservative", "intermediate"):
        for rollout in range(4):
            episodes = [
                (
                    float(rng.choice([-10, 0, 10])),
                    [f"s{rng.integers(3)}" for _ in range(rng.integers(1, 4))],
                )
                for _ in range(3)
            ]
            records.append(make_record(opponent, rollout, episodes))
    full = _keyed(records, compute_advantages(records, ReturnConfig(), adv_cfg))

    perm = [records[i] for i in rng.permutation(len(records))]
    permuted = _keyed(perm, compute_advantages(perm, ReturnConfig(), adv_cfg))
    for key, value in full.items():
        np.testing.assert_allclose(permuted[key], value, atol=1e-12)

    if adv_cfg.grouping == "stationary":
        # Groups are independent: computing each group in its own call changes nothing.
        for opponent in ("aggressive", "conservative", "intermediate"):
            part = [r for r in records if r.opponent == opponent]
            split = _keyed(part, compute_advantages(part, ReturnConfig(), adv_cfg))
            for key, value in split.items():
                np.testing.assert_allclose(value, full[key], atol=1e-12)


def test_grpo_by_hand() -> None:
    # Final rewards [10, -10, 10, 0]: mean 2.5; deviations [7.5, -12.5, 7.5, -2.5];
    # unbiased var = (56.25 + 156.25 + 56.25 + 6.25) / 3 = 275 / 3.
    std = math.sqrt(275 / 3)
    a = grpo_advantages([10.0, -10.0, 10.0, 0.0], ["g"] * 4)
    np.testing.assert_allclose(a, np.array([7.5, -12.5, 7.5, -2.5]) / (std + 1e-6))
    # On records, every turn of a meta-episode carries its record's value; the reward is
    # the last episode's. Final rewards [10, 10, -10]: mean 10/3, deviations
    # [20/3, 20/3, -40/3], unbiased var = (400 + 400 + 1600) / 9 / 2 = 400/3.
    rec_c = make_record("aggressive", 2, [(10.0, ["s0"]), (-10.0, ["s1", "s2"])])
    adv = compute_advantages(
        [REC_A, REC_B, rec_c], ReturnConfig(), AdvantageConfig(estimator="grpo")
    )
    expected = np.array([20 / 3, 20 / 3, -40 / 3]) / (math.sqrt(400 / 3) + 1e-6)
    assert [len(a) for a in adv] == [3, 3, 4]
    for record_adv, value in zip(adv, expected, strict=True):
        np.testing.assert_allclose(record_adv, value)


def test_ids_are_deterministic_hashes() -> None:
    g = group_id(ENV, SEED, "aggressive", SEAT)
    assert g == group_id(ENV, SEED, "aggressive", SEAT)
    assert len(g) == 16 and int(g, 16) >= 0
    assert g != group_id(ENV, SEED, "conservative", SEAT)
    assert g != group_id(ENV, SEED + 1, "aggressive", SEAT)
    assert g != group_id(ENV, SEED, "aggressive", 1)
    assert group_id(ENV, SEED, None, SEAT) != group_id(ENV, SEED, "None", SEAT)
    a = anchor_id(g, "card K, history -", "aggressive", None)
    assert a != anchor_id(g, "card K, history -", "aggressive", 1)
    assert a != anchor_id(g, "card K, history -", None, None)
    # Same ids in a fresh interpreter with another string-hash seed (no hash()/uuid4).
    code = (
        "from mage_rl.rl.advantages import group_id, anchor_id;"
        f"g = group_id({ENV!r}, {SEED}, 'aggressive', {SEAT});"
        "print(g, anchor_id(g, 'card K, history -', 'aggressive', None))"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    assert out.stdout.split() == [g, a]


def test_bad_config_raises() -> None:
    with pytest.raises(ValueError, match="estimator"):
        AdvantageConfig(estimator="ppo")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="omega"):
        AdvantageConfig(omega=-1.0)


def test_the_anchor_scope_cannot_matter_when_every_step_return_is_the_last_reward() -> None:
    """One step per episode, the differential return with reward_to_go and gamma_traj 1:
    every answer's step-level return is the last episode's reward, so a global anchor
    group (both episodes) and local ones (one episode each) have the same mean. Without
    reward_to_go episode 2's return is R_2 - R_1, and the scope does matter."""
    records = [
        make_record("bluffer", r, [(r1, ["bets"]), (r2, ["bets"])])
        for r, (r1, r2) in enumerate([(10.0, 10.0), (-15.0, 10.0), (0.0, 0.0), (0.0, -15.0)])
    ]
    for record in records:  # no reflections between the episodes (meta.context: history)
        record.turns = [t for t in record.turns if t.kind == "play"]

    def advantages(anchor: str, rtg: bool) -> list[list[float]]:
        ret = ReturnConfig(mode="differential", gamma_traj=1.0, reward_to_go=rtg)
        return compute_advantages(records, ret, AdvantageConfig(anchor=anchor, omega=4.0))

    assert advantages("global", True) == advantages("local", True)
    assert advantages("global", False) != advantages("local", False)
