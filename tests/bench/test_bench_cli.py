"""``mage bench``: one parser per benchmark, ``--threads`` honoured and recorded."""

from __future__ import annotations

import argparse
import json

import pytest
import torch

from mage_rl.bench.cli import BENCHMARKS
from mage_rl.cli import build_parser, main


@pytest.fixture(autouse=True)
def restore_torch_threads():
    """``--threads`` holds for the rest of the process; the other tests get theirs back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def bench_args(argv: list[str]) -> argparse.Namespace:
    return build_parser().parse_args(["bench", *argv])


# Every flag of the single `mage bench` parser this replaced, with its default, now on
# the benchmarks that read it.
DEFAULTS = {
    "rollout": dict(
        model="smollm2", seed=0, json=None, threads=None, meta_episodes=16,
        env="kuhn_poker", episodes=3, max_tokens=32, dtype="auto", rounds=1,
    ),
    "learner": dict(
        model="smollm2", seed=0, json=None, threads=None, samples=16, prompt_len=300,
        response_len=40, repeats=2, prompt_spread=0, kl_coef=0.1, variants=None,
    ),
    "serve": dict(
        model="smollm2", seed=0, json=None, threads=None, clients="1,16", requests=32,
        max_tokens=32, dtype="auto", rounds=1, long_tokens=3000, short_tokens=16, delay=1.0,
        prefix_cache_mb=1024, prefill_tokens=512,
    ),
    "reuse": dict(
        model="smollm2", seed=0, json=None, threads=None, meta_episodes=16,
        env="kuhn_poker", episodes=3, max_tokens=32, dtype="auto", rounds=1,
        layout="conversation",
    ),
    "layouts": dict(
        model="smollm2", seed=0, env="kuhn_poker", prompt="compact", constrain=True,
        meta_episodes=8, episodes=3, max_tokens=32, dtype="auto", repeats=1, threads=None,
        json=None,
    ),
    "textenvs": dict(variant=[], episodes=5, seed=0, json=None, threads=None),
    "vllm": dict(
        model="smollm2", seed=0, json=None, threads=None, meta_episodes=16, episodes=3,
        max_tokens=48, dtype="auto", engines="vllm,local",
    ),
    "hardware": dict(
        model="smollm2", seed=0, json=None, threads=None, device=None, dtype="auto",
        samples=16, prompt_len=300, response_len=40, kl_coef=0.1, micro_batch_tokens=8192,
        repeats=2, batch_sizes="1,16,64", decode_tokens=32, rounds=1, matmul_size=0,
        copy_mib=0, gradient_checkpointing="auto", tokenizer=None, profile=False,
        static_decode=None,
    ),
    "learning": dict(
        config="configs/rps_smollm2.yaml", probes="all", seeds="0", iterations=None,
        out="runs/learning", no_progress=False, diagnose=False, checkpoint=None,
        population=None, set=[], threads=None,
    ),
    "learner-batch": dict(
        config="configs/x.yaml", set=[], batches=1, repeats=2, json=None, threads=None
    ),
    "memory": dict(
        config="configs/x.yaml", set=[], iterations=4, release=True, tree_pad=None, json=None,
        threads=None,
    ),
    "view": dict(run="runs/x", meta_episodes=10_000, rounds=3, json=None, threads=None),
    "sampling": dict(batches="1,16,64", vocab=49152, repeats=10, seed=0, json=None, threads=None),
}  # fmt: skip
REQUIRED = {
    "view": ["runs/x"],
    "learner-batch": ["configs/x.yaml"],
    "memory": ["configs/x.yaml"],
}  # positional arguments a benchmark cannot do without


@pytest.mark.parametrize("what", BENCHMARKS)
def test_each_benchmark_keeps_its_flags_and_defaults(what: str) -> None:
    args = vars(bench_args([what, *REQUIRED.get(what, [])]))
    top = ("command", "verbose", "plugin", "what", "func")  # the top-level parser's own
    own = {k: v for k, v in args.items() if k not in top}
    assert own == DEFAULTS[what]


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["learner", "--clients", "1,4"], "--clients"),
        (["rollout", "--samples", "4"], "--samples"),
        (["serve", "--iterations", "3"], "--iterations"),
        (["learning", "--json", "x.json"], "--json"),
    ],
)
def test_a_flag_another_benchmark_reads_is_an_error(argv, flag, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        bench_args(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"mage bench {argv[0]}: error: unrecognized arguments: {flag}" in err


def test_learner_json_records_threads(tmp_path) -> None:
    out = tmp_path / "learner.json"
    argv = ["bench", "learner", "--model", "tiny", "--samples", "2", "--prompt-len", "8"]
    argv += ["--response-len", "4", "--repeats", "1", "--threads", "1", "--json", str(out)]
    assert main(argv) == 0
    doc = json.loads(out.read_text())
    assert doc["config"]["torch_threads"] == 1
    assert doc["provenance"]["torch_threads"] == 1
    assert doc["provenance"]["threads_requested"] == 1


def test_threads_below_one_are_refused(tmp_path, capsys) -> None:
    out = tmp_path / "never.json"
    assert main(["bench", "learner", "--threads", "0", "--json", str(out)]) == 2
    assert "--threads 0: give a thread count >= 1" in capsys.readouterr().out
    assert not out.exists()


THROUGHPUT = ("rollout", "reuse", "layouts", "learner", "serve", "textenvs", "vllm")


@pytest.mark.parametrize("what", THROUGHPUT)
def test_each_throughput_command_calls_its_benchmark_with_its_own_keywords(
    what: str, monkeypatch, capsys
) -> None:
    """The command hands ``bench_<what>`` keywords its signature takes, none missing."""
    import importlib
    import inspect

    module = importlib.import_module(f"mage_rl.bench.{what}")
    real = getattr(module, f"bench_{what}")
    seen: dict = {}

    def record(**settings):
        inspect.signature(real).bind(**settings)  # TypeError on a keyword it lacks
        seen.update(settings)
        return {"recorded": True}

    monkeypatch.setattr(module, f"bench_{what}", record)
    monkeypatch.setattr(module, f"format_{what}_report", lambda result: f"report {result}")
    assert main(["bench", what]) == 0
    assert "report {'recorded': True}" in capsys.readouterr().out
    required = {
        name
        for name, p in inspect.signature(real).parameters.items()
        if p.default is inspect.Parameter.empty and p.kind is p.KEYWORD_ONLY
    }
    assert required <= set(seen)
    if what == "serve":
        assert seen["clients"] == [1, 16] and seen["delay_s"] == 1.0
    if what == "textenvs":
        from mage_rl.bench.textenvs import DEFAULT_SPECS

        assert seen["specs"] == list(DEFAULT_SPECS)
    if what == "vllm":
        assert seen["engines"] == ["vllm", "local"]


def test_the_environment_choices_are_the_benchmarked_ones() -> None:
    from mage_rl.bench.rollout import POPULATIONS

    for what in ("rollout", "reuse", "layouts"):
        for env in POPULATIONS:
            assert bench_args([what, "--env", env]).env == env
        with pytest.raises(SystemExit):
            bench_args([what, "--env", "chess"])
