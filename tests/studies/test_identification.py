"""The identification study on a tiny budget: labels, shapes and the CLI."""

from __future__ import annotations

import pytest
import torch

from mage_rl import load_config
from mage_rl.policy.models import load_model
from studies.adaptation.cli import identification_main
from studies.adaptation.identification import (
    DEFAULT_CONFIG,
    Decision,
    advantage_signal,
    bench_identification,
    choice_logits,
    collect_decisions,
    label,
)

SMALL = ["rollout.tasks=4", "rollout.group_size=2", "policy.model=tiny:hidden=32,layers=1"]


def test_labels_follow_the_best_responses() -> None:
    j_open = "Your card: J.\nBetting so far: none.\nNo bet to face."
    q_faced = "Your card: Q.\nBetting so far: you PASS, opponent BET.\nYou face a bet."
    assert label(j_open, "kuhn_poker:aggressive") == "PASS"
    assert label(j_open, "kuhn_poker:conservative") == "BET"
    assert label(q_faced, "kuhn_poker:aggressive") == "BET"
    assert label(q_faced, "kuhn_poker:intermediate") == "PASS"
    assert label("Your card: K.\nBetting so far: none.", "kuhn_poker:aggressive") is None


def test_choice_logits_sum_answer_token_logprobs() -> None:
    model, tok = load_model("tiny:hidden=32,layers=1", dtype="fp32")
    prompts = [tok("card J")["input_ids"], tok("card Q, bets: you PASS")["input_ids"]]
    answers = [tok("<action>PASS</action>")["input_ids"], tok("<action>BET</action>")["input_ids"]]
    got = choice_logits(model, prompts, answers)
    assert got.shape == (2, 2)
    with torch.no_grad():
        seq = prompts[1] + answers[1]
        logp = torch.log_softmax(model(input_ids=torch.tensor([seq])).logits[0], -1)
        n = len(prompts[1])
        want = sum(logp[n - 1 + j, t] for j, t in enumerate(answers[1]))
    assert got[1, 1].item() == pytest.approx(want.item(), abs=1e-4)


def test_bench_reports_a_curve_and_refuses_the_second_seat() -> None:
    torch.set_num_threads(1)
    lines: list[str] = []
    result = bench_identification(
        batches=2,
        epochs=1,
        batch_size=4,
        test_size=4,
        eval_every=1,
        overrides=SMALL,
        log=lines.append,
    )
    assert result["decisions"] >= 8
    assert 0.5 <= result["majority_baseline"] <= 1.0
    # Both references are expected accuracies of a best guess between two classes.
    assert 0.5 <= result["no_history_accuracy"] <= 1.0
    assert 0.5 <= result["bayes_accuracy"] <= 1.0
    signal = result["advantage_signal"]
    last = [r for r in signal if r["hand"] == 3]
    everyone = next(r for r in last if r["opponents"] == "all")
    assert everyone["n"] == result["decisions"]
    assert sum(r["n"] for r in last if r["opponents"] != "all") == result["decisions"]
    assert {r["hand"] for r in signal} <= {1, 2, 3} and 0.0 <= everyone["sampled_label"] <= 1.0
    assert result["curve"][0]["decisions_seen"] == 0
    assert all(0.0 <= p["accuracy"] <= 1.0 for p in result["curve"])
    with pytest.raises(ValueError, match="seat=first"):
        bench_identification(overrides=[*SMALL, "env.seat=second"])
    # Through the CLI, one small batch gives too few decisions for the default 400 held
    # out: a one-line error and exit status 2, no traceback.
    argv = ["--batches", "1"]
    code = identification_main(argv + [a for s in SMALL for a in ("--set", s)])
    assert code == 2


def test_posteriors_replay_what_the_agent_saw() -> None:
    torch.set_num_threads(1)
    cfg = load_config(DEFAULT_CONFIG, SMALL)
    decisions = collect_decisions(cfg, cfg.policy.model, batches=3)
    assert decisions
    for d in decisions:
        # The current hand alone: a J to open says nothing (the prior, 0.3); a bet faced
        # with Q is made by the aggressive opponent always and by the others half the
        # time (0.3 / (0.3 * 0.5 + 0.3 + 0.4 * 0.5)).
        assert d.p_current == pytest.approx(0.3) or d.p_current == pytest.approx(0.3 / 0.65)
        # The history never rules out the true opponent.
        if "aggressive" in d.opponent:
            assert d.p_history > 0.0
        else:
            assert d.p_history < 1.0
    # The advantages are the trainer's: the same records through compute_advantages.
    assert any(d.advantage != 0.0 for d in decisions)
    assert {d.action for d in decisions} <= {0, 1}


def test_advantage_signal_signs_towards_the_label() -> None:
    def decision(opponent: str, label: int, action: int, advantage: float) -> Decision:
        return Decision([1], label, opponent, 0.5, 0.5, action, advantage)

    # Against the aggressive opponent RL pushes towards the label (the label sampled and
    # rewarded, or the other answer sampled and punished); against the others, away.
    decisions = [
        decision("aggressive", 0, 0, 2.0),
        decision("aggressive", 0, 1, -4.0),
        decision("conservative", 1, 1, -1.0),
        decision("intermediate", 1, 0, 1.0),
    ]
    rows = {r["opponents"]: r for r in advantage_signal(decisions)}
    assert rows["aggressive"]["mean"] == pytest.approx(3.0)
    assert rows["aggressive"]["std"] == pytest.approx(1.0)
    assert rows["aggressive"]["snr"] == pytest.approx(3.0)
    assert rows["aggressive"]["sampled_label"] == 0.5 and rows["aggressive"]["hand"] == 1
    assert rows["others"]["mean"] == pytest.approx(-1.0) and rows["others"]["snr"] == 0.0
    assert rows["all"]["n"] == 4 and rows["all"]["mean"] == pytest.approx(1.0)
