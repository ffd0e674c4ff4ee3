"""``GAME:self``: the current policy in the other seat, its calls trained with groups of
their own seat (SPEC §10)."""

from __future__ import annotations

import math

import pyspiel
import pytest

from mage_rl import runtime
from mage_rl.config import TrainConfig, load_config
from mage_rl.envs import make_env
from mage_rl.envs.llm_opponent import SelfOpponent
from mage_rl.records import EpisodeResult, MetaEpisodeRecord, Turn
from mage_rl.rl.batching import Sample
from mage_rl.rl.selfplay import SELF_AGENT, seat_records

SETTINGS = [
    "env.name=kuhn_poker", "env.population=kuhn_poker:self=0.5,kuhn_poker:aggressive=0.5",
    "env.seat=sampled", "env.protocol=fresh", "meta.episodes=2", "meta.stop_on_success=false", "meta.prompt=compact",
    "meta.layout=conversation", "policy.model=tiny", "policy.dtype=fp32", "learner.dtype=fp32",
    "policy.constrain_actions=true", "policy.max_tokens=24", "rollout.tasks=4",
    "rollout.group_size=3", "rollout.opponents=balanced", "learner.lr=1e-3", "learner.kl_coef=0",
    "eval.tasks=0", "eval.before=false",
]  # fmt: skip


def _call(episode: int, step: int, anchor: str, reward: float = 0.0, trained: bool = True) -> Turn:
    return Turn(kind="opponent", episode=episode, step=step, anchor=anchor, reward=reward,
                node="opponent", trained=trained, response_ids=[1], logprobs=[-0.5])  # fmt: skip


def test_each_hand_of_the_self_seat_is_a_record_of_its_own_seat_and_deal() -> None:
    def record(rollout: int, rewards: list[float]) -> MetaEpisodeRecord:
        return MetaEpisodeRecord(
            uid="g", rollout=rollout, env="kuhn_poker", seed=7, opponent="kuhn_poker:self",
            seat=0, episodes=[EpisodeResult(k, "won", r) for k, r in enumerate(rewards)],
            opponent_calls=[
                _call(0, 0, "1"), _call(0, 1, "1pb", -rewards[0]), _call(1, 0, "2b", -rewards[1]),
            ],
        )  # fmt: skip

    frozen = MetaEpisodeRecord(
        uid="h", rollout=0, env="kuhn_poker", seed=8, opponent="kuhn_poker:llm:x", seat=1,
        episodes=[EpisodeResult(0, "won", 1.0)], opponent_calls=[_call(0, 0, "0", -1, False)],
    )  # fmt: skip
    seats = seat_records([record(0, [1.0, -2.0]), record(1, [-1.0, 2.0]), frozen])
    # Two hands per self-play record, none from the frozen opponent's untrained calls.
    assert [(s.rollout, s.opponent) for s in seats] == [
        (0, "mage@episode0"), (0, "mage@episode1"), (1, "mage@episode0"), (1, "mage@episode1")
    ]  # fmt: skip
    assert all(s.seat == 1 and s.agent == SELF_AGENT for s in seats)
    # Hand k of every rollout of a task shares a group (same deal); hands and the agent's
    # group never mix.
    assert seats[0].uid == seats[2].uid != seats[1].uid == seats[3].uid
    assert "g" not in {s.uid for s in seats}
    first = seats[0]
    assert [(t.kind, t.node, t.episode, t.step) for t in first.turns] == [
        ("play", "opponent", 0, 0), ("play", "opponent", 0, 1)
    ]  # fmt: skip
    assert first.episodes == [EpisodeResult(0, "lost", -1.0, turns=2)]
    assert seats[1].episodes[0].reward == 2.0 and seats[1].episodes[0].outcome == "won"


@pytest.fixture(scope="module")
def trainer(tmp_path_factory: pytest.TempPathFactory):
    from mage_rl.rl.trainer import Trainer

    cfg = load_config(None, SETTINGS, TrainConfig)
    trainer = Trainer(cfg, tmp_path_factory.mktemp("selfplay") / "run", progress=False)
    yield trainer
    trainer.engine.close()
    trainer.self_play.uninstall()


