"""A league: snapshots of the policy join the opponents it trains against (``league:``).

Every ``league.every`` iterations the model of the checkpoint just saved is copied to
``RUN/league/checkpoints/iter_NNNNNN/model`` (beside a copy of the run's ``config.yaml``,
so the folder reads as a run) and joins the league as the opponent
``GAME:llm:RUN/league/checkpoints/iter_NNNNNN/model``: a frozen language-model opponent
(:mod:`mage_rl.players.seat_player`) that plays as the run's agent plays its first episode. Each training batch then draws its opponents from the
config's population with weight ``1 - league.share`` and from the league with weight
``league.share``, split among the members:

- ``uniform``: equally;
- ``prioritized``: in proportion to ``(1 - w)^2``, where ``w`` is the agent's win rate in
  the last episode of its meta-episodes against that member in the latest batch that
  drew it (0.5 before any), so the snapshots the agent still loses to are drawn more
  (AlphaStar's prioritized fictitious self-play, its "hard" weighting); a floor of 0.05
  keeps every member in play.

Beyond ``league.size`` members the oldest leaves (its folder is deleted). The league is
``RUN/league.json``, written after each change; ``--resume`` reads it back and drops the
members added after the checkpoint it resumes from. Evaluation keeps the config's
population, so its figures compare with runs without a league.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from mage_rl.fileio import atomic_write_json, writing
from mage_rl.sections import LeagueSection
from mage_rl.train_folder import checkpoint_name

LEAGUE_FILE = "league.json"
FLOOR = 0.05


@dataclass
class Member:
    """One snapshot: the iteration it was taken at, its model folder, the last win rate."""

    iteration: int
    path: str
    win_rate: float | None = None


class League:
    """The league of one run (see the module notes).

    Args:
        run_dir: The run folder.
        game: The environment name (the opponents' spec prefix).
        settings: The config's ``league`` section.
        start_iteration: The iteration the run starts from; members added later are
            dropped (a resumed run plays those iterations again).
    """

    def __init__(self, run_dir: Path, game: str, settings: LeagueSection, start_iteration: int):
        self.run_dir = Path(run_dir)
        self.game = game
        self.settings = settings
        self.members: list[Member] = []
        path = self.run_dir / LEAGUE_FILE
        if path.exists():
            saved = json.loads(path.read_text())["members"]
            self.members = [
                Member(**m)
                for m in saved
                if m["iteration"] <= start_iteration and Path(m["path"]).is_dir()
            ]

    def spec(self, member: Member) -> str:
        return f"{self.game}:llm:{member.path}"

    def weights(self) -> list[float]:
        """Each member's share of the league's draws (summing to 1)."""
        if self.settings.weighting == "uniform":
            raw = [1.0] * len(self.members)
        else:
            raw = [max(FLOOR, (1 - (0.5 if m.win_rate is None else m.win_rate)) ** 2)
                   for m in self.members]  # fmt: skip
        total = sum(raw)
        return [w / total for w in raw]

    def population(self, base: Any) -> str:
        """The batch population: ``base`` (a :class:`~mage_rl.envs.Population`) at
        ``1 - share``, the members at ``share``; ``base`` alone while the league is empty."""
        items = list(zip(base.specs, base.weights, strict=True))
        if self.members:
            share = self.settings.share
            items = [(s, w * (1 - share)) for s, w in items]
            items += [
                (self.spec(m), share * w) for m, w in zip(self.members, self.weights(), strict=True)
            ]
        return ",".join(f"{spec}={weight:.12g}" for spec, weight in items)

    def record(self, records: list[Any]) -> None:
        """Each member's win rate in the last episode of the batch's meta-episodes."""
        for member in self.members:
            ends = [r.episodes[-1].outcome == "won" for r in records
                    if r.opponent == self.spec(member) and r.episodes]  # fmt: skip
            if ends:
                member.win_rate = sum(ends) / len(ends)

    def add(self, iteration: int, model_dir: Path) -> Member:
        """Copy ``model_dir`` into the league as the snapshot of ``iteration``.

        The league folder is laid out as a run (``league/config.yaml``, the run's own, and
        ``league/checkpoints/iter_N/model``), so a member plays with the run's prompts,
        layout and decoding (:func:`~mage_rl.players.play_settings.trained_config`).
        """
        root = self.run_dir / "league"
        target = root / "checkpoints" / checkpoint_name(iteration) / "model"
        with writing(root):
            root.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(self.run_dir / "config.yaml", root / "config.yaml")
            if target.exists():
                shutil.rmtree(target)
            shutil.copytree(model_dir, target)
        member = Member(iteration, str(target.resolve()))
        self.members.append(member)
        while len(self.members) > self.settings.size:
            gone = self.members.pop(0)
            shutil.rmtree(Path(gone.path).parent, ignore_errors=True)  # checkpoints/iter_N
        self.save()
        return member

    def save(self) -> None:
        path = self.run_dir / LEAGUE_FILE
        with writing(path):
            atomic_write_json(path, {"members": [asdict(m) for m in self.members]})
