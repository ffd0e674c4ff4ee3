"""A training run's report: the untrained model and the baselines on the same tasks as the
trained one, stratified ev@k, the oracle values, the verdict and the learning curve."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mage_rl.cli import main
from mage_rl.config import TrainConfig, load_config
from mage_rl.eval.verdicts import VERDICT_FIELDS

CONFIG = Path(__file__).parents[2] / "configs" / "kuhn_tiny.yaml"
SETTINGS = [
    "env.population=kuhn:conservative", "env.seat=first", "env.protocol=fresh",
    "meta.stop_on_success=false", "policy.constrain_actions=true", "train.iterations=1",
    "eval.tasks=18", "eval.stratify=true", "meta.episodes=2", "policy.max_tokens=12", "eval.before=true", "eval.baselines=[react]",
    "eval.baseline_tasks=12",
]  # fmt: skip


def test_the_report_compares_untrained_baselines_and_trained(tmp_path: Path, capsys) -> None:
    run = tmp_path / "run"
    args = ["train", str(CONFIG), "--run-dir", str(run), "--no-progress"]
    assert main([*args, *(x for s in SETTINGS for x in ("--set", s))]) == 0
    out = "".join(capsys.readouterr().out.split())  # the console wraps long paths
    assert f"report:{run / 'report.md'}" in out and f"plot:{run / 'learning_curve.png'}" in out
    untrained = json.loads((run / "eval" / "untrained.json").read_text())
    trained = json.loads((run / "eval" / "iter_000001.json").read_text())
    react = json.loads((run / "eval" / "react.json").read_text())
    # The same 6 deals x 3 tasks for the run's own graph; the baseline (eval.baseline_tasks)
    # plays the first 2 of every deal.
    for summary in (untrained, trained):
        assert summary["n"] == 18 and len(summary["stratified"]["ev@k"]) == 2
    assert react["n"] == 12 and len(react["stratified"]["ev@k"]) == 2
    assert react["constrain_actions"] is False and untrained["constrain_actions"] is True

    def tasks(label: str) -> list[tuple]:
        lines = (run / "eval" / f"{label}.jsonl").open()
        return [(r["seed"], r["opponent"], r["seat"]) for r in map(json.loads, lines)]

    assert tasks("untrained") == tasks("iter_000001")
    assert set(tasks("react")) < set(tasks("untrained"))
    report = (run / "report.md").read_text()
    assert "react played 12 of them, the first seeds of every stratum" in report
    for needle in (
        "| untrained |",
        "| react |",
        "| trained (iter_000001) |",
        "best fixed +0.1667",
        "Bayes last episode",
        "Does the last episode exploit",
        "learning_curve.png",
        "commit",
    ):
        assert needle in report, needle  # fmt: skip
    assert (run / "learning_curve.png").read_bytes()[:4] == b"\x89PNG"
    doc = json.loads((run / "report.json").read_text())
    assert doc["oracle"]["first"]["best_fixed"] == pytest.approx(1 / 6)
    assert doc["verdict"] and doc["provenance"]["wall_seconds"] > 1  # the whole run, not the report
    # The three verdicts on the last episode, each with both values and intervals.
    found = doc["verdicts"]
    assert set(found) == {"last_vs_first", "last_vs_best_fixed", "last_vs_untrained"}
    last = trained["stratified"]["ev@k"][-1]
    assert found["last_vs_first"]["first"]["mean"] == trained["stratified"]["ev@k"][0]["mean"]
    assert (
        found["last_vs_untrained"]["untrained"]["high"]
        == untrained["stratified"]["ev@k"][-1]["high"]
    )
    assert found["last_vs_best_fixed"]["best_fixed"]["mean"] == pytest.approx(1 / 6)  # first seat
    for verdict in found.values():
        assert verdict["last"]["mean"] == last["mean"] and verdict["last"]["low"] == last["low"]
        other = next(v for k, v in verdict.items() if k not in VERDICT_FIELDS)
        assert verdict["intervals_apart"] == (last["low"] > other["high"])
    # Against the first episode and the untrained model the verdict is paired, task by
    # task over the same 18 tasks and strata: the stratified mean of the differences is
    # the difference of the stratified means, and ``apart`` is its interval above 0.
    for key, other in (("last_vs_first", "first"), ("last_vs_untrained", "untrained")):
        paired = found[key]["paired"]
        assert paired["tasks"] == 18 and paired["stratified"]
        diff = paired["difference"]
        assert diff["mean"] == pytest.approx(last["mean"] - found[key][other]["mean"])
        assert found[key]["apart"] == (diff["low"] > 0)
        assert -2.0 <= diff["low"] <= diff["mean"] <= diff["high"] <= 2.0  # Kuhn: -2..2 chips
    assert "paired" not in found["last_vs_best_fixed"]
    assert "paired over 18 tasks" in report
    # What each agent answered at each state: the first seat against one opponent has
    # two kinds of decision per card; every play answer of the evaluation is counted.
    assert "What each agent answered at each decision state" in report
    decisions = doc["decisions"]
    assert set(decisions) == {"untrained", "react", "trained (iter_000001)"}
    assert all(state.startswith("Your card: ") for state in decisions["untrained"])
    plays = sum(
        1 for x in (run / "eval" / "untrained.jsonl").open()
        for t in json.loads(x)["turns"] if t["kind"] == "play"
    )  # fmt: skip
    assert sum(sum(c.values()) for c in decisions["untrained"].values()) == plays
    # The same answers by episode: one column per episode, the same total.
    assert "The same answers by episode" in report and "| episode 1 | episode 2 |" in report
    by_episode = doc["decisions_by_episode"]["untrained"]
    assert set(by_episode) <= {"0", "1", "2"} and "0" in by_episode
    assert sum(sum(c.values()) for c in by_episode.values()) == plays


def test_eval_settings_that_cannot_work_are_refused() -> None:
    with pytest.raises(ValueError, match="stop_on_success"):
        load_config(CONFIG, ["eval.stratify=true"], TrainConfig)
    with pytest.raises(ValueError, match="no_such_agent"):
        load_config(CONFIG, ["eval.baselines=[no_such_agent]"], TrainConfig)
    # More baseline tasks than evaluation tasks (or none at all) means all of them: the
    # main job's 72 must not stand in the way of a quick run with fewer.
    main_job = CONFIG.with_name("kuhn_smollm2.yaml")
    for tasks in ("0", "36"):
        cfg = load_config(main_job, [f"eval.tasks={tasks}"], TrainConfig)
        assert cfg.eval.baseline_tasks == 72


def test_fewer_baseline_tasks_are_the_first_of_the_same_tasks() -> None:
    from mage_rl.eval.training import eval_tasks

    plain = load_config(CONFIG, ["eval.tasks=10"], TrainConfig)
    everything, _ = eval_tasks(plain)
    first, design = eval_tasks(plain, 4)
    assert len(everything) == 10 and first == everything[:4] and design is None
    stratified = load_config(CONFIG, [*SETTINGS, "eval.tasks=36"], TrainConfig)
    everything, full = eval_tasks(stratified)
    fewer, part = eval_tasks(stratified, 13)  # rounded up to 3 per stratum
    assert len(everything) == 36 and len(fewer) == 18 and set(fewer) < set(everything)
    assert part is not None and full is not None and part.weights == full.weights
    per_stratum = {key: part.strata.count(key) for key in part.weights}
    assert set(per_stratum.values()) == {3}


def test_leduc_and_liars_dice_reports_carry_their_oracle_values(monkeypatch) -> None:
    """The report's reference lines are the game oracle's, for the run's population (the
    oracle's own values are tested in tests/eval/test_game_oracles.py)."""
    from mage_rl.eval import training_report
    from mage_rl.eval.training_report import oracle_values

    asked = []

    def values(game, population):
        asked.append((game, dict(zip(population.specs, population.weights, strict=True))))
        return {
            seat: {"best_response": {}, "best_fixed": 0.1 * i, "ceiling": 0.2 * i}
            for i, seat in enumerate(("first", "second"), start=1)
        }

    monkeypatch.setattr(training_report, "exploitation_values", values)
    configs = Path(__file__).parents[2] / "configs"
    for name, game in (("leduc", "leduc_poker"), ("liars_dice", "liars_dice")):
        cfg = load_config(configs / f"{name}_smollm2.yaml", cls=TrainConfig)
        assert oracle_values(cfg) == {
            "first": {"best_fixed": 0.1, "ceiling": 0.2},
            "second": {"best_fixed": 0.2, "ceiling": 0.4},
        }
        assert asked[-1][0] == game and sum(asked[-1][1].values()) == pytest.approx(1.0)
    assert any("tight_passive" in spec for spec in asked[0][1])
    ttt = load_config(configs / "tictactoe_smollm2.yaml", cls=TrainConfig)
    assert oracle_values(ttt) is None