def test_a_self_run_trains_both_seats_with_per_seat_groups(trainer) -> None:
    records = trainer.rollout(0)
    selfplay = [r for r in records if r.opponent == "kuhn_poker:self"]
    fixed = [r for r in records if r.opponent == "kuhn_poker:aggressive"]
    assert selfplay and fixed and all(not r.opponent_calls for r in fixed)
    for record in selfplay:
        # Kuhn's second seat always acts, so every hand has a call of the self seat;
        # its reward is the other side of the agent's (zero-sum).
        hands = {c.episode for c in record.opponent_calls}
        assert hands == set(range(len(record.episodes)))
        for k, episode in enumerate(record.episodes):
            calls = [c for c in record.opponent_calls if c.episode == k]
            assert [c.step for c in calls] == list(range(len(calls)))
            assert sum(c.reward for c in calls) == pytest.approx(-episode.reward)
            assert all(c.kind == "opponent" and c.trained and c.anchor for c in calls)
    # The recorded log-probs are the learner's own (fp32, no exploration): PPO is exact.
    calls = [c for r in selfplay for c in r.opponent_calls]
    samples = [Sample(c.prompt_ids, c.response_ids, c.logprobs, 1.0, c.allowed) for c in calls]
    for call, scored in zip(calls, trainer.learner.compute_logprobs(samples), strict=True):
        assert scored == pytest.approx(call.logprobs, abs=1e-4)

    player = SelfOpponent.player("kuhn_poker", 1 - selfplay[0].seat)
    state = _a_state_of(player)
    before = player.probabilities(state)
    trainer.learn(records)
    seats = [r for r in trainer.trained if r.agent == SELF_AGENT]
    assert len(trainer.trained) == len(records) + len(seats)
    assert {r.uid for r in seats}.isdisjoint(r.uid for r in records)
    assert all(r.seat == 1 - o.seat for r in seats for o in selfplay if o.rollout == r.rollout
               and r.seed == o.seed)  # fmt: skip
    credit = dict(zip((id(r) for r in trainer.trained), trainer.credit, strict=True))
    trained_self = [c.advantage for r in seats for c in credit[id(r)]]
    assert len(trained_self) == len(calls) and any(a != 0 for a in trained_self)
    # The update reached the self seat: what it read is forgotten and reads differently.
    assert not player.reads
    after = player.probabilities(state)
    assert after != pytest.approx(before, abs=1e-6)


def _a_state_of(player):
    """A Kuhn state where ``player``'s seat acts: J and Q dealt, then a pass if it is second."""
    state = pyspiel.load_game("kuhn_poker").new_initial_state()
    for action in [0, 1] + [0] * player.env.seat:
        state.apply_action(action)
    assert state.current_player() == player.env.seat
    return state


def test_self_samples_from_the_runs_exploration_mixture(tmp_path) -> None:
    from mage_rl.rl.trainer import Trainer

    cfg = load_config(None, [*SETTINGS, "policy.explore=0.4"], TrainConfig)
    trainer = Trainer(cfg, tmp_path / "run", progress=False)
    try:
        calls = [c for r in trainer.rollout(0) for c in r.opponent_calls]
        branch = [(c, j) for c in calls for j, a in enumerate(c.allowed) if len(a) > 1]
        assert branch
        assert all(math.exp(c.logprobs[j]) >= 0.4 / len(c.allowed[j]) - 1e-9 for c, j in branch)
    finally:
        trainer.engine.close()
        trainer.self_play.uninstall()


def test_self_plays_only_inside_training_and_evaluation_leaves_it_out(monkeypatch) -> None:
    cfg = load_config(None, SETTINGS, TrainConfig)
    assert runtime.eval_population(cfg).specs == ["kuhn_poker:aggressive"]
    # What the report and mage exploitability value, labelled by what is left.
    assert list(runtime.eval_population_named(cfg)) == ["kuhn_poker:aggressive=1"]
    alone = load_config(None, [*SETTINGS, "env.population=kuhn_poker:self"], TrainConfig)
    with pytest.raises(ValueError, match="self-play alone"):
        runtime.eval_population(alone)
    opponent = make_env("kuhn_poker", "kuhn_poker:self").opponent
    with pytest.raises(ValueError, match="not a fixed strategy"):
        opponent.action_probabilities(None, 1)
    monkeypatch.setattr(SelfOpponent, "player", None)  # no trainer has installed itself
    with pytest.raises(RuntimeError, match="inside mage train only"):
        opponent.act(None, 1)


def test_mage_eval_of_a_self_play_run_plays_the_rest_of_its_population(trainer) -> None:
    from types import SimpleNamespace

    from mage_rl.eval.agents import AgentSpec
    from mage_rl.players.play_settings import CONDITION_KEYS, resolve_conditions

    settings = SimpleNamespace(**dict.fromkeys(CONDITION_KEYS))
    agent = AgentSpec("run", "mage", "tiny", run=str(trainer.run_dir))
    opponents = resolve_conditions(settings, [agent])["opponents"]
    assert opponents == "kuhn_poker:aggressive=1.0"


def test_the_self_play_and_league_configs_load() -> None:
    from pathlib import Path

    configs = Path(__file__).parents[2] / "configs"
    selfplay = load_config(configs / "kuhn_selfplay_smollm2.yaml", [], TrainConfig)
    pop = runtime.population(selfplay)
    assert dict(zip(pop.specs, pop.weights, strict=True))["kuhn_poker:self"] == 0.5
    assert (
        runtime.eval_population(selfplay).specs
        == runtime.population(load_config(configs / "kuhn_smollm2.yaml", [], TrainConfig)).specs
    )  # evaluated against kuhn_train, as the Kuhn job
    league = load_config(configs / "kuhn_league_smollm2.yaml", [], TrainConfig)
    assert league.league.every == 2 and league.league.weighting == "prioritized"
