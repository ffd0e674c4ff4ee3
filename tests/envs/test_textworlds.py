"""ScienceWorld and TextWorld-Express: registration, variant specs, the simulator pool
and the errors for a missing extra or Java (no simulator is started here)."""

from __future__ import annotations

import sys

import pytest

from mage_rl.config import RunConfig
from mage_rl.envs import (
    POPULATION_PRESETS,
    SINGLE_AGENT_ENVS,
    env_spec,
    make_env,
    make_opponent,
    sciworld,
    textworlds,
    twx,
)
from mage_rl.envs.textworlds import (
    MissingDependencyError,
    SimulatorPool,
    TaskVariant,
    import_simulator,
    normalize_action,
)
from mage_rl.eval.conditions import opponent_population


@pytest.mark.parametrize(
    ("name", "alias"), [("scienceworld", "sciworld"), ("textworld_express", "twx")]
)
def test_registered_as_single_agent_tasks_with_their_constants(name: str, alias: str) -> None:
    spec = env_spec(alias)
    assert spec.name == name and name in SINGLE_AGENT_ENVS
    assert (spec.invalid_penalty, spec.length_penalty, spec.gamma_traj) == (0.5, 1.0, 0.9)


def test_variant_specs_parse_and_canonicalise() -> None:
    v = make_opponent("twx:coin:test:small")
    assert isinstance(v, TaskVariant)
    assert (v.env, v.task, v.split, v.option) == ("textworld_express", "coin", "test", "small")
    assert v.spec == "textworld_express:coin:test:small"
    v = make_opponent("sciworld:find-plant:dev")
    assert v.spec == "scienceworld:find-plant:dev" and v.option == ""
    assert make_opponent("scienceworld:boil:train:easy").option == "easy"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("twx:coin", r"textworld_express:coin:\{train\|dev\|test\}\[:small\]"),
        ("twx:coin:valid", "write textworld_express:coin"),
        ("twx:coin:train:easy", "write textworld_express:coin"),  # easy is ScienceWorld's
        ("scienceworld:boil:train:small", r"\[:easy\]"),
        ("scienceworld:boil:train:easy:x", "write scienceworld:boil"),
        ("scienceworld:cook-dinner:train", "valid for scienceworld: .*find-plant"),
        ("twx:zork:train", "valid for textworld_express: .*coin"),
    ],
)
def test_bad_variant_specs_say_how_to_write_them(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_opponent(spec)


def test_variation_choice_is_deterministic_and_spread() -> None:
    v = TaskVariant("textworld_express", "coin", "train")
    choices = list(range(1000))
    picks = [v.pick(choices, seed) for seed in range(200)]
    assert picks == [v.pick(choices, seed) for seed in range(200)]
    assert len(set(picks)) > 150  # seeds spread over the split
    other = TaskVariant("textworld_express", "twc", "train")
    assert [other.pick(choices, s) for s in range(20)] != picks[:20]


def test_presets_train_on_train_variations_and_hold_out_test_ones() -> None:
    train = POPULATION_PRESETS["twx_train"].specs
    unseen = POPULATION_PRESETS["twx_unseen"].specs
    assert train == [f"textworld_express:{g}:train:small" for g in twx.PRESET_GAMES]
    assert unseen == [s.replace(":train:", ":test:") for s in train]
    sw_train = POPULATION_PRESETS["scienceworld_train"].specs
    assert sw_train == [f"scienceworld:{t}:train" for t in sciworld.FIND_TASKS]
    assert POPULATION_PRESETS["scienceworld_unseen"].specs == [
        s.replace(":train", ":test") for s in sw_train
    ]
    # `mage eval --opponents train|unseen` finds them under the environments' names.
    assert opponent_population("unseen", "textworld_express").specs == unseen
    assert opponent_population("train", "scienceworld").specs == sw_train


def test_configs_check_variants_and_the_seat() -> None:
    cfg = RunConfig.model_validate(
        {"env": {"name": "twx", "population": "coin:train:small", "seat": "first"}}
    )
    assert cfg.env.name == "textworld_express"
    with pytest.raises(ValueError, match="set env.seat: first"):
        RunConfig.model_validate({"env": {"name": "sciworld", "population": "scienceworld_train"}})
    with pytest.raises(ValueError, match="does not play env.name"):
        RunConfig.model_validate(
            {"env": {"name": "scienceworld", "population": "twx_train", "seat": "first"}}
        )


def test_make_env_needs_no_simulator_and_refuses_a_second_seat() -> None:
    before = (sciworld.POOL.size, twx.POOL.size)
    env = make_env("twx", "twx:coin:train:small", max_turns=4)
    assert env.max_turns == 4 and env.done and env.legal_actions() == []
    assert (sciworld.POOL.size, twx.POOL.size) == before  # simulators start at reset
    with pytest.raises(ValueError, match="only seat is 0"):
        make_env("sciworld", "sciworld:boil:train", seat=1)
    with pytest.raises(ValueError, match="does not play scienceworld"):
        make_env("sciworld", "twx:coin:train")


def test_the_task_and_game_lists_match_the_packages() -> None:
    tw = pytest.importorskip("textworld_express")
    assert tuple(tw.GAME_NAMES) == twx.GAMES
    assert set(twx.SMALL_PARAMS) == set(twx.GAMES)
    sw = pytest.importorskip("scienceworld.constants")
    assert sorted(sciworld.TASKS) == sorted(
        n.replace("mendellian", "mendelian") for n in _sw_names(sw)
    )


def _sw_names(constants) -> list[str]:
    from scienceworld.utils import infer_task

    return [infer_task(n) for n in constants.ID2TASK.values()]


def test_actions_are_normalised_before_matching() -> None:
    assert normalize_action("  Move   WEST. ") == "move west"
    assert normalize_action('"take coin"') == "take coin"
    assert normalize_action("...") == ""


# -- missing pieces -----------------------------------------------------------------------


def test_a_missing_package_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "scienceworld", None)  # import now fails
    with pytest.raises(MissingDependencyError, match=r"pip install 'mage-rl\[textworlds\]'"):
        import_simulator("scienceworld", "ScienceWorld")
    # The same error reaches the user from the first reset, through a fresh pool.
    monkeypatch.setattr(
        sciworld.ScienceWorldEnv, "pool", SimulatorPool(sciworld._start, "ScienceWorld")
    )
    env = make_env("scienceworld", "scienceworld:find-plant:train")
    with pytest.raises(MissingDependencyError, match=r"mage-rl\[textworlds\]"):
        env.reset(0)