def test_games_without_a_payoff_get_a_verdict_on_success() -> None:
    from mage_rl.eval.training_report import _verdict

    def summary(mean: float, low: float, high: float) -> dict:
        est = {"mean": mean, "low": low, "high": high, "n": 48}
        block = {"success@k": [est, est]}
        return {"intervals": {**block, "by_seat": {"first": block}}}

    rows = [
        ("untrained", summary(0.2, 0.1, 0.3)),
        ("trained (iter_000004)", summary(0.6, 0.45, 0.7)),
    ]
    lines = _verdict(rows, None, 2)
    assert lines[0] == (
        "- success@2, all seats: trained 0.60 [0.45, 0.70], untrained 0.20 [0.10, 0.30]: "
        "above the untrained model, 95 % intervals apart."
    )
    assert lines[1].startswith("- success@2, first seat:") and len(lines) == 2


def test_a_perfect_score_plots_though_its_interval_ends_below_it(tmp_path: Path) -> None:
    """A Wilson interval of a rate of 1 ends at 0.9999999999999998: the bar reaches 0 above
    the point, where a negative reach stopped the main job's report."""
    from mage_rl.eval.stats import error_bar
    from mage_rl.eval.training_report import _plot

    perfect = {"mean": 1.0, "low": 0.93982814785791, "high": 0.9999999999999998, "n": 60}
    assert error_bar(perfect) == (pytest.approx(0.06017185214209), 0.0)
    assert error_bar({"mean": 0.5, "low": None, "high": None}) == (0.0, 0.0)
    rows = [("trained (iter_000020)", {"stratified": {"ev@k": [perfect]}})]
    path = _plot(tmp_path, rows, None, 1, 20)
    assert path.read_bytes()[:4] == b"\x89PNG"


