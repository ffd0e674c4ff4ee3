"""Tic-Tac-Toe environment and opponents (SPEC §7)."""

from __future__ import annotations

import pyspiel
import pytest

from mage_rl.envs import derive_seed, episode_seed, make_env, make_opponent
from mage_rl.envs.tictactoe import PATTERNS


def _random_vs(opponent_spec: str, mcts_seat: int, games: int) -> dict[str, int]:
    game = pyspiel.load_game("tic_tac_toe")
    mcts = make_opponent(opponent_spec)
    rand = make_opponent("ttt:random")
    tally = {"win": 0, "draw": 0, "loss": 0}
    for g in range(games):
        mcts.reset(derive_seed("mcts", g))
        rand.reset(derive_seed("rand", g))
        state = game.new_initial_state()
        while not state.is_terminal():
            player = state.current_player()
            bot = mcts if player == mcts_seat else rand
            state.apply_action(bot.act(state, player))
        value = state.returns()[mcts_seat]
        tally["win" if value > 0 else "loss" if value < 0 else "draw"] += 1
    return tally


@pytest.mark.parametrize("seat", [0, 1])
def test_mcts100_never_loses_to_random(seat: int) -> None:
    tally = _random_vs("ttt:mcts:100", seat, 50)
    assert tally["loss"] == 0, tally
    assert tally["win"] > 35, tally


@pytest.mark.parametrize("pattern", sorted(PATTERNS))
def test_pattern_opponents_follow_their_priority_lists(pattern: str) -> None:
    game = pyspiel.load_game("tic_tac_toe")
    opponent = make_opponent(f"ttt:pattern:{pattern}")
    opponent.reset(0)
    state = game.new_initial_state()
    priority = PATTERNS[pattern]
    # Fill cells one by one; the opponent must always pick the first free listed cell.
    while not state.is_terminal():
        legal = state.legal_actions()
        choice = opponent.act(state, state.current_player())
        listed = [a for a in priority if a in legal]
        if listed:
            assert choice == listed[0]
        else:
            assert choice in legal
        state.apply_action(choice)


def test_occupied_cell_is_invalid_and_changes_nothing() -> None:
    env = make_env("ttt", "ttt:pattern:centre_first", seat=1)
    obs = env.reset(0)
    assert "X" in obs.split("Board")[1]  # the opponent took the centre
    before = str(env.state)
    result = env.step("<action>(2, 2)</action>")
    assert result.info.invalid and "already taken" in result.info.invalid_reason
    assert str(env.state) == before and result.observation == obs
    result = env.step("<action>(4, 1)</action>")
    assert result.info.invalid and "off the board" in result.info.invalid_reason
    result = env.step("<action>top left</action>")
    assert result.info.invalid and "could not read a cell" in result.info.invalid_reason


def test_win_gives_plus_ten() -> None:
    env = make_env("ttt", "ttt:pattern:edges_first", seat=0)
    env.reset(0)
    # X: (1,1) (2,2) (3,3); the edges-first opponent never blocks the diagonal in time.
    for move in ["(1, 1)", "(2, 2)", "(3, 3)"]:
        result = env.step(f"<action>{move}</action>")
    assert result.done and result.info.outcome == "won" and result.reward == 10.0


def test_loss_gives_minus_ten() -> None:
    env = make_env("ttt", "ttt:pattern:diagonal", seat=1)
    env.reset(0)  # X takes (1,1)
    for move in ["(1, 2)", "(1, 3)"]:  # X takes (2,2) then (3,3)
        result = env.step(f"<action>{move}</action>")
    assert result.done and result.info.outcome == "lost" and result.reward == -10.0


def test_replay_reproduces_the_same_games_with_mcts() -> None:
    env = make_env("ttt", "ttt:mcts:100", seat=1)
    boards = []
    for k in range(3):
        env.reset(episode_seed(3, k, "replay"))
        env.step("<action>(1, 1)</action>")
        boards.append(str(env.state))
    assert len(set(boards)) == 1


def test_same_seed_same_game_with_random_opponent() -> None:
    def play(seed: int) -> str:
        env = make_env("ttt", "ttt:random", seat=0)
        env.reset(seed)
        for move in ["(1, 1)", "(1, 2)", "(1, 3)", "(2, 1)", "(2, 2)", "(2, 3)", "(3, 1)"]:
            if env.done:
                break
            env.step(f"<action>{move}</action>")
        return str(env.state)

    assert play(5) == play(5)
    assert len({play(s) for s in range(8)}) > 1


@pytest.mark.parametrize(
    "text", ["(２, 1)", "٢,3", "2\x0b3", "2\x0c3", "(1,,2)", "1.2", "(1, 2) x", "12"]
)
def test_cells_are_ascii_digits_with_comma_or_space(text: str) -> None:
    env = make_env("ttt", "ttt:random", seat=0)
    env.reset(0)
    result = env.step(f"<action>{text}</action>")
    assert result.info.invalid and "could not read a cell" in result.info.invalid_reason


@pytest.mark.parametrize("text", ["(2, 1)", "2,1", "2 1", "( 2 ,\t1 )", "\n2, 1\n"])
def test_cell_spellings_of_the_grammar(text: str) -> None:
    env = make_env("ttt", "ttt:random", seat=0)
    env.reset(0)
    assert env.step(f"<action>{text}</action>").info.action == "(2, 1)"
