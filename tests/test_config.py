"""Config files a user can get wrong: each error names the file, the key and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from mage_rl.config import RunConfig, TrainConfig, load_config


def _file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "exp.yaml"
    path.write_text(text)
    return path


def test_an_empty_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"exp\.yaml is empty.*policy: \{model: tiny\}"):
        load_config(_file(tmp_path, "\n# nothing yet\n"), cls=TrainConfig)


@pytest.mark.parametrize("text", ["env:\n  name: kuhn_poker\n", "policy:\n  dtype: fp32\n"])
def test_a_file_must_name_its_model(tmp_path: Path, text: str) -> None:
    with pytest.raises(ValueError, match="does not name its model.*policy.model"):
        load_config(_file(tmp_path, text), cls=TrainConfig)


def test_the_model_may_come_from_an_override(tmp_path: Path) -> None:
    cfg = load_config(_file(tmp_path, "env:\n  name: kuhn_poker\n"), ["policy.model=tiny"])
    assert cfg.policy.model == "tiny"


def test_without_a_file_the_defaults_stand() -> None:
    assert isinstance(load_config(None, cls=RunConfig), RunConfig)


def test_unknown_keys_list_the_valid_keys_of_their_section(tmp_path: Path) -> None:
    path = _file(tmp_path, "policy:\n  model: tiny\n  modle: x\nlearner:\n  lrr: 1\n")
    with pytest.raises(ValueError) as info:
        load_config(path, cls=TrainConfig)
    message = str(info.value)
    assert "policy.modle: unknown key; did you mean 'model'?" in message
    assert "Valid keys of policy: model, dtype, temperature" in message
    # learner is a dataclass section; its keys are listed the same way.
    assert "learner.lrr: unknown key; did you mean 'lr'?" in message
    assert "Valid keys of learner: lr, lr_warmup_steps, weight_decay" in message


def test_an_unknown_section_lists_the_sections(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="Valid keys of the top level: plugins, env, meta, policy"):
        load_config(_file(tmp_path, "policy:\n  model: tiny\npolicies: {}\n"), cls=TrainConfig)


def test_a_training_config_loaded_as_a_rollout_config_says_how_to_load_it(tmp_path: Path) -> None:
    path = _file(tmp_path, "policy:\n  model: tiny\nlearner:\n  lr: 1.0e-5\ntrain: {}\n")
    with pytest.raises(ValueError) as info:
        load_config(path, cls=RunConfig)  # the play sections alone
    assert "(learner, train: sections of a training config; load it with " in str(info.value)
    assert load_config(path).learner.lr == 1.0e-5  # the one schema, by default


def test_a_yaml_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    path = _file(tmp_path, "policy:\n  model: tiny\n  dtype: [fp32\nenv:\n  name: x: y\n")
    with pytest.raises(ValueError) as info:
        load_config(path, cls=TrainConfig)
    message = str(info.value)
    assert message.startswith(f"{path}:") and "not valid YAML" in message
    assert "<unicode string>" not in message and "line 3" in message


def test_duplicate_keys_are_an_error(tmp_path: Path) -> None:
    path = _file(tmp_path, "policy:\n  model: tiny\n  dtype: fp32\n  model: smollm2\n")
    with pytest.raises(ValueError, match=r"exp\.yaml:4:3: .*'model' appears twice.*2 and 4"):
        load_config(path, cls=TrainConfig)


def test_duplicate_sections_are_an_error(tmp_path: Path) -> None:
    path = _file(tmp_path, "policy:\n  model: tiny\nenv: {}\npolicy:\n  model: tiny\n")
    with pytest.raises(ValueError, match="'policy' appears twice"):
        load_config(path, cls=TrainConfig)


def test_a_mistyped_preset_names_the_key_and_the_presets(tmp_path: Path) -> None:
    path = _file(tmp_path, "policy:\n  model: tiny\nenv:\n  population: kuhn_trian\n")
    with pytest.raises(ValueError) as info:
        load_config(path, cls=TrainConfig)
    message = str(info.value)
    assert "env.population='kuhn_trian'" in message
    assert "kuhn_train, kuhn_unseen" in message and "ttt_train" in message


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nope.yaml does not exist"):
        load_config(tmp_path / "nope.yaml")


def test_a_top_level_list_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="top level must be a mapping"):
        load_config(_file(tmp_path, "- policy\n"))


def test_the_conversation_layout_refuses_episodes_without_memory() -> None:
    base = ["policy.model=tiny", "meta.layout=conversation", "meta.context=none"]
    with pytest.raises(ValueError, match="meta.layout: rerendered"):
        load_config(None, base, TrainConfig)
    assert load_config(None, [*base, "meta.layout=rerendered"], TrainConfig).meta.context == "none"


def test_error_text_reaches_the_terminal_as_written(tmp_path: Path, capsys) -> None:
    """User text is not read as console markup ([...]) or emoji codes (:name:)."""
    from mage_rl.cli import main

    path = tmp_path / "x.yaml"
    path.write_text("policy: {model: tiny}\n")
    assert main(["train", str(path), "--set", "meta.agent='[str, Any]'"]) == 2
    assert main(["train", str(path), "--set", "env.population=treasure:door:1"]) == 2
    out = capsys.readouterr().out
    assert "error:" in out and "'[str, Any]'" in out and "treasure:door:1" in out


# -- strict types, and where each error came from ------------------------------------------


@pytest.mark.parametrize(
    ("override", "words"),
    [
        ("rollout.tasks=true", "rollout.tasks: Input should be a valid integer, got true"),
        ("rollout.tasks=2.0", "rollout.tasks: Input should be a valid integer, got 2.0"),
        ("rollout.tasks='4'", 'rollout.tasks: Input should be a valid integer, got "4"'),
        ("meta.stop_on_success=1", "meta.stop_on_success: Input should be a valid boolean"),
        ("policy.temperature=true", "policy.temperature: Input should be a valid number"),
        ("learner.lr=true", "learner.lr: Input should be a valid number, got true"),
        ("learner.ppo_epochs=1.5", "learner.ppo_epochs: Input should be a valid integer"),
        ("returns.reward_to_go=1", "returns.reward_to_go: Input should be a valid boolean"),
        ("advantages.omega=false", "advantages.omega: Input should be a valid number"),
        ("eval.before=0", "eval.before: Input should be a valid boolean"),
        ("openrlhf.zero_stage=true", "openrlhf.zero_stage: Input should be a valid integer"),
    ],
)
def test_numbers_and_booleans_are_read_strictly(override: str, words: str) -> None:
    with pytest.raises(ValueError) as info:
        load_config(None, ["policy.model=tiny", override])
    assert words in str(info.value)
    assert f"(from --set {override})" in str(info.value)


def test_integers_are_floats_and_yaml_1_2_floats_read_as_floats(tmp_path: Path) -> None:
    path = _file(
        tmp_path,
        "policy:\n  model: tiny\n  temperature: 1\nlearner:\n  lr: 1e-4\n  temperature: 1\n"
        "  betas: [0.9, 0.99]\n",
    )
    cfg = load_config(path, ["learner.kl_coef=2E-3", "learner.entropy_coef=0"])
    assert cfg.learner.lr == 1e-4 and cfg.learner.kl_coef == 2e-3
    assert cfg.policy.temperature == 1.0 and cfg.learner.betas == (0.9, 0.99)
    assert cfg.learner.entropy_coef == 0.0


def test_errors_name_the_file_and_line_of_their_key(tmp_path: Path) -> None:
    path = _file(tmp_path, "policy:\n  model: tiny\nrollout:\n  group_size: 2\n  tasks: true\n")
    with pytest.raises(ValueError) as info:
        load_config(path)
    assert f"{path}:5: rollout.tasks: Input should be a valid integer, got true" in str(info.value)


def test_an_override_is_blamed_not_the_file(tmp_path: Path) -> None:
    path = _file(tmp_path, "policy:\n  model: tiny\nrollout:\n  tasks: 2\n")
    with pytest.raises(ValueError) as info:
        load_config(path, ["rollout.tasks=true"])
    message = str(info.value)
    assert message.startswith("invalid config:\n") and str(path) not in message
    assert "rollout.tasks: Input should be a valid integer, got true (from --set " in message


def test_a_rule_across_keys_names_where_each_came_from(tmp_path: Path) -> None:
    path = _file(tmp_path, "policy:\n  model: tiny\n  explore: 0.2\n")
    with pytest.raises(ValueError) as info:
        load_config(path)
    assert f"{path}:3: policy.explore=0.2 mixes uniform choices" in str(info.value)
    with pytest.raises(ValueError) as info:
        load_config(path, ["policy.top_p=0.5", "policy.explore=0.0"])
    message = str(info.value)
    assert "policy.top_p=0.5, policy.top_k=0: the learner cannot reproduce" in message
    assert "(from --set policy.top_p=0.5)" in message


@pytest.mark.parametrize(
    ("population", "weight"),
    [
        ("kuhn:aggressive=nan", "weight nan"),
        ("kuhn:aggressive=inf,kuhn:conservative=1", "weight inf"),
        ("kuhn:aggressive=-1", "weight -1"),
        ("kuhn:aggressive=0,kuhn:conservative=1", "weight 0"),
        ("kuhn:aggressive=lots", "weight 'lots', not a number"),
    ],
)
def test_population_weights_are_finite_and_positive(
    tmp_path: Path, population: str, weight: str
) -> None:
    path = _file(tmp_path, f"policy:\n  model: tiny\nenv:\n  population: '{population}'\n")
    with pytest.raises(ValueError) as info:
        load_config(path)
    message = str(info.value)
    assert f"{path}:4: env.population='{population}': opponent 'kuhn:aggressive' has" in message
    assert weight in message and "weights must be finite numbers above 0" in message


def test_a_missing_model_path_names_policy_model(tmp_path: Path) -> None:
    path = _file(tmp_path, "env:\n  name: kuhn_poker\npolicy:\n  model: ./no/such/model\n")
    with pytest.raises(ValueError) as info:
        load_config(path)
    assert f"{path}:4: policy.model='./no/such/model': no such file or directory" in str(info.value)
    with pytest.raises(ValueError) as info:
        load_config(path, ["policy.model=tiny:size=3"])
    assert "policy.model='tiny:size=3': bad tiny model option" in str(info.value)
    assert "(from --set policy.model=tiny:size=3)" in str(info.value)


def test_an_unknown_key_without_a_close_match_still_reads_well(tmp_path: Path) -> None:
    path = _file(tmp_path, "policy:\n  model: tiny\n  zzz: 1\n")
    with pytest.raises(ValueError) as info:
        load_config(path)
    assert f"{path}:3: policy.zzz: unknown key. Valid keys of policy: model, dtype" in str(
        info.value
    )
