"""The expected update at the branch points of constrained answers (choice_update: expected)."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest
import torch

from mage_rl.policy.constrained import allowed_next, choice_token_ids
from mage_rl.policy.tiny import build_tiny
from mage_rl.records import MetaEpisodeRecord, Turn
from mage_rl.rl.advantages import AdvantageConfig
from mage_rl.rl.batching import Sample, collate, samples_from_records
from mage_rl.rl.branch_values import BranchValues, branch_points
from mage_rl.rl.learner import Learner, LearnerConfig
from mage_rl.rl.loss import expected_branch_loss, policy_loss

CHOICES = ("<action>PASS</action>", "<action>BET</action>")
CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def test_expected_loss_is_zero_and_has_the_all_action_gradient() -> None:
    torch.manual_seed(0)
    logits = torch.randn(1, 2, 6, requires_grad=True)
    index = torch.tensor([[[1, 4, -1], [2, 3, 5]]])
    adv = torch.tensor([[[2.0, -1.0, math.nan], [0.5, math.nan, -0.5]]])
    loss, active = expected_branch_loss(logits, index, adv)
    assert active.tolist() == [[True, True]]
    assert loss.abs().max().item() < 1e-6  # centred by the policy's own mean
    loss.sum().backward()
    got = logits.grad.clone()

    # Reference: -sum_a grad pi(a) A(a), the missing token taking the pi-weighted mean.
    ref_logits = logits.detach().clone().requires_grad_(True)
    p0 = torch.softmax(ref_logits[0, 0, [1, 4]], dim=-1)
    p1 = torch.softmax(ref_logits[0, 1, [2, 3, 5]], dim=-1)
    known = p1.detach()[[0, 2]]
    value = (known * torch.tensor([0.5, -0.5])).sum() / known.sum()
    ref = (
        -(p0 * torch.tensor([2.0, -1.0])).sum()
        - (p1 * torch.stack([torch.tensor(0.5), value, torch.tensor(-0.5)])).sum()
    )
    ref.backward()
    assert torch.allclose(got, ref_logits.grad, atol=1e-6)
    assert got[0, 0, 1] < 0 < got[0, 0, 4]  # descending raises the better token


def test_natural_update_moves_the_logits_by_the_centred_advantages() -> None:
    logits = torch.tensor([[[0.0, 9.0, -9.0, 0.0]]], requires_grad=True)  # saturated
    index = torch.tensor([[[1, 2, 3]]])
    adv = torch.tensor([[[-1.0, 5.0, math.nan]]])
    loss, active = expected_branch_loss(logits, index, adv, mode="natural")
    assert active.tolist() == [[True]]
    loss.sum().backward()
    probs = torch.softmax(logits.detach()[0, 0, 1:], dim=-1)
    value = (probs[0] * -1.0 + probs[1] * 5.0) / (probs[0] + probs[1])
    filled = torch.tensor([-1.0, 5.0, float(value)])
    # d loss / d z_a = -(A(a) - mean A): the push does not shrink with pi.
    assert torch.allclose(logits.grad[0, 0, 1:], -(filled - filled.mean()), atol=1e-5)
    assert logits.grad[0, 0, 0] == 0
    plain, _ = expected_branch_loss(logits.detach().requires_grad_(True), index, adv)
    assert abs(float(plain.sum())) < 1e-6


def test_greedy_update_pulls_toward_the_best_estimate_until_it_is_taken() -> None:
    index = torch.tensor([[[1, 2, 3], [1, 2, 3]]])
    adv = torch.tensor([[[-1.0, 5.0, math.nan], [0.0, 0.0, math.nan]]])
    wrong = torch.tensor([[[0.0, 9.0, -9.0, 0.0], [0.0, 0.0, 0.0, 0.0]]], requires_grad=True)
    loss, active = expected_branch_loss(wrong, index, adv, mode="greedy")
    loss.sum().backward()
    # -6 * log pi(token 2): the gradient on z_2 is -6 * (1 - pi(2)), about -6 here.
    assert wrong.grad[0, 0, 2].item() == pytest.approx(-6.0, abs=1e-3)
    assert wrong.grad[0, 1].abs().max() == 0  # equal estimates: no gap, no push
    right = torch.tensor([[[0.0, -9.0, 9.0, -9.0], [0.0, 0.0, 0.0, 0.0]]], requires_grad=True)
    expected_branch_loss(right, index, adv, mode="greedy")[0].sum().backward()
    assert right.grad.abs().max() < 1e-3


def test_positions_with_one_estimate_keep_the_sampled_term() -> None:
    logits = torch.zeros(1, 3, 5)
    index = torch.tensor([[[1, 2], [3, -1], [1, 2]]])
    adv = torch.tensor([[[1.0, math.nan], [math.nan, math.nan], [1.0, -1.0]]])
    branch_loss, active = expected_branch_loss(logits, index, adv)
    assert active.tolist() == [[False, False, True]]
    logp = torch.full((1, 3), -math.log(2.0))
    mask = torch.ones(1, 3)
    _, stats = policy_loss(logp, logp, torch.ones(1, 3), mask, branch=(branch_loss, active))
    assert stats["branch_frac"].item() == pytest.approx(1 / 3)


def _turn(tokenizer, pick: int, anchor: str, opponent: str = "kuhn:a") -> Turn:
    candidates = choice_token_ids(tokenizer, CHOICES)
    ids = candidates[pick]
    allowed = [allowed_next(candidates, ids[:j]) for j in range(len(ids))]
    return Turn(kind="play", episode=0, step=0, prompt_ids=[1, 2, 3], response_ids=ids,
                logprobs=[-0.5] * len(ids), anchor=anchor, opponent=opponent,
                allowed=allowed)  # fmt: skip


def _record(turns: list[Turn], uid: str = "u") -> MetaEpisodeRecord:
    return MetaEpisodeRecord(uid=uid, rollout=0, env="kuhn_poker", seed=0,
                             opponent=turns[0].opponent, seat=0, turns=turns)  # fmt: skip


@pytest.fixture(scope="module")
def tiny_pair():
    return build_tiny(seed=0)


def test_table_means_keys_and_memory(tiny_pair) -> None:
    _, tok = tiny_pair
    cfg = AdvantageConfig(choice_update="expected", branch_memory=0.1)
    values = BranchValues(cfg)
    turns = [_turn(tok, 0, "J"), _turn(tok, 0, "J"), _turn(tok, 1, "J"), _turn(tok, 1, "K")]
    branch = branch_points(turns[0].allowed)
    assert len(branch) == 1  # PASS and BET part at one token
    j = branch[0]
    records = [_record([t], uid=f"u{i}") for i, t in enumerate(turns)]
    values.observe(records, [[1.0], [3.0], [-4.0], [5.0]])
    rows = values.annotate(records)
    pass_id, bet_id = turns[0].response_ids[j], turns[2].response_ids[j]
    order = turns[0].allowed[j]
    expect = {pass_id: 2.0, bet_id: -4.0}
    assert rows[0][0][j] == [expect[t] for t in order]  # both tokens seen at J
    assert rows[3][0][j] == []  # only BET seen at K: the sampled term stays
    assert all(r == [] for i, r in enumerate(rows[0][0]) if i != j)

    # Another opponent is another state under stationary grouping; mixed pools them.
    other = [_record([_turn(tok, 0, "K", opponent="kuhn:b")])]
    assert values.annotate(other)[0][0][j] == []
    mixed = BranchValues(AdvantageConfig(choice_update="expected", grouping="mixed"))
    mixed.observe([*records, *other], [[1.0], [3.0], [-4.0], [5.0], [7.0]])
    assert mixed.annotate(other)[0][0][j] == [{pass_id: 7.0, bet_id: 5.0}[t] for t in order]

    # Memory 0.1: one more batch with a PASS at J; its earlier PASS turns count a tenth.
    anchor_j = values._anchors(records[0])[0]
    values.observe([records[0]], [[4.0]])
    assert values.estimate(anchor_j, turns[0].response_ids[:j], pass_id) == pytest.approx(
        (0.1 * 4.0 + 4.0) / (0.1 * 2 + 1)
    )
    # BET at J was not taken in that batch: it keeps its estimate, undecayed.
    assert values.estimate(anchor_j, turns[0].response_ids[:j], bet_id) == -4.0
    assert values.annotate(records)[0][0][j] != []

    restored = BranchValues(cfg)
    restored.load_state_dict(values.state_dict())
    assert restored.state_dict() == values.state_dict()

    # branch_unseen=baseline: one estimated token is enough, the untried one counts 0.
    base = BranchValues(AdvantageConfig(choice_update="greedy", branch_unseen="baseline"))
    base.observe(records[3:], [[5.0]])
    assert base.annotate(records[3:])[0][0][j] == [{pass_id: 0.0, bet_id: 5.0}[t] for t in order]
    assert base.annotate(records[:1])[0][0][j] == []  # a state never visited: no estimate


def test_step_source_leaves_out_the_episode_level_part(tiny_pair) -> None:
    import dataclasses

    from mage_rl.rl.advantages import compute_advantages

    _, tok = tiny_pair
    # One group of three meta-episodes: two turns each, J then K; rewards differ.
    records = []
    for i, (first, second) in enumerate([(0, 1), (1, 1), (0, 0)]):
        a, b = _turn(tok, first, "J"), _turn(tok, second, "K")
        a.reward, b.reward, b.step = float(i), 2.0 * i - 1.0, 1
        records.append(MetaEpisodeRecord(uid="g", rollout=i, env="kuhn_poker", seed=0,
                                         opponent="kuhn:a", seat=0, turns=[a, b]))  # fmt: skip
    cfg = AdvantageConfig(choice_update="greedy", branch_source="step", omega=2.0)
    step = compute_advantages(records, adv_cfg=cfg, step_only=True)
    both = compute_advantages(records, adv_cfg=cfg)
    episode = compute_advantages(records, adv_cfg=dataclasses.replace(cfg, omega=0.0))
    for s, b, e in zip(step, both, episode, strict=True):
        assert s == pytest.approx([(x - y) / 2.0 for x, y in zip(b, e, strict=True)])
    assert any(abs(x) > 1e-9 for row in step for x in row)
    assert any(abs(x) > 1e-9 for row in episode for x in row)
    with pytest.raises(ValueError, match="gigpo"):
        compute_advantages(records, adv_cfg=AdvantageConfig(estimator="grpo"), step_only=True)
    with pytest.raises(ValueError, match="branch_source"):
        AdvantageConfig(branch_source="episode")


def test_learner_moves_the_better_token_even_when_the_other_was_sampled(tiny_pair) -> None:
    model, tok = tiny_pair
    turn = _turn(tok, 0, "J")  # PASS was sampled
    j = branch_points(turn.allowed)[0]
    bet = next(t for t in turn.allowed[j] if t != turn.response_ids[j])
    rows = [[] for _ in turn.response_ids]
    rows[j] = [1.0 if t == bet else -1.0 for t in turn.allowed[j]]

    @torch.no_grad()
    def p_bet(learner: Learner) -> float:
        batch = collate(
            [Sample(turn.prompt_ids, turn.response_ids, turn.logprobs, 0.0, turn.allowed)]
        )
        logits = learner._response_logits(learner.model, batch, 1.0)[0, j]
        allowed = turn.allowed[j]
        probs = torch.softmax(logits[allowed], dim=-1)
        return float(probs[allowed.index(bet)])

    learner = Learner(copy.deepcopy(model), LearnerConfig(lr=1e-2, entropy_coef=0.0, dtype="fp32"))
    old = learner.compute_logprobs(
        [Sample(turn.prompt_ids, turn.response_ids, [], 0.0, turn.allowed)]
    )
    before = p_bet(learner)
    # The sampled term with advantage 0 would not move anything; the branch term does.
    [sample] = samples_from_records([_record([turn])], [[0.0]], [[rows]])
    sample = sample.with_old_logprobs(old[0])
    stats = learner.update([sample])
    assert stats["branch_frac"] == pytest.approx(1 / len(turn.response_ids))
    assert p_bet(learner) > before + 0.01


def test_mismatched_branch_rows_are_refused(tiny_pair) -> None:
    _, tok = tiny_pair
    turn = _turn(tok, 0, "J")
    bad = Sample(turn.prompt_ids, turn.response_ids, turn.logprobs, 0.0, turn.allowed, [[1.0]])
    with pytest.raises(ValueError, match="rows of branch advantages"):
        bad.validate(0)
    rows = [[] for _ in turn.response_ids]
    rows[0] = [1.0, 2.0]  # position 0 allows one token
    bad = Sample(turn.prompt_ids, turn.response_ids, turn.logprobs, 0.0, turn.allowed, rows)
    with pytest.raises(ValueError, match="must pair up"):
        bad.validate(0)


def test_config_needs_constrained_answers_and_the_embedded_learner() -> None:
    from mage_rl.config import TrainConfig, load_config

    def load(sets: list[str]) -> TrainConfig:
        return load_config(CONFIGS / "kuhn_tiny.yaml", sets, TrainConfig)

    with pytest.raises(ValueError, match="constrain_actions"):
        load(["advantages.choice_update=expected"])
    sets = ["advantages.choice_update=expected", "policy.constrain_actions=true"]
    assert load(sets).advantages.choice_update == "expected"
    with pytest.raises(ValueError, match="embedded learner"):
        load([*sets, "train.backend=openrlhf"])
    with pytest.raises(ValueError, match="branch_memory"):
        AdvantageConfig(branch_memory=1.0)
    step = [*sets, "advantages.branch_source=step"]
    assert load(step).advantages.branch_source == "step"
    with pytest.raises(ValueError, match="estimator: gigpo"):
        load([*step, "advantages.estimator=grpo"])
    with pytest.raises(ValueError, match="only advantages.choice_update"):
        load(["advantages.branch_source=step"])
    with pytest.raises(ValueError, match="branch_unseen"):
        load(["advantages.branch_unseen=baseline"])
    assert load([*sets, "advantages.branch_unseen=baseline"]).advantages.branch_unseen == "baseline"


def test_training_uses_the_table_and_a_resume_restores_it(tmp_path: Path) -> None:
    from mage_rl.cli import main

    run = tmp_path / "run"
    sets = ["advantages.choice_update=expected", "advantages.branch_memory=0.5",
            "policy.constrain_actions=true", "meta.prompt=compact", "meta.context=history",
            "meta.stop_on_success=false", "env.protocol=fresh", "eval.tasks=0",
            "learner.kl_coef=0", "train.iterations=1"]  # fmt: skip

    def train(extra: list[str], flags: tuple[str, ...] = ()) -> int:
        args = ["train", str(CONFIGS / "kuhn_tiny.yaml"), "--run-dir", str(run), "--no-progress"]
        return main(args + [a for o in sets + extra for a in ("--set", o)] + list(flags))

    assert train([]) == 0
    state = json.loads((run / "checkpoints" / "iter_000001" / "trainer_state.json").read_text())
    saved = state["branch_values"]["entries"]
    assert saved and all(weight >= 1.0 for _, weight in saved.values())
    first = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    assert 0 < first["losses/branch_frac"] < 1

    assert train(["train.iterations=2"], ("--resume",)) == 0
    state = json.loads((run / "checkpoints" / "iter_000002" / "trainer_state.json").read_text())
    resumed = state["branch_values"]["entries"]
    # Every saved entry came back: as it was, or decayed by 0.5 plus whole new turns.
    assert set(saved) <= set(resumed)
    for key, (_, weight) in saved.items():
        added = resumed[key][1] - 0.5 * weight
        assert resumed[key][1] == weight or (added >= 1 and abs(added - round(added)) < 1e-9)
