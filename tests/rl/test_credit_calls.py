"""Credit for every LLM call of a user's graph (SPEC §4, "any LLM call ... is a sample"),
checked on hand-computed examples."""

from __future__ import annotations

import numpy as np
import pytest

from mage_rl.records import EpisodeResult, MetaEpisodeRecord, Turn, group_id
from mage_rl.rl.advantages import AdvantageConfig, compute_advantages
from mage_rl.rl.batching import samples_from_records
from mage_rl.rl.returns import ReturnConfig, credit_sources, sample_targets

# One meta-episode, K = 2, in time order (a planner: a plan call, then the acting call):
#   episode 0: c0 (plan) p1 (act) c2 (plan) p3 (act)    lost, R_0 = -10
#   episode 1: r4 (reflect) c5 (plan) p6 (act) c7 (a summary after the last action)
#                                                       won,  R_1 = +10
KINDS = ["call", "play", "call", "play", "reflect", "call", "play", "call"]
EPISODES = [0, 0, 0, 0, 1, 1, 1, 1]
R = [-10.0, 10.0]
CFG = ReturnConfig(gamma_step=0.95, gamma_traj=0.6, invalid_penalty=2.0, length_penalty=2.0)


def test_credit_sources_by_hand() -> None:
    # Each call takes the next acting call; c7 has none after it, so the last before it.
    assert credit_sources(KINDS).tolist() == [1, 1, 3, 3, -1, 6, 6, 6]


def test_returns_and_scores_of_calls_by_hand() -> None:
    # D = [-10, 20]. Acting calls: G6 = 20; G3 = D_0 + 0.6 * G(entry of episode 1) =
    # -10 + 12 = 2; G1 = 0.95 * 2 = 1.9. Reflect r4 takes episode 1's entry, 20.
    # Calls take their source's return undiscounted: c0 1.9, c2 2, c5 20, c7 20.
    # Scores: acting calls D_k; reflect 0; calls their source's D_k, minus own penalties:
    # c5 marked invalid by its node (-2), c7 long (12 of 16 tokens: w = 0.5, -1).
    invalid = [False, False, False, False, False, True, False, False]
    lengths = [4, 4, 4, 4, 4, 4, 4, 12]
    returns, scores = sample_targets(KINDS, EPISODES, R, invalid, lengths, 16, CFG)
    np.testing.assert_allclose(returns, [1.9, 1.9, 2.0, 2.0, 20.0, 20.0, 20.0, 20.0])
    np.testing.assert_allclose(scores, [-10, -10, -10, -10, 0, 18, 20, 19])


def test_without_calls_the_rule_is_the_old_one() -> None:
    # Dropping the non-acting calls leaves exactly the play/reflect returns of SPEC §4.
    keep = [i for i, k in enumerate(KINDS) if k != "call"]
    kinds = [KINDS[i] for i in keep]
    episodes = [EPISODES[i] for i in keep]
    returns, scores = sample_targets(kinds, episodes, R, [False] * 4, [4] * 4, 16, CFG)
    np.testing.assert_allclose(returns, [1.9, 2.0, 20.0, 20.0])
    np.testing.assert_allclose(scores, [-10, -10, 0, 20])


def test_reward_to_go_reaches_calls_through_their_source() -> None:
    cfg = ReturnConfig(gamma_step=0.95, gamma_traj=0.6, reward_to_go=True)
    returns, scores = sample_targets(KINDS, EPISODES, R, [False] * 8, [4] * 8, 16, cfg)
    # Episode 1's turns drop -R_0: G6 = 20 - 10 = 10 (= R_1); episode 0 keeps its terms.
    np.testing.assert_allclose(returns, [1.9, 1.9, 2.0, 2.0, 10.0, 10.0, 10.0, 10.0])
    np.testing.assert_allclose(scores, [-10, -10, -10, -10, 0, 10, 10, 10])


def _turn(kind: str, node: str, anchor: str, episode: int = 0, step: int = 0) -> Turn:
    return Turn(
        kind=kind,  # type: ignore[arg-type]
        episode=episode,
        step=step,
        prompt_ids=[1, 2],
        response_ids=[3],
        logprobs=[-0.5],
        anchor=anchor,
        opponent="kuhn_poker:aggressive",
        response_length=1,
        max_response_length=16,
        node=node,
    )


def _record(rollout: int, turns: list[Turn], reward: float) -> MetaEpisodeRecord:
    uid = group_id("kuhn_poker", 7, "kuhn_poker:aggressive", 0)
    outcome = "won" if reward > 0 else "lost"
    return MetaEpisodeRecord(
        uid=uid,
        rollout=rollout,
        env="kuhn_poker",
        seed=7,
        opponent="kuhn_poker:aggressive",
        seat=0,
        episodes=[EpisodeResult(0, outcome, reward, turns=sum(t.acting for t in turns))],
        turns=turns,
    )


def test_advantages_of_a_two_call_graph_by_hand() -> None:
    # Two rollouts of one task, K = 1, a plan call and an acting call per step.
    #   A: plan@o0, act@o0                      won,  R = +10
    #   B: plan@o0, act@o0, plan@o1, act@o1     lost, R = -10
    # Returns: A 10, 10. B: act@o1 -10, plan@o1 -10, act@o0 -9.5, plan@o0 -9.5.
    # Scores: A 10, 10; B -10 x 4. Group mean -10/3: A_E = 40/3 (A), -20/3 (B).
    # Anchor groups (node, observation): (plan, o0) and (act, o0) each hold 10 and -9.5
    # (mean 0.25, A_S = +-9.75); (plan, o1) and (act, o1) are groups of one (A_S = 0).
    a = _record(0, [_turn("call", "plan", "o0"), _turn("play", "act", "o0")], 10.0)
    b = _record(
        1,
        [
            _turn("call", "plan", "o0"),
            _turn("play", "act", "o0"),
            _turn("call", "plan", "o1", step=1),
            _turn("play", "act", "o1", step=1),
        ],
        -10.0,
    )
    advantages = compute_advantages([a, b], CFG, AdvantageConfig(norm="mean_norm", omega=1.0))
    ae_a, ae_b = 40 / 3, -20 / 3
    np.testing.assert_allclose(advantages[0], [ae_a + 9.75, ae_a + 9.75])
    np.testing.assert_allclose(advantages[1], [ae_b - 9.75, ae_b - 9.75, ae_b, ae_b])


def test_calls_of_different_nodes_never_share_an_anchor_group() -> None:
    # Same observation, same return, different nodes: two anchor groups of one each.
    turns = [_turn("call", "plan", "o0"), _turn("play", "act", "o0")]
    advantages = compute_advantages(
        [_record(0, turns, 10.0)], CFG, AdvantageConfig(norm="mean_norm", omega=1.0)
    )
    assert advantages == [[0.0, 0.0]]  # a group of one record: A_E = 0, and A_S = 0


def test_an_untrained_call_is_credited_but_gives_no_sample() -> None:
    turns = [_turn("call", "plan", "o0"), _turn("play", "act", "o0")]
    turns[0].trained = False
    records = [_record(0, turns, 10.0), _record(1, [_turn("play", "act", "o0")], -10.0)]
    advantages = compute_advantages(records, CFG)
    assert len(advantages[0]) == 2
    samples = samples_from_records(records, advantages)
    assert len(samples) == 2
    assert samples[0].advantage == pytest.approx(advantages[0][1])