def test_a_report_against_several_rps_families_splits_them(tmp_path: Path) -> None:
    """Each agent's first and last round per opponent family, with the family's exact
    references; a population of one family gets no such table."""
    from mage_rl.eval.rps_families import family_table
    from mage_rl.eval.training_report import _families

    config = Path(__file__).parents[2] / "configs" / "rps_families_smollm2.yaml"
    cfg = load_config(config, [], TrainConfig)
    (tmp_path / "eval").mkdir()
    plays = {  # opponent -> the four rounds' payoffs of each of its meta-episodes
        "always_rock": [(0, 1, 1, 1), (-1, 1, 1, 1)],
        "cycle_down": [(1, -1, -1, -1)],
        "copies_you": [(0, 0, 1, 1), (1, 0, 0, -1)],
    }
    records = [
        {"opponent": f"rock_paper_scissors:{name}", "episodes": [{"payoff": p} for p in rounds]}
        for name, games in plays.items()
        for rounds in games
    ]
    records.append({"opponent": "rock_paper_scissors:beats_you", "episodes": [{"payoff": 1}]})
    for label in ("untrained", "iter_000003"):
        (tmp_path / "eval" / f"{label}.jsonl").write_text(
            "\n".join(json.dumps(r) for r in records) + "\n"
        )
    families = _families(tmp_path, cfg, "iter_000003")
    assert set(families) == {"untrained", "trained (iter_000003)"}
    found = families["untrained"]
    assert set(found) == {"habits", "cycles", "reactive"}  # the unfinished one left out
    assert found["habits"]["n"] == 2 and found["habits"]["first"]["mean"] == -0.5
    assert found["habits"]["last_minus_first"]["mean"] == pytest.approx(1.5)
    assert found["reactive"]["last"]["mean"] == 0.0 and found["reactive"]["n"] == 2
    # The references are each family's alone: cycle_down alone is one family member.
    assert found["cycles"]["rule_last"] == -1.0 and found["cycles"]["bayes_last_family"] == 1.0
    assert found["habits"]["rule_last"] == 1.0 and found["reactive"]["rule_last"] == 0.0
    assert found["habits"]["bayes_last_population"] == pytest.approx(
        _population_bayes_last(cfg, "habits")
    )
    lines = family_table(list(families.items()))
    assert "| habits | untrained | 2 | -0.500" in "\n".join(lines)
    assert any(
        line.startswith("The last round by opponent, untrained: always_rock +1.000")
        for line in lines
    )
    main_job = load_config(config, ["env.population=rps_train"], TrainConfig)
    assert _families(tmp_path, main_job, "iter_000003") == {}


def _population_bayes_last(cfg, family: str) -> float:
    from mage_rl import runtime
    from mage_rl.envs.rps_values import rps_values

    pop = runtime.eval_population(cfg)
    values = rps_values(dict(zip(pop.specs, pop.weights, strict=True)), cfg.meta.episodes)
    return values.families[family]["bayes_last"]
