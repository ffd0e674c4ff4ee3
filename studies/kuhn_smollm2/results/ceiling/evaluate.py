"""Evaluate a model directory exactly as the main job evaluates its trained model: the
config's 144 stratified tasks, conversation layout, constrained answers, one rollout each.

Prints ev by hand with stratified 95 % intervals (as the main job's report), the last
hand by seat, and P(BET) by decision state in hands 1-2 and in hand 3.
The evaluation files land in RUN_DIR/eval/

usage: python evaluate.py MODEL_DIR RUN_DIR
"""

from __future__ import annotations

import sys
from collections import Counter, defaultdict
from pathlib import Path

from mage_rl.config import TrainConfig, load_config
from mage_rl.records import MetaEpisodeRecord
from mage_rl.rl.trainer import Trainer

sys.path.insert(0, str(Path(__file__).parent))
from supervised import info_key  # noqa: E402

CONFIG = Path(__file__).parents[4] / "configs" / "kuhn_smollm2.yaml"


def main(model: str, run_dir: str) -> None:
    overrides = [f"policy.model={model}", "eval.before=false", "eval.baselines=[]"]
    cfg = load_config(CONFIG, overrides, TrainConfig)
    summary = Trainer(cfg, run_dir, progress=False).evaluate(0)
    # The stratified estimates, as the main job's report gives them.
    block = summary["stratified"]
    for k, est in enumerate(block["ev@k"], start=1):
        print(f"ev@{k} {est['mean']:+.3f} [{est['low']:+.3f}, {est['high']:+.3f}]")
    for seat, part in block["by_seat"].items():
        est = part["ev@k"][-1]
        print(
            f"  last hand, {seat} seat: {est['mean']:+.3f} [{est['low']:+.3f}, {est['high']:+.3f}]"
        )
    counts: dict[tuple, Counter] = defaultdict(Counter)
    path = Path(run_dir) / "eval" / "iter_000000.jsonl"
    for line in path.read_text().splitlines():
        for turn in MetaEpisodeRecord.from_json(line).turns:
            if turn.kind == "play":
                seat, key, card = info_key(turn.anchor)
                hands = "hand 3" if turn.episode == 2 else "hands 1-2"
                counts[(hands, seat, key[1:] or "-", card)]["BET" in turn.text] += 1
    print("P(BET) by (hands, seat, betting, card), n answers:")
    for key in sorted(counts):
        n = sum(counts[key].values())
        print(f"  {key}: {counts[key][True] / n:.2f} (n={n})")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
