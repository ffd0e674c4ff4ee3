"""The study's commands: the flags ``mage bench adaptation`` and ``identification`` had,
``--threads`` checked, and ``mage bench`` without them."""

from __future__ import annotations

import pytest
import torch

from mage_rl.cli import main
from studies.adaptation.cli import (
    adaptation_main,
    adaptation_parser,
    identification_main,
    identification_parser,
)

PARSERS = {"adaptation": adaptation_parser, "identification": identification_parser}
MAINS = {"adaptation": adaptation_main, "identification": identification_main}

# Every flag of the `mage bench` sub-commands these replace, with its default.
DEFAULTS = {
    "adaptation": dict(
        config=None, set=[], threads=None, methods="all", seats="first,second", seeds="0",
        iterations=60, minutes=None, pretrain=False, pretrain_batches=None,
        pretrain_epochs=None, eval_every=10, eval_average=0.0, model=None, layout=None,
        out="runs/adaptation/adaptation.json", runs_dir=None, fresh=False,
    ),
    "identification": dict(
        config=None, set=[], model=None, seed=0, json=None, threads=None, batches=20, epochs=3,
    ),
}  # fmt: skip


@pytest.fixture(autouse=True)
def restore_torch_threads():
    """``--threads`` holds for the rest of the process; the other tests get theirs back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("what", DEFAULTS)
def test_each_study_keeps_its_flags_and_defaults(what: str) -> None:
    assert vars(PARSERS[what]().parse_args([])) == DEFAULTS[what]


@pytest.mark.parametrize(
    ("what", "argv", "flag"),
    [
        ("adaptation", ["--clients", "1,4"], "--clients"),
        ("adaptation", ["--json", "x.json"], "--json"),
        ("identification", ["--methods", "mage"], "--methods"),
    ],
)
def test_a_flag_the_other_study_reads_is_an_error(what, argv, flag, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        MAINS[what](argv)
    assert exit_info.value.code == 2
    assert f"error: unrecognized arguments: {flag}" in capsys.readouterr().err


@pytest.mark.parametrize("what", DEFAULTS)
def test_threads_below_one_are_refused(what: str, tmp_path, capsys) -> None:
    out = tmp_path / "never.json"
    target = ["--out", str(out)] if what == "adaptation" else ["--json", str(out)]
    assert MAINS[what](["--threads", "0", *target]) == 2
    assert "error: --threads 0: give a thread count >= 1" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("what", DEFAULTS)
def test_mage_bench_no_longer_has_the_studies(what: str, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", what])
    assert exit_info.value.code == 2
    assert f"invalid choice: '{what}'" in capsys.readouterr().err
