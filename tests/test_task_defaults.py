"""A config without a ``returns:`` section trains with its task's constants (SPEC §3-4)."""

from __future__ import annotations

import pytest

from mage_rl.config import TrainConfig, load_config


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ([], (2.0, 2.0, 0.6)),  # Kuhn Poker: c_inv 2.0
        (["env.name=ttt", "env.population=ttt_train"], (0.5, 2.0, 0.6)),
        (
            ["env.name=sokoban", "env.population=sokoban_train", "env.seat=first"],
            (0.5, 1.0, 0.9),  # Sokoban: c_len 1.0, gamma_traj 0.9
        ),
    ],
)
def test_returns_default_to_the_tasks_constants(overrides: list[str], expected: tuple) -> None:
    cfg = load_config(None, overrides, cls=TrainConfig)
    got = (cfg.returns.invalid_penalty, cfg.returns.length_penalty, cfg.returns.gamma_traj)
    assert got == expected


def test_explicit_returns_win_over_the_tasks_constants() -> None:
    cfg = load_config(None, ["returns.invalid_penalty=0.25", "returns.gamma_traj=0.5"],
                      cls=TrainConfig)  # fmt: skip
    assert (cfg.returns.invalid_penalty, cfg.returns.gamma_traj) == (0.25, 0.5)
    assert cfg.returns.length_penalty == 2.0  # the one left out still comes from Kuhn
