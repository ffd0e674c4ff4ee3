"""Kuhn Poker environment and opponents (SPEC §3, §7)."""

from __future__ import annotations

import itertools

import pyspiel
import pytest

from mage_rl.envs import derive_seed, episode_seed, make_env, make_opponent
from mage_rl.envs.kuhn import BET, PASS

J, Q, K = 0, 1, 2

# (card, betting so far) -> the archetype's action, written out from SPEC §7.
EXPECTED = {
    "conservative": {
        (J, ""): PASS, (Q, ""): PASS, (K, ""): BET,
        (J, "p"): PASS, (Q, "p"): PASS, (K, "p"): BET,
        (J, "b"): PASS, (Q, "b"): PASS, (K, "b"): BET,
        (J, "pb"): PASS, (Q, "pb"): PASS, (K, "pb"): BET,
    },
    "aggressive": {
        (J, ""): BET, (Q, ""): BET, (K, ""): BET,
        (J, "p"): BET, (Q, "p"): BET, (K, "p"): BET,
        (J, "b"): PASS, (Q, "b"): BET, (K, "b"): BET,
        (J, "pb"): PASS, (Q, "pb"): BET, (K, "pb"): BET,
    },
    "intermediate": {
        (J, ""): PASS, (Q, ""): BET, (K, ""): BET,
        (J, "p"): PASS, (Q, "p"): BET, (K, "p"): BET,
        (J, "b"): PASS, (Q, "b"): PASS, (K, "b"): BET,
        (J, "pb"): PASS, (Q, "pb"): PASS, (K, "pb"): BET,
    },
}  # fmt: skip


def _state(card: int, history: str) -> tuple[pyspiel.State, int]:
    """A state where the player to act holds ``card`` after ``history``."""
    game = pyspiel.load_game("kuhn_poker")
    state = game.new_initial_state()
    player = len(history) % 2
    other = (card + 1) % 3
    deal = (card, other) if player == 0 else (other, card)
    for c in deal:
        state.apply_action(c)
    for ch in history:
        state.apply_action(PASS if ch == "p" else BET)
    assert state.current_player() == player
    return state, player


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_archetype_decisions_for_every_card_and_history(name: str) -> None:
    opponent = make_opponent(f"kuhn:{name}")
    for (card, history), action in EXPECTED[name].items():
        state, player = _state(card, history)
        assert opponent.act(state, player) == action, (name, card, history)


def test_cfr_opponent_is_argmax_of_average_policy_and_cached(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("MAGE_RL_CACHE", str(tmp_path))
    opponent = make_opponent("kuhn:cfr")
    assert (tmp_path / "kuhn_cfr_1000.json").exists()
    # CFR's equilibrium always calls and bets with the king, and folds the jack to a bet.
    for history in ("p", "b"):
        state, player = _state(K, history)
        assert opponent.act(state, player) == BET
    state, player = _state(J, "b")
    assert opponent.act(state, player) == PASS
    again = make_opponent("kuhn:cfr")
    assert again.table == opponent.table


def _play(env, answers):
    results = []
    for answer in answers:
        results.append(env.step(answer))
        if results[-1].done:
            break
    return results


def test_showdown_reveals_both_cards_and_pays_five_per_chip() -> None:
    env = make_env("kuhn", "kuhn:aggressive", seat=0)
    for seed in range(100):
        env.reset(seed)
        if env.state.history()[:2] == [K, Q]:  # the aggressive opponent calls with Q
            break
    results = _play(env, ["<action>BET</action>"])
    final = results[-1]
    assert final.done and final.info.outcome == "won"
    assert final.info.payoff == 2.0 and final.reward == 10.0
    assert "Showdown: your K against the opponent's" in final.info.feedback
    assert "You won 2 chips" in final.info.feedback
    assert final.info.extra["opponent_card"] in ("J", "Q")


def test_fold_reveals_no_cards() -> None:
    env = make_env("kuhn", "kuhn:conservative", seat=0)
    for seed in range(100):
        env.reset(seed)
        if env.state.history()[:2] == [J, Q]:
            break
    final = _play(env, ["<action>BET</action>"])[-1]
    # The conservative opponent folds anything but a king to a bet.
    assert final.info.payoff == 1.0 and final.reward == 5.0 and final.info.outcome == "won"
    assert "opponent folded" in final.info.feedback
    assert "opponent_card" not in final.info.extra and "Q" not in final.info.feedback


def test_invalid_response_leaves_state_unchanged_and_counts_a_turn() -> None:
    env = make_env("kuhn", "kuhn:intermediate", seat=1, max_turns=3)
    obs = env.reset(7)
    history = list(env.state.history())
    for bad in ["I bet!", "<action>RAISE</action>", "<action></action>"]:
        result = env.step(bad)
        assert result.info.invalid and result.info.invalid_reason
        assert env.state.history() == history
        assert result.observation == obs
        assert result.reward == 0.0
    assert result.done and result.info.outcome == "unfinished"


def test_poker_synonyms_and_last_tag_wins() -> None:
    env = make_env("kuhn", "kuhn:conservative", seat=0)
    env.reset(3)
    result = env.step("<think>maybe <action>BET</action></think> I check. <action>check</action>")
    assert not result.info.invalid and result.info.action == "PASS"


def test_replay_protocol_repeats_the_deal_and_fresh_changes_it() -> None:
    env = make_env("kuhn", "kuhn:aggressive", seat=0)
    replay = [env.reset(episode_seed(11, k, "replay")) for k in range(4)]
    assert len(set(replay)) == 1
    deals = set()
    for task in range(20):
        env.reset(episode_seed(task, 0, "fresh"))
        deals.add(tuple(env.state.history()[:2]))
    assert len(deals) > 1
    fresh_a = [env.reset(episode_seed(5, k, "fresh")) for k in range(6)]
    fresh_b = [env.reset(episode_seed(5, k, "fresh")) for k in range(6)]
    assert fresh_a == fresh_b  # same task seed, same sequence of deals


def test_every_deal_occurs_with_fresh_seeds() -> None:
    env = make_env("kuhn", "kuhn:aggressive", seat=1)
    seen = set()
    for i in range(200):
        env.reset(derive_seed("t", i))
        seen.add(tuple(env.state.history()[:2]))
    assert seen == set(itertools.permutations(range(3), 2))


def test_second_seat_sees_opponent_move_first() -> None:
    env = make_env("kuhn", "kuhn:aggressive", seat=1)
    obs = env.reset(0)
    assert "opponent BET" in obs and env.transcript == ["Opponent: BET"]
    assert env.legal_actions() == ["PASS", "BET"]


@pytest.mark.parametrize("word", ["paſſ", "ＢＥＴ", "BЕT", "PASS\u200b", "\u202ePASS", "BET\x00"])
def test_only_ascii_spellings_are_actions(word: str) -> None:
    env = make_env("kuhn", "kuhn:intermediate", seat=0)
    env.reset(1)
    result = env.step(f"<action>{word}</action>")
    assert result.info.invalid and "not an action" in result.info.invalid_reason


def test_ascii_case_and_end_punctuation_are_accepted() -> None:
    env = make_env("kuhn", "kuhn:intermediate", seat=0)
    env.reset(1)
    assert env.step("<action> bet! </action>").info.action == "BET"
