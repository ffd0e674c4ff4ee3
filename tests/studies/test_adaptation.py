"""The adaptation study on a tiny budget: the results document has the promised shape."""

from __future__ import annotations

import json
import threading

import pytest
import torch

from mage_rl.rl.pretrain import SUMMARY_FILE, PretrainSettings
from studies.adaptation.cli import adaptation_main
from studies.adaptation.results import format_table
from studies.adaptation.study import (
    DEFAULT_CONFIG,
    METHODS,
    _pretrained_model,
    bench_adaptation,
    method_config,
)

SMALL = ["meta.episodes=2", "rollout.tasks=2", "rollout.group_size=2", "learner.mini_batch_size=8"]


def test_results_document_shape_and_resume(tmp_path) -> None:
    out = tmp_path / "adaptation.json"
    lines: list[str] = []
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    argv = ["--methods", "mage,gigpo_single"]
    argv += ["--seats", "first", "--iterations", "1", "--eval-every", "1", "--out", str(out)]
    argv += ["--layout", "conversation", "--eval-average", "0.999999"]
    argv += [a for s in SMALL for a in ("--set", s)]
    try:
        assert adaptation_main([*argv, "--threads", "1"]) == 0
        # --threads holds for the process and for threads started later (the engine's).
        seen: list[int] = []
        worker = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
        worker.start()
        worker.join()
        assert torch.get_num_threads() == 1 and seen == [1]
    finally:
        torch.set_num_threads(threads)
    saved = json.loads(out.read_text())
    assert saved["results"].keys() == {"mage", "gigpo_single"}
    for cell in (saved["results"][m]["first"] for m in saved["results"]):
        assert len(cell["ev_by_episode"]) == 2
        assert cell["last_episode_ev"] == cell["ev_by_episode"][-1]
        assert cell["seeds"] == [0]
        curve = cell["runs"][0]["curve"]
        assert [p["iteration"] for p in curve] == [0, 1]
        # The moving average is evaluated beside the trained weights; a decay this close
        # to 1 keeps it at the initial weights.
        start = curve[0]["ev_by_episode"]
        assert [p["average"]["ev_by_episode"] for p in curve] == [start, start]
        assert cell["runs"][0]["average"] == curve[-1]["average"]
    gigpo = saved["results"]["gigpo_single"]["first"]["runs"][0]["config"]
    assert gigpo["meta"]["episodes"] == 1 and gigpo["rollout"]["group_size"] == 4
    assert gigpo["meta"]["layout"] == "conversation"
    assert saved["reference"]["first"]["best_fixed"] == pytest.approx(1 / 12)
    assert saved["reference"]["first"]["target"] == pytest.approx((1 / 12 + 0.2833) / 2, abs=1e-3)
    assert (tmp_path / "adaptation_curves.png").stat().st_size > 0
    assert "| mage |" in format_table(saved)
    # The file and every run say what produced them, thread count first.
    assert saved["provenance"]["torch_threads"] == 1
    command = "python -m studies.adaptation --methods mage,gigpo_single --seats first"
    assert saved["provenance"]["command"].startswith(command)
    assert saved["setup"]["eval_average"] == 0.999999
    assert saved["provenance"]["versions"]["torch"] == torch.__version__
    for cell in (saved["results"][m]["first"] for m in saved["results"]):
        assert cell["runs"][0]["provenance"]["torch_threads"] == 1
        assert cell["runs"][0]["provenance"]["wall_seconds"] > 0
        assert cell["runs"][0]["provenance"]["command"] == saved["provenance"]["command"]
    # Each run ends with a checkpoint of its final policy, a loadable HF model.
    models = sorted(tmp_path.glob("**/checkpoints/iter_000001/model/config.json"))
    assert len(models) == 2
    # A second call keeps the finished runs instead of training again (with the same
    # settings only: a run without the average is not one of them).
    again = dict(methods=["mage"], seats=["first"], iterations=1, eval_every=1, out=out)
    lines.clear()
    bench_adaptation(**again, overrides=SMALL, log=lines.append, average=0.999999)
    assert any("kept" in line for line in lines)