def test_a_missing_java_names_the_runtime(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("textworld_express")
    monkeypatch.setattr(textworlds.shutil, "which", lambda name: None)
    monkeypatch.setattr(twx.TextWorldExpressEnv, "pool", SimulatorPool(twx._start, "TWX"))
    env = make_env("twx", "twx:coin:train")
    with pytest.raises(MissingDependencyError, match="Java runtime.*default-jre-headless"):
        env.reset(0)


def test_a_simulator_that_fails_to_start_says_so() -> None:
    def broken() -> object:
        raise OSError("java: bad class file")

    with pytest.raises(RuntimeError, match="could not start the X simulator.*bad class file"):
        SimulatorPool(broken, "X").acquire()


def test_the_pool_reuses_simulators_and_prefers_the_last_one() -> None:
    started: list[object] = []

    def start() -> object:
        started.append(object())
        return started[-1]

    pool = SimulatorPool(start, "fake")
    a, b = pool.acquire(), pool.acquire()
    assert pool.size == 2 and a is not b
    pool.release(a)
    pool.release(b)
    pool.release(b)  # twice: still one free entry
    assert pool.acquire(prefer=a) is a
    assert pool.acquire() is b
    assert pool.size == 2
    c = pool.acquire()
    assert pool.size == 3 and c.handle is started[-1]
