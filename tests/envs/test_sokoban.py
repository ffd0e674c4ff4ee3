"""Sokoban: room rules, solver, generator, turn parsing, protocols and plumbing."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.messages import BaseMessage

from mage_rl.config import RunConfig
from mage_rl.envs import (
    ENV_NAMES,
    POPULATION_PRESETS,
    episode_seed,
    make_env,
    make_opponent,
)
from mage_rl.envs.sokoban import (
    MAX_SOLUTION_MOVES,
    SokobanEnv,
    parse_moves,
)
from mage_rl.envs.sokoban_room import Room, generate_room, solve
from mage_rl.graphs import GraphOptions, mage_graph


class ScriptedChat(FakeListChatModel):
    """Play turns from ``responses`` in order, reflect turns from ``reflections``."""

    reflections: list[str] = []
    reflect_i: int = 0

    def _call(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> str:
        if "<remark>" in messages[-1].content:
            self.reflect_i += 1
            return self.reflections[(self.reflect_i - 1) % len(self.reflections)]
        return super()._call(messages, *args, **kwargs)


# A 1-box room: the box at (2, 2) (0-based) sits one push left of the target at (2, 1).
ONE_PUSH = """
######
#----#
#.$@-#
#----#
#----#
######
"""


def act(*moves: str) -> str:
    return f"<action>{', '.join(moves)}</action>"


def env_with(room_text: str, max_turns: int = 7) -> SokobanEnv:
    """An environment whose current episode is the given room."""
    env = SokobanEnv(num_boxes=1, max_turns=max_turns)
    env.reset(0)
    env.room = Room.from_text(room_text)
    return env


# -- rules of a move ---------------------------------------------------------------------


def test_push_moves_the_box_and_solves_the_room() -> None:
    env = env_with(ONE_PUSH)
    result = env.step(act("left"))
    assert env.room.player == (2, 2) and env.room.boxes == {(2, 1)}
    assert result.done and result.reward == 10.0 and result.info.outcome == "won"
    assert result.info.events == ["You: left (1 push)"]
    assert "the room is solved" in result.observation
    assert "*" in env.room.to_text()  # box on target


def test_walls_block_the_player_and_boxes() -> None:
    room = Room.from_text(ONE_PUSH)
    up_room = room.move("up")
    assert up_room.player == (1, 3)
    assert up_room.blocked_reason("up") == "a wall is in the way"
    with pytest.raises(ValueError, match="wall"):
        up_room.move("up")
    # A box against the wall cannot be pushed into it.
    wall_box = Room.from_text("#####\n#$@.#\n#####")
    assert wall_box.blocked_reason("left") == "the box cannot be pushed into a wall"
    two_boxes = Room.from_text("######\n#.$$@#\n#.---#\n######")
    assert two_boxes.blocked_reason("left") == "the box cannot be pushed into another box"
    assert two_boxes.open_moves() == ["down"]


def test_box_on_target_can_be_pushed_off_again() -> None:
    room = Room.from_text("######\n#-*@-#\n#-.$-#\n######")
    assert room.boxes_on_targets == 1 and not room.solved
    off = room.move("left")
    assert off.boxes == {(1, 1), (2, 3)} and off.boxes_on_targets == 0


def test_cornered_box_is_a_deadlock() -> None:
    # The box can still be pushed left onto the target (from the right). Pushing it
    # right instead wedges it in the top-right corner, where it can never move again.
    room = Room.from_text("######\n#.@$-#\n#----#\n#----#\n######")
    assert solve(room) is not None and room.stuck_boxes() == []
    stuck = room.move("right")
    assert stuck.boxes == {(1, 4)} and stuck.stuck_boxes() == [(1, 4)]
    assert solve(stuck) is None
    # Whatever the player does, the box stays where it is.
    frontier, seen = [stuck], {stuck}
    while frontier:
        current = frontier.pop()
        assert current.boxes == {(1, 4)}
        for move in current.open_moves():
            nxt = current.move(move)
            if nxt not in seen:
                seen.add(nxt)
                frontier.append(nxt)
    assert len(seen) > 5  # the player did walk around


def test_deadlock_is_named_in_the_feedback_at_the_turn_limit() -> None:
    env = env_with("######\n#.@$-#\n#----#\n#----#\n######", max_turns=2)
    env.step(act("right"))
    result = env.step(act("down"))
    assert result.done and result.info.outcome == "unfinished" and result.reward == 0.0
    assert "Stuck in a corner" in result.info.feedback and "(2, 5)" in result.info.feedback
    assert result.info.extra["stuck_boxes"] == [[1, 4]]


def test_solver_finds_a_shortest_solution() -> None:
    assert solve(Room.from_text(ONE_PUSH)) == ["left"]
    # The box must be pushed left, so the player first walks round to its right side.
    room = Room.from_text("######\n#@---#\n#.$--#\n#----#\n######")
    solution = solve(room)
    assert solution == ["right", "right", "down", "left"]
    end = room
    for move in solution:
        end = end.move(move)
    assert end.solved
    assert solve(room, max_moves=3) is None
    # Rooms without an outer wall: the grid's edge blocks like a wall (no wrapping).
    assert solve(Room.from_text("-@$\n.--")) is None
    assert Room.from_text("-@$\n.--").blocked_reason("right") == (
        "the box cannot be pushed into a wall"
    )


def test_room_text_round_trips_and_bad_rooms_are_rejected() -> None:
    room = generate_room(5, 2)
    assert Room.from_text(room.to_text()) == room
    with pytest.raises(ValueError, match="exactly one player"):
        Room.from_text("#####\n#$.-#\n#####")
    with pytest.raises(ValueError, match="as many targets as boxes"):
        Room.from_text("#####\n#$$.@#\n#####")


# -- generator ---------------------------------------------------------------------------


@pytest.mark.parametrize("num_boxes", [1, 2, 3])
def test_every_generated_room_is_solvable_within_the_turn_budget(num_boxes: int) -> None:
    seeds = range(1000, 1000 + 120)
    for seed in seeds:
        room = generate_room(seed, num_boxes)
        assert len(room.boxes) == len(room.targets) == num_boxes
        assert (room.height, room.width) == (6, 6)
        assert not room.boxes & room.targets  # no box starts on a target
        assert room.player not in room.walls | room.boxes
        solution = solve(room)  # unbounded search: an independent check
        assert solution is not None, room.to_text()
        assert 4 <= len(solution) <= MAX_SOLUTION_MOVES
        end = room
        for move in solution:
            end = end.move(move)
        assert end.solved


def test_generation_is_deterministic_and_varied() -> None:
    generate_room.cache_clear()
    first = [generate_room(s, 2) for s in range(20)]
    generate_room.cache_clear()
    assert [generate_room(s, 2) for s in range(20)] == first
    assert len({r.to_text() for r in first}) == 20


# -- turn parsing ------------------------------------------------------------------------


def test_parse_moves_accepts_up_to_three_moves_in_several_spellings() -> None:
    assert parse_moves("up") == ["up"]
    assert parse_moves("Up, LEFT, left") == ["up", "left", "left"]
    assert parse_moves("down then right") == ["down", "right"]
    assert parse_moves("up -> left") == ["up", "left"]
    assert parse_moves("[up; down]") == ["up", "down"]
    assert parse_moves("up \u2192 right and down.") == ["up", "right", "down"]


@pytest.mark.parametrize("text", ["(up)", "'up'", "up()", "ｕp", "uр", "up\x0bleft", "UP\x00"])
def test_parse_moves_refuses_what_the_grammar_does_not_name(text: str) -> None:
    result = parse_moves(text)
    assert isinstance(result, str) and "not a move" in result


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "the action is empty"),
        ("up, jump, left", "'jump' is not a move"),
        ("north, west", "'north', 'west' are not moves"),
        ("up, up, up, up", "4 moves given; at most 3"),
    ],
)
def test_parse_moves_reports_the_invalid_parts(text: str, reason: str) -> None:
    result = parse_moves(text)
    assert isinstance(result, str) and reason in result


def test_invalid_turn_changes_nothing_and_counts_toward_the_limit() -> None:
    env = env_with(ONE_PUSH, max_turns=3)
    before = env.room
    # The second move runs into the wall above row 2: the whole turn is void.
    result = env.step(act("up", "up", "left"))
    assert result.info.invalid and env.room == before
    assert "move 2 (up) is blocked: a wall is in the way" in result.info.invalid_reason
    assert result.info.events == [] and env.transcript == []
    result = env.step("I push the box left")
    assert result.info.invalid and "no <action>" in result.info.invalid_reason
    result = env.step(act("right", "jump"))
    assert result.info.invalid and "'jump' is not a move" in result.info.invalid_reason
    assert result.done and result.info.outcome == "unfinished" and env.room == before


def test_valid_turn_makes_its_moves_in_order_and_stops_once_solved() -> None:
    env = env_with("######\n#----#\n#.-$-#\n#---@#\n######")
    result = env.step(act("up", "up", "down"))
    assert not result.done and not result.info.invalid
    assert env.room.player == (2, 4) and env.room.boxes == {(2, 3)}
    assert env.transcript == ["You: up, up, down"]
    result = env.step(act("left", "left", "down"))  # solved after the second move
    assert result.done and result.info.outcome == "won" and result.info.action == "left, left"
    assert result.info.events == ["You: left, left (2 pushes)"]
    assert result.info.extra["moves"] == 5 and "5 moves in 2 turns" in result.info.feedback


def test_observation_numbers_rows_and_columns_and_shows_the_legend() -> None:
    obs = make_env("sokoban", "sokoban:boxes:2").reset(3)
    lines = obs.split("\n")
    assert lines[0].startswith("You are at (") and "0 of 2 boxes on targets" in lines[0]
    assert lines[2].split() == ["1", "2", "3", "4", "5", "6"]
    assert [line.split()[0] for line in lines[3:9]] == ["1", "2", "3", "4", "5", "6"]
    assert lines[3].split()[1:] == ["#"] * 6
    assert lines[9].startswith("Legend: # wall")
    assert lines[10].startswith("Moves not blocked now:")


# -- protocols and plumbing --------------------------------------------------------------


def test_replay_restarts_the_same_room_and_fresh_draws_new_ones() -> None:
    env = make_env("sokoban", "sokoban:boxes:2")
    task = 12345
    replay = [env.reset(episode_seed(task, k, "replay")) for k in range(3)]
    fresh = [env.reset(episode_seed(task, k, "fresh")) for k in range(3)]
    assert len(set(replay)) == 1
    assert len(set(fresh)) == 3
    # Deterministic from the task seed: a second environment sees the same rooms.
    other = make_env("sokoban", "sokoban:boxes:2")
    assert [other.reset(episode_seed(task, k, "fresh")) for k in range(3)] == fresh
    assert other.reset(episode_seed(task + 1, 0, "replay")) != replay[0]


def test_variants_presets_and_registration() -> None:
    assert "sokoban" in ENV_NAMES
    assert POPULATION_PRESETS["sokoban_train"].specs == ["sokoban:boxes:2"]
    assert POPULATION_PRESETS["sokoban_unseen"].specs == ["sokoban:boxes:1", "sokoban:boxes:3"]
    assert make_opponent("sokoban:boxes:1").spec == "sokoban:boxes:1"
    for n in (1, 2, 3):
        env = make_env("sokoban", f"sokoban:boxes:{n}")
        env.reset(7)
        assert len(env.room.boxes) == n
        assert env.max_turns == 7 and env.invalid_penalty == 0.5 and env.length_penalty == 1.0
    with pytest.raises(ValueError, match="sokoban:boxes:N"):
        make_opponent("sokoban:boxes:5")
    with pytest.raises(ValueError, match="single-agent"):
        make_env("sokoban", "sokoban:boxes:2", seat=1)
    with pytest.raises(ValueError, match="does not play sokoban"):
        make_env("sokoban", "kuhn:aggressive")


def test_config_checks_sokoban_settings() -> None:
    cfg = RunConfig.model_validate(
        {"env": {"name": "sokoban", "population": "sokoban_train", "seat": "first"}}
    )
    assert cfg.env.name == "sokoban"
    with pytest.raises(ValueError, match="set env.seat: first"):
        RunConfig.model_validate({"env": {"name": "sokoban", "population": "sokoban_train"}})
    with pytest.raises(ValueError, match="does not play env.name"):
        RunConfig.model_validate(
            {"env": {"name": "sokoban", "population": "kuhn_train", "seat": "first"}}
        )


def test_meta_episode_graph_plays_sokoban_with_its_own_wording() -> None:
    env = make_env("sokoban", "sokoban:boxes:1")
    task_seed = 99
    env.reset(episode_seed(task_seed, 0, "replay"))
    solution = solve(env.room)
    assert solution is not None
    wrong = act("up", "up", "up", "up")  # four moves: always invalid
    turns = [act(*solution[i : i + 3]) for i in range(0, len(solution), 3)]
    # Episode 1 wastes all 7 turns, episode 2 solves the same room (replay).
    llm = ScriptedChat(responses=[wrong] * 7 + turns, reflections=["<remark>go left</remark>"])
    graph = mage_graph(GraphOptions(num_episodes=3))
    state = asyncio.run(graph.run(env, llm, task_seed=task_seed, opponent="sokoban:boxes:1"))
    outcomes = [e["outcome"] for e in state["episodes"]]
    assert outcomes == ["unfinished", "won"]  # stop_on_success ends the meta-episode
    plays = [t for t in state["turns"] if t["kind"] == "play"]
    assert sum(t["invalid"] for t in plays) == 7
    assert plays[0]["anchor"] == plays[7]["anchor"]  # same room, same anchor key
    system = plays[7]["prompt_text"][0]["content"]
    assert "Sokoban" in system and "opponent" not in system
    reflect = next(t for t in state["turns"] if t["kind"] == "reflect")
    assert "opponent" not in reflect["prompt_text"][1]["content"]
    assert "go left" in plays[7]["prompt_text"][-1]["content"]