@pytest.mark.slow
def test_rollouts_after_evaluating_the_average_use_the_trained_weights(tmp_path) -> None:
    # The average is evaluated after iteration 1; iteration 2 must sample from the trained
    # weights again, so the run trains exactly as without averaging.
    common = dict(methods=["mage"], seats=["first"], iterations=2, eval_every=1, overrides=SMALL)
    plain = bench_adaptation(out=tmp_path / "plain.json", log=lambda _: None, **common)
    doc = bench_adaptation(out=tmp_path / "avg.json", log=lambda _: None, average=0.5, **common)
    curves = [
        [p["ev_by_episode"] for p in d["results"]["mage"]["first"]["runs"][0]["curve"]]
        for d in (plain, doc)
    ]
    assert curves[0] == curves[1]


def test_reward_to_go_applies_to_the_differential_methods_only() -> None:
    # One command line for every method: the methods whose reward has no previous-episode
    # term train without it instead of failing the config check.
    extra = ["returns.reward_to_go=true", "learner.lr=2e-3"]
    for name, method in METHODS.items():
        train_cfg, eval_cfg = method_config(DEFAULT_CONFIG, method, "first", 0, 5, extra)
        differential = train_cfg.returns.mode == "differential"
        assert train_cfg.returns.reward_to_go is differential, name
        assert eval_cfg.returns.reward_to_go is differential, name
        assert train_cfg.learner.lr == 2e-3, name
    plain, _ = method_config(DEFAULT_CONFIG, METHODS["mage"], "first", 0, 5, [])
    assert not plain.returns.reward_to_go


def test_unknown_method_is_named() -> None:
    with pytest.raises(ValueError, match="valid: " + ", ".join(METHODS)):
        bench_adaptation(methods=["nope"], out="unused.json")
    with pytest.raises(ValueError, match="decay in"):
        bench_adaptation(methods=["mage"], out="unused.json", average=1.0)


def test_pretrained_start_and_time_budget(tmp_path) -> None:
    out = tmp_path / "adaptation.json"
    lines: list[str] = []
    settings = PretrainSettings(batches=1, epochs=1, batch_size=8, holdout=4)
    # Pretrain first, to know its time: the budget is that plus a moment, so RL is out of
    # time after its first iteration.
    model = _pretrained_model(DEFAULT_CONFIG, SMALL, 0, settings, tmp_path / "runs", print)
    pretrain_seconds = json.loads(
        (tmp_path / "runs" / "pretrained_seed0" / SUMMARY_FILE).read_text()
    )["seconds"]
    common = dict(
        methods=["mage", "gigpo_single"],
        seats=["first"],
        iterations=3,
        eval_every=3,
        out=out,
        overrides=SMALL,
        pretrain=settings,
        minutes=(pretrain_seconds + 1e-3) / 60,
        log=lines.append,
    )
    doc = bench_adaptation(**common)
    assert doc["setup"]["pretrain"]["0"]["seats"] == ["first", "second"]
    for name in ("mage", "gigpo_single"):
        run = doc["results"][name]["first"]["runs"][0]
        assert run["pretrained"] == model
        assert run["config"]["policy"]["model"] == model
        assert run["iterations_done"] == 1
        assert [p["iteration"] for p in run["curve"]] == [0, 1]
        assert run["pretrain_seconds"] > 0
        # Pretraining is part of the time budget: RL gets what it left.
        assert run["pretrain_seconds"] == pretrain_seconds
        assert run["budget_seconds"] == pytest.approx(pretrain_seconds + 1e-3)
        assert run["max_train_seconds"] == pytest.approx(1e-3)
    assert "+" in format_table(doc).split("| mage |")[1].splitlines()[0]
    # Again: the pretrained model and the runs are kept, not made anew.
    lines.clear()
    bench_adaptation(**common)
    assert any("pretrained model of seed 0: kept" in line for line in lines)
    assert sum("kept from" in line for line in lines) == 3
    # A budget that pretraining used up is refused, not run with no RL at all.
    with pytest.raises(ValueError, match="the whole --minutes"):
        bench_adaptation(**{**common, "minutes": pretrain_seconds / 120})
    # Other pretraining settings do not silently reuse that model.
    with pytest.raises(FileExistsError, match="other settings"):
        bench_adaptation(**{**common, "pretrain": PretrainSettings(batches=2)})


