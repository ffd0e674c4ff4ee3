"""Can an update move SmolLM2's choice at J apart from its choice at K?  Two measurements
on the first hand of the main job's compact prompt, with and without the answer lead.

1. Gradient overlap: for each decision point, the gradient of the BET-vs-PASS logit at
   J, Q and K; printed is |g_K - g_J| / |mean g|, the part of an update that can tell
   the cards apart, relative to the part that moves all three together.
2. Exact-gradient bandit: Adam (the main job's lr, 3e-5) on the 12 decision states,
   maximising sum_s n_s [P(BET|s) A_BET(s) + P(PASS|s) A_PASS(s)] with the mean
   advantages A measured on 640 untrained meta-episodes (TABLE below, from
   `mage rollout --config configs/kuhn_smollm2.yaml --set rollout.tasks=160
   --set rollout.seed=7 --set policy.answer_lead=true`). No sampling noise: this is the
   expected update, so it shows whether the model can separate the cards at all.

usage: python separation.py   (about 5 minutes on 2 cores)
"""

from __future__ import annotations

import platform
import subprocess

import torch
import transformers

from mage_rl.policy.models import load_model

POINTS = {  # decision point -> (seat, bets as the compact prompt writes them)
    "P1 opens": ("P1", "none"),
    "P1 faces a bet": ("P1", "you PASS, opp BET"),
    "P2 after a pass": ("P2", "opp PASS"),
    "P2 faces a bet": ("P2", "opp BET"),
}
# n, mean advantage of BET, of PASS, per decision point and card (main job's advantages).
TABLE = {
    "P1 opens": {"J": (432, -2.675, -1.693), "Q": (236, -3.440, 0.760), "K": (376, 7.696, 2.916)},
    "P1 faces a bet": {"J": (202, -9.383, -1.456), "Q": (108, -9.934, -2.176), "K": (112, 14.797, -0.768)},
    "P2 after a pass": {"J": (48, 10.383, -5.544), "Q": (84, 4.957, 6.477), "K": (108, 8.205, 7.509)},
    "P2 faces a bet": {"J": (252, -9.227, 1.250), "Q": (224, -3.996, -2.173), "K": (160, 12.584, -5.878)},
}  # fmt: skip
FORMATS = {"without the lead": "<action>", "with the lead": "{card} <action>"}


def prompt_ids(tok, point: str, card: str, prefix: str) -> list[int]:
    seat, bets = POINTS[point]
    messages = [
        {"role": "system", "content": f"Kuhn poker as {seat}"},
        {"role": "user", "content": f"Now E1/3: card {card}, bets: {bets}"},
    ]
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tok.encode(text + prefix.format(card=card), add_special_tokens=False)


def main() -> None:
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    print(f"commit {commit.strip()}, torch {torch.__version__}, transformers "
          f"{transformers.__version__}, {platform.processor() or platform.machine()}, "
          f"torch threads {torch.get_num_threads()}; fp32")  # fmt: skip
    model, tok = load_model("smollm2", dtype="fp32")
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    bet = tok.encode("BET", add_special_tokens=False)[0]
    pas = tok.encode("PASS", add_special_tokens=False)[0]
    params = [p for p in model.parameters() if p.requires_grad]

    def logit_gap(ids: list[int]) -> torch.Tensor:
        logits = model(torch.tensor([ids])).logits[0, -1].float()
        return logits[bet] - logits[pas]

    for name, prefix in FORMATS.items():
        model.load_state_dict(initial)
        print(f"\n== {name}: the answer starts {prefix.format(card='K')!r}")
        print("gradient overlap, |g_K - g_J| / |mean g| by decision point:")
        for point in POINTS:
            grads = {}
            for card in "JQK":
                model.zero_grad()
                logit_gap(prompt_ids(tok, point, card, prefix)).backward()
                grads[card] = torch.cat([p.grad.flatten() for p in params]).clone()
            mean = (grads["J"] + grads["Q"] + grads["K"]) / 3
            ratio = (grads["K"] - grads["J"]).norm().item() / mean.norm().item()
            print(f"  {point:16s} {ratio:.3f}")
        states = [(p, c, prompt_ids(tok, p, c, prefix), TABLE[p][c]) for p in POINTS for c in "JQK"]
        total = sum(v[0] for *_, v in states)
        optimizer = torch.optim.Adam(model.parameters(), lr=3e-5)
        print("exact-gradient bandit, P(BET) by decision point and card after each Adam step:")
        for step in range(9):
            if step:
                optimizer.zero_grad()
                for _, _, ids, (n, a_bet, a_pass) in states:
                    p_bet = torch.sigmoid(logit_gap(ids))
                    (-(n / total) * (p_bet * a_bet + (1 - p_bet) * a_pass)).backward()
                optimizer.step()
            with torch.no_grad():
                probs = {(p, c): torch.sigmoid(logit_gap(ids)).item() for p, c, ids, _ in states}
            row = " | ".join(
                f"{p}: " + " ".join(f"{c} {probs[(p, c)]:.2f}" for c in "JQK") for p in POINTS
            )
            print(f"  step {step}: {row}")


if __name__ == "__main__":
    main()
