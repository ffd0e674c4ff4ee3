"""Print the branch-point table a run ended with, by decision state and opponent.

The table in ``trainer_state.json`` is keyed by hashed anchor ids; this names them by
matching every play turn of the run's final evaluation (``eval/iter_NNNNNN.jsonl``)
against the same hash. Each cell is ``estimate (weight)`` in reward units.

usage: python tables.py RUN_DIR [ITERATION]   (default: the last checkpoint)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from transformers import AutoTokenizer

from mage_rl.records import anchor_id


def main(run: Path, iteration: str | None = None) -> None:
    checkpoints = sorted((run / "checkpoints").glob("iter_*"))
    point = run / "checkpoints" / f"iter_{iteration}" if iteration else checkpoints[-1]
    state = json.loads((point / "trainer_state.json").read_text())
    entries = state["branch_values"]["entries"]
    tok = AutoTokenizer.from_pretrained(point / "model")
    names: dict[str, tuple[str, str]] = {}
    for line in (run / "eval" / f"{point.name}.jsonl").read_text().splitlines():
        record = json.loads(line)
        for turn in record["turns"]:
            if turn["kind"] != "play":
                continue
            opponent = turn.get("opponent") or record["opponent"]
            key = anchor_id("", turn["anchor"], opponent, None, turn.get("node", ""))
            text = " ".join(turn["anchor"].split()).split(" Legal actions")[0]
            names[key] = (text, opponent.split(":")[-1])
    rows: dict[tuple[str, str], dict[str, str]] = {}
    for key, (total, weight) in entries.items():
        anchor, _, token = key.split("|")
        if anchor not in names:
            continue  # a state the evaluation did not visit
        answer = tok.decode([int(token)]).strip()
        rows.setdefault(names[anchor], {})[answer] = f"{total / weight:+6.2f} ({weight:5.2f})"
    print(f"{run.name}, {point.name}: estimate (weight) of the token where the answers part")
    for (text, opponent), cells in sorted(rows.items()):
        shown = "  ".join(f"{a}: {v}" for a, v in sorted(cells.items()))
        print(f"{text:62s} {opponent:13s} {shown}")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else None)
