"""The parts of every call's credit (return, score, A_E, A_S, A) and the per-node metrics
built from them, on hand-made records."""

from __future__ import annotations

import numpy as np
import pytest

from mage_rl.records import EpisodeResult, MetaEpisodeRecord, Turn, group_id
from mage_rl.rl.advantages import AdvantageConfig, compute_advantages, credit_parts
from mage_rl.rl.metrics_log import node_metrics
from mage_rl.rl.returns import ReturnConfig

OPPONENT = "kuhn_poker:aggressive"


def _record(rollout: int, episodes: list[tuple[float, list[Turn]]]) -> MetaEpisodeRecord:
    """A meta-episode of the given episodes: (R_k, its turns); the last turn of each
    episode carries R_k."""
    turns: list[Turn] = []
    results = []
    for k, (reward, episode_turns) in enumerate(episodes):
        episode_turns[-1].reward = reward
        turns += episode_turns
        results.append(EpisodeResult(k, "won" if reward > 0 else "lost", reward))
    uid = group_id("kuhn_poker", 7, OPPONENT, 0)
    return MetaEpisodeRecord(uid, rollout, "kuhn_poker", 7, OPPONENT, 0, results, turns)


def _turn(kind: str, node: str, episode: int, anchor: str = "s0", **kw: object) -> Turn:
    return Turn(kind, episode, 0, anchor=anchor, opponent=OPPONENT, node=node, **kw)  # type: ignore[arg-type]


def _batch() -> list[MetaEpisodeRecord]:
    # As tests/rl/test_advantages.py: A lost then won (R = [-10, 10]), B won twice; each
    # plays "s0", reflects, plays "s0". A also plans before each of its acting calls.
    a = _record(
        0,
        [
            (-10.0, [_turn("call", "plan", 0), _turn("play", "act", 0)]),
            (10.0, [_turn("reflect", "reflect", 1, "reflection"), _turn("call", "plan", 1),
                    _turn("play", "act", 1)]),
        ],
    )  # fmt: skip
    b = _record(
        1,
        [
            (10.0, [_turn("play", "act", 0)]),
            (10.0, [_turn("reflect", "reflect", 1, "reflection"), _turn("play", "act", 1)]),
        ],
    )
    return [a, b]


def test_parts_by_hand() -> None:
    # Differential: A has D = [-10, 20], B has D = [10, 0]; gamma_traj 0.6.
    # Returns  A: act@1 20, reflect 20, act@0 -10 + 0.6 * 20 = 2; each plan takes its act's.
    #          B: act@1 0, reflect 0, act@0 10.
    # Scores   A: [-10, -10, 0, 20, 20]   B: [10, 0, 0]   -> group mean 30 / 8 = 3.75.
    # Anchors (node, s0): act = {2, 20, 10, 0} mean 8; plan = {2, 20} mean 11;
    # reflection = {20, 0} mean 10.
    credit = credit_parts(_batch(), ReturnConfig(), AdvantageConfig())
    a, b = credit
    assert [c.ret for c in a] == pytest.approx([2, 2, 20, 20, 20])
    assert [c.ret for c in b] == pytest.approx([10, 0, 0])
    assert [c.score for c in a] == pytest.approx([-10, -10, 0, 20, 20])
    assert [c.score for c in b] == pytest.approx([10, 0, 0])
    assert [c.a_episode for c in a] == pytest.approx([-13.75, -13.75, -3.75, 16.25, 16.25])
    assert [c.a_episode for c in b] == pytest.approx([6.25, -3.75, -3.75])
    assert [c.a_step for c in a] == pytest.approx([-9, -6, 10, 9, 12])
    assert [c.a_step for c in b] == pytest.approx([2, -10, -8])
    assert [c.reward for c in a] == [0, -10, 0, 0, 10]
    for calls in credit:
        for c in calls:
            assert c.advantage == pytest.approx(c.a_episode + c.a_step)


@pytest.mark.parametrize(
    "adv_cfg",
    [
        AdvantageConfig(),
        AdvantageConfig(norm="mean_std_norm", omega=0.5),
        AdvantageConfig(anchor="local", omega=2.0),
        AdvantageConfig(grouping="mixed"),
    ],
)
def test_parts_agree_with_compute_advantages(adv_cfg: AdvantageConfig) -> None:
    records = _batch()
    ret_cfg = ReturnConfig(mode="cumulative", gamma_traj=0.9)
    credit = credit_parts(records, ret_cfg, adv_cfg)
    assert [[c.advantage for c in calls] for calls in credit] == compute_advantages(
        records, ret_cfg, adv_cfg
    )
    assert [[c.a_step for c in calls] for calls in credit] == compute_advantages(
        records, ret_cfg, adv_cfg, step_only=True
    )
    for calls in credit:
        for c in calls:
            assert c.advantage == pytest.approx(c.a_episode + adv_cfg.omega * c.a_step)


def test_grpo_parts() -> None:
    records = _batch()
    cfg = AdvantageConfig(estimator="grpo")
    credit = credit_parts(records, adv_cfg=cfg)
    assert [[c.advantage for c in calls] for calls in credit] == compute_advantages(
        records, adv_cfg=cfg
    )
    for record, calls in zip(records, credit, strict=True):
        assert len(calls) == len(record.turns)
        for c in calls:
            assert c.ret == c.score == record.episodes[-1].reward
            assert c.a_step == 0.0 and c.a_episode == c.advantage


def test_empty_batch_and_records_without_turns() -> None:
    assert credit_parts([]) == []
    empty = MetaEpisodeRecord("u", 0, "kuhn_poker", 1, OPPONENT, 0)
    assert credit_parts([empty]) == [[]]
    assert compute_advantages([empty]) == [[]]


def test_node_metrics_by_hand() -> None:
    records = _batch()
    a, b = records
    a.turns[1].invalid = True  # act of episode 0: invalid
    a.turns[0].response_ids, a.turns[0].logprobs = [1, 2], [-1.0, -3.0]  # plan: surprise 2
    a.turns[3].response_ids, a.turns[3].logprobs = [1, 2, 3, 4], [-1.0] * 4  # plan: 1
    credit = credit_parts(records)
    metrics = node_metrics(records, credit)
    assert set(k.split("/")[1] for k in metrics) == {"plan", "act", "reflect"}
    assert metrics["nodes/act/calls"] == 4 and metrics["nodes/plan/calls"] == 2
    assert metrics["nodes/plan/tokens"] == 6 and metrics["nodes/act/tokens"] == 0
    assert metrics["nodes/act/invalid_share"] == 0.25
    assert "nodes/plan/invalid_share" not in metrics  # a plan never acts
    assert metrics["nodes/plan/entropy"] == pytest.approx(1.5)  # mean of 2 and 1
    assert "nodes/act/entropy" not in metrics  # no log-probs recorded
    assert metrics["nodes/plan/return_mean"] == pytest.approx(11)
    assert metrics["nodes/plan/return_std"] == pytest.approx(9)
    assert metrics["nodes/plan/a_step_mean"] == pytest.approx(0)  # -9 and 9
    plan = [c for c, t in zip(credit[0], a.turns, strict=True) if t.node == "plan"]
    for key, values in (
        ("advantage_mean", np.mean([c.advantage for c in plan])),
        ("advantage_std", np.std([c.advantage for c in plan])),
        ("a_episode_mean", np.mean([c.a_episode for c in plan])),
    ):
        assert metrics[f"nodes/plan/{key}"] == pytest.approx(values), key