def test_benchmarks_sharing_an_output_keep_each_others_cells(tmp_path) -> None:
    from studies.adaptation.results import save_cell

    out = tmp_path / "shared.json"
    cell = {"ev_by_episode": [0.1], "last_episode_ev": 0.1, "seeds": [0], "runs": []}
    # Two benchmarks start from the same (empty) file, then each writes its own cell.
    first = {"reference": {}, "setup": {"iterations": 5}, "results": {"mage": {"first": cell}}}
    second = {"reference": {}, "setup": {"iterations": 5}, "results": {"cumulative": {}}}
    save_cell(out, first, "mage", "first")
    second["results"]["cumulative"]["second"] = {**cell, "seeds": [1]}
    merged = save_cell(out, second, "cumulative", "second")
    on_disk = json.loads(out.read_text())
    assert on_disk == merged
    assert on_disk["results"]["mage"]["first"]["seeds"] == [0]
    assert on_disk["results"]["cumulative"]["second"]["seeds"] == [1]


def test_benchmarks_of_other_seeds_keep_each_others_pretraining(tmp_path) -> None:
    from studies.adaptation.results import save_cell

    out = tmp_path / "shared.json"
    cell = {"ev_by_episode": [0.1], "last_episode_ev": 0.1, "seeds": [0], "runs": []}
    for seed in (0, 1):
        setup = {"iterations": 5, "pretrain": {str(seed): {"seconds": 10.0 + seed}}}
        doc = {"reference": {}, "setup": setup, "results": {"mage": {"first": cell}}}
        save_cell(out, doc, "mage", "first")
    pretrain = json.loads(out.read_text())["setup"]["pretrain"]
    assert pretrain == {"0": {"seconds": 10.0}, "1": {"seconds": 11.0}}


def _run(seed: int, ev: float, iterations: int = 5) -> dict:
    return {
        "seed": seed,
        "iterations": iterations,
        "max_train_seconds": None,
        "pretrained": None,
        "train_seconds": 1.0,
        "ev_by_episode": [ev, ev],
        "curve": [{"iteration": 0, "ev_by_episode": [0.0, 0.0]}],
    }


def test_benchmarks_adding_seeds_to_one_cell_keep_each_others_runs(tmp_path) -> None:
    from studies.adaptation.results import aggregate, plot_curves, save_cell

    out = tmp_path / "shared.json"
    base = {"reference": {}, "setup": {}}
    save_cell(
        out, {**base, "results": {"mage": {"first": aggregate([_run(0, 0.3)])}}}, "mage", "first"
    )
    # Two benchmarks, seeds 2 and 1, each knowing only its own run.
    save_cell(
        out, {**base, "results": {"mage": {"first": aggregate([_run(2, 0.0)])}}}, "mage", "first"
    )
    cell = save_cell(
        out, {**base, "results": {"mage": {"first": aggregate([_run(1, 0.6)])}}}, "mage", "first"
    )["results"]["mage"]["first"]
    assert cell["seeds"] == [0, 1, 2]
    assert cell["last_episode_ev"] == pytest.approx(0.3)
    # A run with another budget replaces the cell instead of being averaged with it.
    longer = aggregate([_run(1, 0.9, iterations=50)])
    cell = save_cell(out, {**base, "results": {"mage": {"first": longer}}}, "mage", "first")
    assert cell["results"]["mage"]["first"]["seeds"] == [1]

    doc = json.loads(out.read_text())
    doc["reference"] = {"first": {"best_fixed": 0.1, "target": 0.2, "ceiling": 0.3}}
    assert plot_curves(doc, tmp_path / "curves.png").stat().st_size > 0


def test_cli_pretrain_sizes_need_pretrain(tmp_path, capsys) -> None:
    out = tmp_path / "never.json"
    with pytest.raises(SystemExit) as exit_info:
        adaptation_main(["--pretrain-epochs", "2", "--out", str(out)])
    assert exit_info.value.code == 2
    assert "need --pretrain" in capsys.readouterr().err
    assert not out.exists()
