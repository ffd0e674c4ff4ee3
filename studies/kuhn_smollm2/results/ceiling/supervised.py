"""Supervised ceiling: how many Adam steps does SmolLM2 need to play the best fixed
strategy in the main job's conversation when every decision is given its right answer?

The meta-episodes of a rollout file (the untrained model's chats, the main job's config)
are the inputs; at every branch point of every play answer the target is the best fixed
strategy's answer for that state (``strategies.py``). Training is plain cross-entropy over
the allowed tokens (the constrained softmax, as the learner scores it), Adam, mini-batches
of whole meta-episodes, no sampling and no noise: an upper bound on what a policy-gradient
update from the same meta-episodes could do per step. The first 192 meta-episodes train,
the rest are held out; every 10 steps it prints the held-out P(best answer) by hand, and
the last hand's by state (seat 0/1, betting, card). Models are saved at steps 20, 40 and
the last, for ``evaluate.py``.

usage: python supervised.py ROLLOUT.jsonl[.gz] OUTDIR [lr] [steps] [mini_batch]
"""

from __future__ import annotations

import gzip
import json
import random
import sys
from collections import defaultdict
from pathlib import Path

import torch

from mage_rl.envs.opponents import POPULATION_PRESETS
from mage_rl.policy.models import load_model
from mage_rl.records import MetaEpisodeRecord

sys.path.insert(0, str(Path(__file__).parent))
from strategies import answer_values  # noqa: E402

CARDS = {"J": "0", "Q": "1", "K": "2"}


def best_fixed_actions() -> dict[tuple[int, str], str]:
    """(seat, info state) -> 'BET' or 'PASS' of the best fixed strategy against
    ``kuhn_train`` (the answer values of ``strategies.py``; a tie is PASS)."""
    values = answer_values(POPULATION_PRESETS["kuhn_train"])
    return {
        (seat, f"{card}{history}"): "BET" if bet > pas else "PASS"
        for (seat, history, card), (bet, pas, _) in values.items()
    }


def info_key(anchor: str) -> tuple[int, str, str]:
    lines = anchor.split("\n")
    card = lines[0].split(":")[1].strip().rstrip(".")
    bets = lines[1].split(":", 1)[1].strip().rstrip(".")
    seat, hist = {"none": (0, ""), "you PASS, opponent BET": (0, "pb"),
                  "opponent PASS": (1, "p"), "opponent BET": (1, "b")}[bets]  # fmt: skip
    return seat, CARDS[card] + hist, card


def examples(records, tok, best):
    """Per meta-episode: its full token sequence and its branch points with their targets."""
    out = []
    for rec in records:
        last = rec.turns[-1]
        seq = list(last.prompt_ids) + list(last.response_ids)
        points = []
        for turn in rec.turns:
            if turn.kind != "play" or not turn.allowed:
                continue
            for j, ids in enumerate(turn.allowed):
                if len(ids) < 2:
                    continue
                pos = len(turn.prompt_ids) + j  # logits at pos-1 predict token at pos
                names = [tok.decode([i]).strip() for i in ids]
                seat, key, card = info_key(turn.anchor)
                want = best[(seat, key)]
                target = [k for k, n in enumerate(names) if want.startswith(n)]
                assert len(target) == 1, (names, want)
                points.append((pos - 1, list(ids), target[0], turn.episode, seat, key[1:], card))
        out.append((seq, points))
    return out


def batch_loss(model, batch, stats=None):
    """Mean cross-entropy toward the targets; fills ``stats`` with P(target) by state."""
    seqs = [s for s, _ in batch]
    width = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    att = torch.zeros(len(seqs), width, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
        att[i, : len(s)] = 1
    logits = model(input_ids=ids, attention_mask=att).logits
    total, n = 0.0, 0
    for i, (_, points) in enumerate(batch):
        for pos, allowed, target, episode, seat, hist, card in points:
            sub = logits[i, pos, allowed].float()
            logp = torch.log_softmax(sub, -1)
            total = total - logp[target]
            n += 1
            if stats is not None:
                stats[(episode, seat, hist, card)].append(logp[target].exp().item())
    return total / max(n, 1)


def main() -> None:
    path, outdir = sys.argv[1], sys.argv[2]
    lr = float(sys.argv[3]) if len(sys.argv) > 3 else 3e-5
    steps = int(sys.argv[4]) if len(sys.argv) > 4 else 60
    mb = int(sys.argv[5]) if len(sys.argv) > 5 else 8
    torch.manual_seed(0)
    random.seed(0)
    best = best_fixed_actions()
    print("best fixed:", json.dumps({f"{s}:{k}": a for (s, k), a in sorted(best.items())}))
    model, tok = load_model("smollm2", dtype="fp32")
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        records = [MetaEpisodeRecord.from_json(line) for line in f]
    data = examples(records, tok, best)
    train, held = data[:192], data[192:]
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=lr)

    def report(step):
        stats = defaultdict(list)
        model.eval()
        with torch.no_grad():
            for i in range(0, len(held), 8):
                batch_loss(model, held[i : i + 8], stats)
        model.train()
        by_hand = defaultdict(list)
        for (episode, *_), v in stats.items():
            by_hand[episode].extend(v)
        line = " ".join(f"hand{e + 1} {sum(v) / len(v):.2f}" for e, v in sorted(by_hand.items()))
        per_state = defaultdict(list)
        for (episode, seat, hist, card), v in stats.items():
            if episode == 2:
                per_state[(seat, hist or "-", card)].extend(v)
        detail = " ".join(
            f"{s}{h}{c}:{sum(v) / len(v):.2f}" for (s, h, c), v in sorted(per_state.items())
        )
        print(f"step {step}: P(best answer) held-out {line} | hand3 {detail}", flush=True)

    report(0)
    order = []
    for step in range(1, steps + 1):
        if not order:
            order = list(range(len(train)))
            random.shuffle(order)
        batch = [train[order.pop()] for _ in range(min(mb, len(order)))]
        loss = batch_loss(model, batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 10 == 0:
            report(step)
        if step in (20, 40) or step == steps:
            model.save_pretrained(f"{outdir}/step{step}")
            tok.save_pretrained(f"{outdir}/step{step}")


if __name__ == "__main__":
    main()
