"""How often does the main job's first update push SmolLM2 toward passing?

A card-blind policy moves every card together along one direction: the logit of BET
against PASS. For a batch of untrained rollouts, the policy gradient's component along
that direction is, over the play turns, the sum of advantage x (1[BET] - P(BET)), with
P(BET) read from the turn's log-prob at the choice. A negative sum pushes every card
toward passing (and folding), the line on which a run ends at -0.433.

Usage (from the repository root; RECORDS from `mage rollout` with the main config):

    .venv/bin/mage rollout --config configs/kuhn_smollm2.yaml \
        --set rollout.tasks=160 --set rollout.seed=7 --out big.jsonl
    .venv/bin/python studies/kuhn_smollm2/results/first_push/first_push.py big.jsonl

Batches of 4, 6, 8 and 16 tasks (4 rollouts each, as in the config) are drawn 400
times from the recorded tasks; the share of batches whose push is toward PASS is
printed for the config's omega and for omega 4.
"""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
from collections import OrderedDict

from mage_rl.config import TrainConfig, load_config
from mage_rl.envs.parsing import extract_action
from mage_rl.records import MetaEpisodeRecord
from mage_rl.rl.advantages import compute_advantages

cfg = load_config("configs/kuhn_smollm2.yaml", [], TrainConfig)


def push(records: list[MetaEpisodeRecord], omega: float) -> float:
    """The batch's policy-gradient component along the BET-vs-PASS logit."""
    adv_cfg = cfg.advantages.model_copy(update={"omega": omega})
    total = 0.0
    for record, advantages in zip(
        records, compute_advantages(records, cfg.returns, adv_cfg), strict=True
    ):
        for turn, a in zip(record.turns, advantages, strict=True):
            action = extract_action(turn.text)
            choice = [
                lp
                for lp, allowed in zip(turn.logprobs, turn.allowed or [], strict=False)
                if len(allowed) > 1
            ]
            if turn.kind != "play" or not choice or action not in ("BET", "PASS"):
                continue
            p = math.exp(choice[0])
            p_bet = p if action == "BET" else 1.0 - p
            total += a * ((action == "BET") - p_bet)
    return total


def main(path: str) -> None:
    tasks: OrderedDict[str, list[MetaEpisodeRecord]] = OrderedDict()
    with open(path) as lines:
        for line in lines:
            record = MetaEpisodeRecord.from_dict(json.loads(line))
            tasks.setdefault(record.uid, []).append(record)
    groups = list(tasks.values())
    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    print(
        f"{len(groups)} tasks, {sum(map(len, groups))} meta-episodes from {path}; commit {commit}"
    )
    for omega in (cfg.advantages.omega, 4.0):
        for size in (4, 6, 8, 16):
            rng = random.Random(0)
            toward_pass = sum(
                push([r for g in rng.sample(groups, size) for r in g], omega) < 0
                for _ in range(400)
            )
            print(
                f"omega {omega:g}, {size} tasks ({size * 4} meta-episodes) per batch: "
                f"P(push toward PASS) = {toward_pass / 400:.3f}"
            )


if __name__ == "__main__":
    main(sys.argv[1])
