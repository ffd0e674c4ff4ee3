"""The benchmarks run end to end on the tiny model and return well-formed results.

Only the shape of the results is checked: timings are measurements, not assertions.
"""

from __future__ import annotations

import math

import pytest
import torch

from mage_rl.bench import (
    bench_learner,
    bench_rollout,
    format_learner_report,
    format_rollout_report,
)


@pytest.fixture(autouse=True)
def one_torch_thread():
    """The tiny model gains nothing from a second thread, and when another process keeps
    the CPUs busy, OpenMP barrier waits make each of its forward passes ~100x slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_bench_rollout_reports_both_modes_and_their_ratio() -> None:
    finished: list[str] = []
    result = bench_rollout(
        model="tiny", meta_episodes=2, episodes=2, max_tokens=4, dtype="fp32",
        on_meta_episode=finished.append,
    )  # fmt: skip
    assert result["config"]["meta_episodes"] == 2
    assert list(result["modes"]) == ["batched", "sequential"]
    assert finished.count("batched") == finished.count("sequential") == 2
    for mode, m in result["modes"].items():
        assert m["meta_episodes"] == 2
        assert m["max_batch_size"] == (2 if mode == "batched" else 1)
        # Two episodes of at least one play turn each, and one reflection between them.
        assert m["llm_calls"] >= 2 * 3
        assert m["generated_tokens"] >= m["llm_calls"]
        assert m["mean_response_tokens"] <= 2 * 4  # reflect turns get twice max_tokens
        assert m["batches"] >= 1 and m["forward_passes"] >= m["batches"]
        assert 0.0 <= m["outside_model_share"] <= 1.0
        assert m["cpu_cores"] > 0 and m["round_wall_s"] == [m["wall_s"]]
        assert 0.0 < m["model_s"] < m["wall_s"] + 0.01  # the last batch ends just after its answer
        for key in ("wall_s", "meta_episodes_per_min", "tokens_per_s"):
            assert math.isfinite(m[key]) and m[key] > 0
    assert result["modes"]["sequential"]["mean_batch"] == 1.0
    assert set(result["ratios"]) == {"meta_episodes_per_min", "tokens_per_s"}
    assert all(r > 0 for r in result["ratios"].values())
    report = format_rollout_report(result)
    assert "| batched |" in report and "| sequential |" in report
    assert "Batched / sequential" in report


def test_bench_rollout_runs_a_single_mode_without_ratios() -> None:
    result = bench_rollout(
        model="tiny", meta_episodes=1, episodes=1, max_tokens=4, dtype="fp32",
        modes=("sequential",), rounds=2,
    )  # fmt: skip
    assert list(result["modes"]) == ["sequential"]
    m = result["modes"]["sequential"]
    assert len(m["round_wall_s"]) == 2 and m["wall_s"] == min(m["round_wall_s"])
    assert result["ratios"] == {}
    assert "Batched / sequential" not in format_rollout_report(result)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"modes": ("batched", "fast")}, "modes="),
        ({"modes": ()}, "modes="),
        ({"env": "chess"}, "env='chess'"),
        ({"meta_episodes": 0}, "meta_episodes"),
        ({"rounds": 0}, "rounds"),
    ],
)
def test_bench_rollout_rejects_bad_settings(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        bench_rollout(model="tiny", **kwargs)


def test_bench_learner_reports_each_dtype_and_the_ratio() -> None:
    result = bench_learner(model="tiny", samples=4, prompt_len=16, response_len=4, repeats=2)
    assert list(result["dtypes"]) == ["bf16", "fp32"]
    assert result["dtypes"]["bf16"]["autocast"] == "bfloat16"
    assert result["dtypes"]["fp32"]["autocast"] == "float32"
    for d in result["dtypes"].values():
        assert d["tokens_per_update"] == 4 * (16 + 4)
        assert len(d["repeat_s"]) == 2 and d["update_s"] == min(d["repeat_s"])
        assert d["cpu_cores"] > 0
        for key in ("warmup_s", "update_s", "tokens_per_s"):
            assert math.isfinite(d[key]) and d[key] > 0
        # Old log-probs come from the learner itself: on-policy, nothing is clipped.
        assert d["clip_frac"] < 0.01
        assert abs(d["approx_kl"]) < 1e-3
    assert result["ratios"]["bf16/fp32"] > 0
    report = format_learner_report(result)
    assert "| bf16 |" in report and "| fp32 |" in report and "bf16 / fp32" in report


def test_bench_learner_compares_learner_settings() -> None:
    variants = ["fp32:64", "fp32:16"]
    result = bench_learner(
        model="tiny", samples=4, prompt_len=16, response_len=4, repeats=1, kl_coef=0.0,
        variants=variants, prompt_spread=6,
    )  # fmt: skip
    assert list(result["dtypes"]) == variants and list(result["ratios"]) == ["fp32:16/fp32:64"]
    tokens = {d["tokens_per_update"] for d in result["dtypes"].values()}
    assert len(tokens) == 1 and tokens != {4 * (16 + 4)}  # the same ids, varied lengths
    assert 4 * (10 + 4) <= tokens.pop() <= 4 * (22 + 4)
    report = format_learner_report(result)
    assert "| fp32:16 |" in report and "fp32:16 / fp32:64:" in report


def test_bench_learner_times_the_ways_of_rescoring() -> None:
    variants = ["fp32:64:before", "fp32:64:fused", "fp32:64"]
    result = bench_learner(
        model="tiny", samples=4, prompt_len=16, response_len=4, repeats=1, kl_coef=0.0,
        variants=variants,
    )  # fmt: skip
    assert list(result["ratios"]) == ["fp32:64:fused/fp32:64:before", "fp32:64/fp32:64:before"]
    for entry in result["dtypes"].values():
        # Every way starts from the sampling weights' own log-probs: ratio 1.
        assert abs(entry["approx_kl"]) < 1e-6 and entry["clip_frac"] == 0.0


def test_bench_learner_rejects_bad_settings() -> None:
    with pytest.raises(ValueError, match="learner setting 'fp16'"):
        bench_learner(model="tiny", dtypes=("fp16",))
    with pytest.raises(ValueError, match="learner setting 'fp32:many'"):
        bench_learner(model="tiny", variants=["fp32:many"])
    with pytest.raises(ValueError, match="learner setting 'fp32:16:1'"):
        bench_learner(model="tiny", variants=["fp32:16:1"])
    with pytest.raises(ValueError, match="RESCORE among"):
        bench_learner(model="tiny", variants=["fp32:16:fused:x"])
    with pytest.raises(ValueError, match="distinct"):
        bench_learner(model="tiny", variants=["fp32", "fp32"])
    with pytest.raises(ValueError, match="samples must be >= 1"):
        bench_learner(model="tiny", samples=0)
