"""mage bench learning: the probe suite runs, and its figures are read off real records."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mage_rl.bench.learning import (
    PROBES,
    bench_learning,
    format_learning,
    probe_config,
    read_records,
    rps_figures,
)

BASE = """
meta: {context: history, layout: conversation, prompt: compact, stop_on_success: false}
policy: {model: tiny, dtype: fp32, max_tokens: 12, constrain_actions: true, explore: 0.1}
rollout: {tasks: 3, group_size: 2}
returns: {reward_to_go: true}
learner: {dtype: fp32}
env: {name: kuhn_poker}
train: {iterations: 50}
"""


def test_probe_config_keeps_the_learner_and_sets_the_game() -> None:
    base = {"policy": {"model": "tiny"}, "learner": {"lr": 0.1}, "env": {"name": "x"},
            "train": {"iterations": 99}, "meta": {"layout": "conversation", "episodes": 7}}  # fmt: skip
    cfg = probe_config(PROBES["rps"], base, seed=3, iterations=2)
    assert cfg["env"]["name"] == "rock_paper_scissors" and cfg["meta"]["episodes"] == 3
    assert cfg["meta"]["layout"] == "conversation" and cfg["learner"] == {"lr": 0.1, "seed": 3}
    assert cfg["rollout"]["seed"] == 3 and cfg["train"] == {"iterations": 2}
    assert cfg["eval"]["before"] is True


def _record(moves: list[tuple[str, str]]) -> dict:
    beats = {"ROCK": "PAPER", "PAPER": "SCISSORS", "SCISSORS": "ROCK"}
    episodes, turns = [], []
    for k, (mine, theirs) in enumerate(moves):
        outcome = "draw" if mine == theirs else ("won" if beats[theirs] == mine else "lost")
        episodes.append({"index": k, "outcome": outcome})
        turns.append({"kind": "play", "episode": k, "text": f"<action>{mine}</action>"})
    return {"episodes": episodes, "turns": turns}


def test_rps_figures_count_wins_and_reading() -> None:
    records = [
        _record([("ROCK", "SCISSORS"), ("ROCK", "SCISSORS"), ("ROCK", "SCISSORS")]),
        _record([("ROCK", "PAPER"), ("SCISSORS", "PAPER"), ("PAPER", "PAPER")]),
    ]
    figures = rps_figures(records, 3)
    assert [w["mean"] for w in figures["win_by_round"]] == [0.5, 1.0, 0.5]
    # Rounds 2-3 answering the move that beats what the opponent showed: 3 of 4.
    assert figures["beats_last_shown"]["mean"] == 0.75 and figures["beats_last_shown"]["n"] == 4


def test_the_suite_trains_each_probe_and_writes_its_tables(tmp_path: Path) -> None:
    config = tmp_path / "base.yaml"
    config.write_text(BASE)
    out = tmp_path / "out"
    doc = bench_learning(
        config=config, probes=["rps", "kuhn_card"], seeds=[0], out=out,
        iterations={"rps": 1, "kuhn_card": 2}, log=lambda _m: None,
    )  # fmt: skip
    saved = json.loads((out / "learning.json").read_text())
    assert saved["provenance"]["commit"] and [r["probe"] for r in saved["results"]] == [
        "rps",
        "kuhn_card",
    ]
    rps, card = doc["results"]
    assert rps["oracle"]["first"]["bayes_last_hand"] == 1.0
    assert len(rps["trained"]["win_by_round"]) == 3 and rps["iterations"] == 1
    assert card["iterations"] == 2
    assert set(rps["verdicts"]) == {"last_vs_first", "last_vs_best_fixed", "last_vs_untrained"}
    assert card["oracle"]["first"]["best_fixed"] == pytest.approx(1 / 3)
    shares = card["untrained"]["bet_share"]["no bet to face"]
    assert set(shares) == {"J", "Q", "K"} and all(0 <= s["mean"] <= 1 for s in shares.values())
    text = (out / "learning.md").read_text()
    assert "### rps" in text and "### kuhn_card" in text and "| | Bayes play |" in text
    assert format_learning(saved).splitlines()[0] == text.splitlines()[0]
    with pytest.raises(ValueError, match="unknown probe"):
        bench_learning(config=config, probes=["chess"], seeds=[0], iterations=1, out=out)
    with pytest.raises(ValueError, match="unknown probe"):
        bench_learning(config=config, probes=["rps"], seeds=[0], iterations={"chess": 1}, out=out)


def test_the_showdown_probe_trains_and_counts_calls(tmp_path: Path) -> None:
    config = tmp_path / "base.yaml"
    config.write_text(BASE)
    out = tmp_path / "out"
    doc = bench_learning(
        config=config, probes=["showdown"], seeds=[0], out=out, iterations=1,
        overrides=["eval.tasks=8"], log=lambda _m: None,
    )  # fmt: skip
    (result,) = doc["results"]
    assert result["oracle"]["second"]["bayes_last_hand"] == pytest.approx(0.5)
    assert result["oracle"]["second"]["best_fixed"] == pytest.approx(0.0)
    records = read_records(sorted((out / "showdown_seed0" / "eval").glob("iter_*.jsonl"))[-1])
    calls = sum(r["episodes"][0]["outcome"] in ("won", "lost") for r in records)
    trained = result["trained"]
    assert trained["first_call_share"]["mean"] == pytest.approx(calls / len(records))
    after = trained["last_call_share_by_situation"]
    assert set(after) <= {"weak shown", "strong shown", "nothing shown"}
    assert sum(s["n"] for s in after.values()) == len(records)
    text = (out / "learning.md").read_text()
    assert "### showdown" in text and "| | exact: call first, then only a weak hand |" in text


def test_iterations_by_probe_are_parsed() -> None:
    from mage_rl.bench.learning_cli import parse_iterations

    assert parse_iterations(None) is None and parse_iterations("30") == 30
    assert parse_iterations("rps=30, kuhn_k3=5") == {"rps": 30, "kuhn_k3": 5}
    for bad in ("0", "rps", "rps=x", "rps=-1"):
        with pytest.raises(SystemExit, match="--iterations"):
            parse_iterations(bad)


def test_a_checkpoint_plays_other_opponents_as_its_config_trains(tmp_path: Path) -> None:
    from mage_rl.bench.learning_checks import evaluate_checkpoint, format_transfer
    from mage_rl.cli import main

    config = tmp_path / "rps.yaml"
    config.write_text(
        BASE.replace("env: {name: kuhn_poker}", "env: {name: rps, population: rps_train, seat: first}")
        .replace("train: {iterations: 50}", "train: {iterations: 1}\neval: {tasks: 6, before: false}")
    )  # fmt: skip
    run = tmp_path / "run"
    assert main(["train", str(config), "--run-dir", str(run), "--no-progress"]) == 0
    checkpoint = run / "checkpoints" / "iter_000001" / "model"
    doc = evaluate_checkpoint(config, checkpoint, "rps_unseen", out=tmp_path / "transfer")
    records = (tmp_path / "transfer" / "eval" / "iter_000000.jsonl").read_text().splitlines()
    opponents = {json.loads(line)["opponent"].split(":")[1] for line in records}
    assert opponents <= {"mostly_rock", "mostly_paper", "mostly_scissors"} and doc["n"] == 6
    # Played in the training format: one conversation per meta-episode, constrained answers.
    first = json.loads(records[0])
    assert first["conversation"] and all(
        t["text"].startswith("<action>") for t in first["turns"] if t["kind"] == "play"
    )
    assert len(doc["ev_by_episode"]) == 3 and doc["oracle"]["bayes_last"] == pytest.approx(0.192)
    assert "last episode above the first" in format_transfer(doc)
    # The paired difference is the mean of each meta-episode's last payoff minus its first.
    gains = [
        (r := json.loads(line))["episodes"][-1]["payoff"] - r["episodes"][0]["payoff"]
        for line in records
    ]  # fmt: skip
    assert doc["last_minus_first"]["mean"] == pytest.approx(sum(gains) / len(gains))
    assert doc["last_minus_first"]["n"] == 6
    assert doc["last_better_than_first"] == (doc["last_minus_first"]["low"] > 0)
    assert doc["beats_last_shown"]["n"] == 12  # rounds 2 and 3 of 6 meta-episodes
    # By family: rps_unseen is the biased family alone, so its figures are the whole's.
    (family,) = doc["families"].items()
    assert family[0] == "biased" and family[1]["n"] == 6
    assert family[1]["last_minus_first"]["mean"] == pytest.approx(doc["last_minus_first"]["mean"])
    assert family[1]["bayes_last_family"] == pytest.approx(0.192)
    assert family[1]["bayes_last_population"] == pytest.approx(0.192)
    assert family[1]["rule_last"] == pytest.approx(0.16)  # (0.6 - 0.2) squared
    by_opponent = family[1]["last_by_opponent"]
    assert sum(e["n"] for e in by_opponent.values()) == 6
    assert sum(e["mean"] * e["n"] for e in by_opponent.values()) / 6 == pytest.approx(
        family[1]["last"]["mean"]
    )
    assert "| biased | trained | 6 |" in format_transfer(doc)
    assert "The last round by opponent, trained: mostly_" in format_transfer(doc)
    saved = json.loads((tmp_path / "transfer" / "transfer.json").read_text())
    assert saved["provenance"]["command"] and saved["checkpoint"] == str(checkpoint)


@pytest.mark.parametrize("probe", ["rps", "kuhn_card"])
def test_the_diagnosis_splits_one_update_per_term(tmp_path: Path, probe: str) -> None:
    from mage_rl.bench.learning_checks import (
        diagnose_cards,
        diagnose_update,
        format_card_diagnosis,
        format_diagnosis,
    )

    config = tmp_path / "base.yaml"
    config.write_text(BASE)
    diagnose = diagnose_cards if probe == "kuhn_card" else diagnose_update
    doc = diagnose(config, out=tmp_path / "out", overrides=["learner.lr=1e-3"])
    saved = json.loads((tmp_path / "out" / "diagnosis.json").read_text())
    assert saved["provenance"]["commit"] and saved["probe"] == probe
    assert [r["term"] for r in doc["terms"]] == [
        "A_E (episode level)", "A_S (step level)", "A = A_E + 1 A_S"
    ]  # fmt: skip
    if probe == "rps":
        assert "| A = A_E + 1 A_S |" in format_diagnosis(doc)
        return
    # Single hands in the first seat: the opening decision with every card dealt.
    assert set(doc["turns"]["no bet to face"]) <= {"J", "Q", "K"}
    whole = doc["terms"][2]["no bet to face"]
    # The card-free shift is the mean of the cards' changes, and the update moved them.
    assert whole["card_free_shift"] == pytest.approx(
        sum(whole["by_card"].values()) / len(whole["by_card"])
    )
    assert any(abs(v) > 1e-6 for v in whole["by_card"].values())
    for pairs in doc["gradient_cosine"].values():
        assert all(-1 <= v <= 1 for v in pairs.values())
    assert "card-free shift" in format_card_diagnosis(doc)
