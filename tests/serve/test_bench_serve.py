"""``mage bench serve`` runs end to end on the tiny model; only the result's shape is
checked (timings are measurements, not assertions)."""

from __future__ import annotations

import math

import pytest

from mage_rl.bench.serve import bench_prompt, bench_serve, format_serve_report
from mage_rl.cli import build_parser


def test_bench_serve_reports_each_client_count_and_the_ratio() -> None:
    answered: list[int] = []
    result = bench_serve(model="tiny", clients=(1, 3), requests=6, max_tokens=4, dtype="fp32", rounds=2,
                         on_request=answered.append, long_tokens=400, delay_s=0.2)  # fmt: skip
    assert result["config"]["clients"] == [1, 3] and result["config"]["max_batch_size"] == 3
    assert answered.count(1) == answered.count(3) == 2 * 6  # two rounds
    levels = result["levels"]
    assert list(levels) == [1, 3]
    for count, level in levels.items():
        assert level["clients"] == count and level["requests"] == 6
        assert len(level["round_wall_s"]) == 2 and level["wall_s"] == min(level["round_wall_s"])
        assert 6 <= level["completion_tokens"] <= 6 * 4
        assert level["batches"] >= 1 and 1.0 <= level["mean_batch"] <= count
        assert level["latency_p50_s"] <= level["latency_p95_s"]
        for key in ("wall_s", "requests_per_s", "tokens_per_s", "latency_mean_s", "cpu_cores"):
            assert math.isfinite(level[key]) and level[key] > 0
    assert levels[1]["mean_batch"] == 1.0
    # Same prompts and seeds at both counts: the same responses, up to rare last-bit flips.
    assert abs(levels[1]["completion_tokens"] - levels[3]["completion_tokens"]) <= 4
    assert set(result["ratios"]) == {"requests_per_s", "tokens_per_s"}
    head = result["head_of_line"]
    assert head["short_tokens"] == 16 and head["long_tokens"] == 400  # ignore_eos: exact
    # The short request joined the running loop: answered while the long one decoded.
    assert head["long_still_running"] and head["long_tokens_before"] > 0
    assert 0 < head["short_latency_s"] < 5
    report = format_serve_report(result)
    assert "| 1 |" in report and "| 3 |" in report and "3 clients / 1 client(s)" in report
    assert "Head of line: a 16-token request" in report


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"clients": ()}, "clients="), ({"clients": (0,)}, "clients="), ({"clients": (2, 2)}, "clients="),
     ({"requests": 0}, "requests"), ({"max_tokens": 0}, "max_tokens"), ({"rounds": 0}, "rounds"), ({"threads": 0}, "threads"),
     ({"long_tokens": -1}, "long_tokens"), ({"short_tokens": 0}, "short_tokens")],
)  # fmt: skip
def test_bench_serve_rejects_bad_settings(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        bench_serve(model="tiny", **kwargs)


def test_bench_prompts_vary_and_the_command_is_registered() -> None:
    assert len({bench_prompt(i)[1]["content"] for i in range(12)}) == 12
    args = build_parser().parse_args(["bench", "serve", "--clients", "1,8", "--requests", "4"])
    assert (args.what, args.clients, args.requests, args.max_tokens) == ("serve", "1,8", 4, 32)
