"""What an agent plays at each decision state: counts from records, the report's table."""

from __future__ import annotations

from mage_rl.eval.decisions import (
    MAX_STATES,
    action_counts,
    counts_by_episode,
    decisions_table,
    episodes_table,
    small_game_counts,
)
from mage_rl.records import MetaEpisodeRecord

OPEN_J = "Your card: J.\nBetting so far: none.\nLegal actions: PASS, BET."
OPEN_K = "Your card: K.\nBetting so far: none.\nLegal actions: PASS, BET."


def _turn(
    anchor: str, text: str, kind: str = "play", invalid: bool = False, episode: int = 0
) -> dict:
    return {"kind": kind, "anchor": anchor, "text": text, "invalid": invalid, "episode": episode}


def test_counts_by_state_with_invalid_answers_and_other_turns_left_out() -> None:
    records = [
        {"turns": [
            _turn("", "<remark>bet less</remark>", kind="reflect"),
            _turn(OPEN_J, "<action>PASS</action>"),
            _turn(OPEN_K, "I hold the king. <action>BET</action>"),
        ]},
        {"turns": [
            _turn(OPEN_J, "<action>BET</action>"),
            _turn(OPEN_J, "no tag at all", invalid=True),
            _turn(OPEN_K, "<action>BET</action>"),
        ]},
    ]  # fmt: skip
    counts = action_counts(records)
    j, k = (" ".join(a.splitlines()) for a in (OPEN_J, OPEN_K))
    assert counts == {j: {"PASS": 1, "BET": 1, "invalid": 1}, k: {"BET": 2}}


def test_table_rows_are_states_and_columns_agents() -> None:
    before = action_counts([{"turns": [_turn(OPEN_J, "<action>BET</action>")] * 3}])
    after = action_counts(
        [{"turns": [_turn(OPEN_J, "<action>PASS</action>"), _turn(OPEN_K, "<action>BET</action>")]}]
    )
    table = decisions_table([("untrained", before), ("trained", after)])
    assert table is not None
    assert table[0] == "| state | untrained | trained |"
    j_row, k_row = table[2:]
    assert j_row.endswith("| BET 1.00 (3) | PASS 1.00 (1) |")
    assert k_row.endswith("|  | BET 1.00 (1) |")  # the untrained agent never held the king
    # Shares ordered by frequency, then by name.
    mixed = action_counts([{"turns": [_turn(OPEN_J, f"<action>{a}</action>") for a in "BPB"]}])
    assert decisions_table([("x", mixed)])[2].endswith("| B 0.67 · P 0.33 (3) |")
    # A '|' in an observation does not split its row.
    boxed = action_counts([{"turns": [_turn("a|b", "<action>X</action>")]}])
    assert decisions_table([("x", boxed)])[2] == "| a\\|b | X 1.00 (1) |"


def test_no_table_for_games_with_many_states_or_none() -> None:
    many = action_counts(
        [{"turns": [_turn(f"board {i}", "<action>1</action>") for i in range(MAX_STATES + 1)]}]
    )
    assert decisions_table([("agent", many)]) is None
    assert decisions_table([("agent", {})]) is None
    many_states = [{"turns": [_turn(f"board {i}", "<action>1</action>") for i in range(17)]}]
    assert small_game_counts(many_states) is None
    assert small_game_counts([{"turns": []}]) == {}


def test_record_objects_count_like_their_dicts() -> None:
    record = {
        "uid": "u", "rollout": 0, "env": "kuhn_poker", "seed": 1, "opponent": "kuhn:aggressive",
        "seat": 0, "turns": [_turn(OPEN_J, "<action>PASS</action>") | {"episode": 0, "step": 0}],
    }  # fmt: skip
    obj = MetaEpisodeRecord.from_dict(record)
    assert (
        action_counts([obj])
        == action_counts([record])
        == {" ".join(OPEN_J.splitlines()): {"PASS": 1}}
    )


def test_counts_by_episode_split_the_same_answers_by_episode() -> None:
    records = [
        {"turns": [
            _turn(OPEN_J, "<action>PASS</action>", episode=0),
            _turn("", "<remark>bet</remark>", kind="reflect", episode=1),
            _turn(OPEN_K, "<action>BET</action>", episode=1),
            _turn(OPEN_J, "no tag", invalid=True, episode=2),
        ]},
        {"turns": [
            _turn(OPEN_K, "<action>BET</action>", episode=0),
            _turn(OPEN_J, "<action>BET</action>", episode=2),
        ]},
    ]  # fmt: skip
    by_episode = counts_by_episode(records)
    assert by_episode == {0: {"PASS": 1, "BET": 1}, 1: {"BET": 1}, 2: {"invalid": 1, "BET": 1}}
    # Every play answer of action_counts, counted once.
    total = sum(sum(c.values()) for c in action_counts(records).values())
    assert sum(sum(c.values()) for c in by_episode.values()) == total
    table = episodes_table([("untrained", by_episode), ("trained", {2: {"BET": 4}})])
    assert table is not None
    assert table[0] == "| agent | episode 1 | episode 2 | episode 3 |"
    assert (
        table[2]
        == "| untrained | BET 0.50 · PASS 0.50 (2) | BET 1.00 (1) | BET 0.50 · invalid 0.50 (2) |"
    )
    assert table[3] == "| trained |  |  | BET 1.00 (4) |"
    assert episodes_table([("agent", {})]) is None
