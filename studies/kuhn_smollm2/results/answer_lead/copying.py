"""How much the untrained SmolLM2's choice depends on the chat rather than the state.

For every play turn of a rollout file, the probability the model gave PASS (read from
the log-prob of its one free token), grouped by card, betting and hand; printed are the
10th, 50th and 90th percentiles. In hand 1 every turn at a state sees the same prompt, so
the three agree; in hands 2 and 3 the chat holds the model's earlier answers.

usage: python copying.py ROLLOUTS.jsonl
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections import defaultdict

from mage_rl.envs.parsing import extract_action
from mage_rl.records import MetaEpisodeRecord


def main(path: str) -> None:
    by_state: dict[tuple[str, str, int], list[float]] = defaultdict(list)
    with open(path) as f:
        records = [MetaEpisodeRecord.from_dict(json.loads(line)) for line in f]
    for record in records:
        for turn in record.turns:
            if turn.kind != "play":
                continue
            pairs = zip(turn.logprobs, turn.allowed, strict=True)
            p = math.exp(next(lp for lp, allowed in pairs if len(allowed) > 1))
            p_pass = p if extract_action(turn.text) == "PASS" else 1 - p
            card = re.findall(r"[Cc]ard:? ([JQK])", turn.anchor)[-1]
            bets = turn.anchor.split("Betting so far: ")[1].split(".")[0]
            by_state[(card, bets, turn.episode + 1)].append(p_pass)
    print(f"{len(records)} meta-episodes from {path}")
    print("card | betting | hand | turns | P(PASS) 10th / 50th / 90th percentile")
    for (card, bets, hand), values in sorted(by_state.items()):
        v, n = sorted(values), len(values)
        print(
            f"{card} | {bets} | {hand} | {n} | {v[n // 10]:.2f} / {v[n // 2]:.2f} / {v[9 * n // 10]:.2f}"
        )


if __name__ == "__main__":
    main(sys.argv[1])
