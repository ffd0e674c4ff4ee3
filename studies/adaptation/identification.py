"""Can the policy model learn to identify the opponent at all? A supervised upper bound.

The adaptation study asks RL to discover, from one reward per hand, that the last
hand should be played differently against the aggressive opponent. This study asks
the easier question first: given the *answer* as a label, how many labelled decisions
does the model need before its choice depends on the past hands?

1. The model plays meta-episodes of the config (Kuhn Poker, ``history`` context, agent
   first) at temperature 1 against the training population.
2. From the last hand, the two decisions whose best response depends on the opponent
   (SPEC §7, §9; agent first) are kept, each labelled with the best response to the
   *true* opponent:

   * holding J with no bet yet: PASS against the aggressive opponent (it calls with Q
     and K), BET against the others (they fold Q);
   * holding Q and facing a bet: call (BET) against the aggressive opponent (it bets
     J too), fold (PASS) against the others (they bet only with K).

3. The model is trained by cross-entropy on the two answer strings (the same restricted
   choice that constrained decoding gives RL) and its accuracy on held-out decisions is
   reported as training goes.

Two references bracket that accuracy, both computed exactly from what the agent saw
(:func:`~mage_rl.eval.bayes.observation_likelihood`, the population's prior):

* **without history**: the best accuracy from the current hand alone. The situation
  itself carries evidence (the aggressive opponent bets with J, so a bet to face is more
  often its), so this can be above the share of the majority label.
* **Bayes**: the best accuracy from the past hands and the current one, the expected
  accuracy of answering for the more probable of "aggressive" and "not aggressive".

The gap between the two is what reading the past hands can add. A model that stays at
the no-history accuracy with labels cannot be expected to learn the same mapping from
RL's far noisier signal in the same number of decisions.

How much noisier is measured on the same rollouts: they are scored by the config's
training targets (returns, GiGPO advantages) exactly as the trainer would, and each
labelled decision of every hand (the labels hold in any hand, the opponent being fixed)
has its advantage signed towards the label (``+A`` when
the sampled answer was the label, ``-A`` when it was the other). A label is a signal of
mean 1 and no spread; the signed advantage has a mean (its direction, positive when RL
pushes towards the label) and a spread, and their ratio (the signal-to-noise ratio per
decision) says roughly how many RL decisions are worth one labelled one (about
``1 / snr**2``).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
import torch.nn.functional as F

from mage_rl import load_config
from studies.adaptation import CONFIG

if TYPE_CHECKING:
    from mage_rl.config import TrainConfig
    from mage_rl.records import MetaEpisodeRecord

DEFAULT_CONFIG = CONFIG
ANSWERS = ("PASS", "BET")


def label(anchor: str, opponent: str) -> str | None:
    """The best response to the true opponent, for the two decisions that depend on it.

    ``anchor`` is the turn's observation text (Kuhn's standard rendering); ``None`` for
    decisions whose best response is the same against every training opponent.
    """
    aggressive = "aggressive" in opponent
    if "card: J" in anchor and "Betting so far: none" in anchor:
        return "PASS" if aggressive else "BET"
    if "card: Q" in anchor and "face a bet" in anchor:
        return "BET" if aggressive else "PASS"
    return None


class Decision(NamedTuple):
    """A labelled decision.

    Attributes:
        prompt_ids: The prompt the model saw.
        label: Index in :data:`ANSWERS` of the best response to the true opponent.
        opponent: The true opponent's spec.
        p_history: Posterior probability of the aggressive opponent given the past hands
            and the current hand so far.
        p_current: The same from the current hand alone.
        action: Index in :data:`ANSWERS` of the answer sampled in the rollout.
        advantage: The advantage training would give that answer (the config's
            returns and advantages over the rollout batch).
        episode: Index of the hand the decision was made in (0 for the first).
    """

    prompt_ids: list[int]
    label: int
    opponent: str
    p_history: float
    p_current: float
    action: int = 0
    advantage: float = 0.0
    episode: int = 0


def aggressive_posterior(
    cfg: TrainConfig, record: MetaEpisodeRecord, turn_index: int
) -> tuple[float, float]:
    """P(aggressive opponent) at ``record.turns[turn_index]``: with and without history.

    The record's hands are replayed in a fresh environment (the task seed fixes every
    deal) to recover what the agent saw of each: its card, the betting and any card
    shown. The prior is the config's population.
    """
    from mage_rl import runtime
    from mage_rl.envs import make_env
    from mage_rl.envs.base import episode_seed
    from mage_rl.envs.kuhn import BET, PASS, betting, card_of
    from mage_rl.envs.opponents import make_opponent
    from mage_rl.eval.bayes import observation_likelihood

    population = runtime.population(cfg)
    opponents = []
    for spec in population.specs:
        opponent = make_opponent(spec)
        opponent.reset(0)
        opponents.append(opponent)
    env = make_env(cfg.env.name, record.opponent, seat=record.seat)
    target = record.turns[turn_index]
    seen = []  # one observation per hand, the current one last
    for k in range(target.episode + 1):
        env.reset(episode_seed(record.seed, k, cfg.env.protocol))
        for i, turn in enumerate(record.turns):
            if turn.kind != "play" or turn.episode != k:
                continue
            if i == turn_index:
                break
            env.step(turn.text)
        state = env.state
        moves = tuple(betting(state))
        shown = -1
        if state.is_terminal() and moves[-2:] != (BET, PASS):
            shown = card_of(state, 1 - record.seat)
        seen.append((card_of(state, record.seat), moves, shown))

    def posterior(observations: Sequence[tuple]) -> float:
        weights = [
            w * math.prod(observation_likelihood(o, record.seat, obs) for obs in observations)
            for o, w in zip(opponents, population.weights, strict=True)
        ]
        total = sum(weights)
        aggressive = sum(
            w for w, spec in zip(weights, population.specs, strict=True) if "aggressive" in spec
        )
        return aggressive / total if total > 0 else 0.0

    return posterior(seen), posterior(seen[-1:])


def collect_decisions(cfg: TrainConfig, model_spec: str, batches: int) -> list[Decision]:
    """The labelled decisions, of every hand, of ``batches`` rollout batches at temperature 1.

    Each carries its hand, the answer sampled and the advantage the config's training
    targets give it, computed over its whole rollout batch as the trainer does.
    """
    from mage_rl import runtime
    from mage_rl.envs.parsing import extract_action
    from mage_rl.policy.models import load_model
    from mage_rl.rl.advantages import compute_advantages

    engine_model, tokenizer = load_model(model_spec, dtype=cfg.policy.dtype)
    engine = runtime.build_engine(cfg.policy, engine_model, tokenizer)
    llm = runtime.chat_model(engine, temperature=1.0, max_tokens=cfg.policy.max_tokens)
    graph = runtime.build_graph(cfg)
    out = []
    try:
        for b in range(batches):
            tasks, group_size = runtime.training_tasks(cfg, 2_000_000 + b)
            records = runtime.run_rollouts(cfg, graph, llm, tasks, group_size)
            advantages = compute_advantages(records, cfg.returns, cfg.advantages)
            for record, adv in zip(records, advantages, strict=True):
                for i, turn in enumerate(record.turns):
                    answer = label(turn.anchor, record.opponent)
                    if answer is None or turn.kind != "play":
                        continue
                    sampled = (extract_action(turn.text) or "").strip().upper()
                    if sampled not in ANSWERS:
                        continue  # an invalid answer (possible without constrained decoding)
                    p_history, p_current = aggressive_posterior(cfg, record, i)
                    out.append(
                        Decision(
                            list(turn.prompt_ids),
                            ANSWERS.index(answer),
                            record.opponent,
                            p_history,
                            p_current,
                            ANSWERS.index(sampled),
                            adv[i],
                            turn.episode,
                        )
                    )
    finally:
        engine.close()
    return out


def advantage_signal(decisions: Sequence[Decision]) -> list[dict[str, Any]]:
    """The advantages' pull towards the labels: signed advantage statistics.

    For each decision ``g = A`` if the sampled answer was the label, else ``-A``.
    One row per hand and opponent class: ``aggressive`` (where the label goes against
    the best fixed strategy, so only reading the history can earn it), ``others`` and
    ``all``, each with ``hand`` (1-based), ``opponents``, ``n``, ``sampled_label``
    (share of answers that were the label), ``mean``, ``std`` and ``snr = mean / std``.
    """
    rows: list[dict[str, Any]] = []
    for hand in sorted({d.episode for d in decisions}):
        in_hand = [d for d in decisions if d.episode == hand]
        parts = {
            "aggressive": [d for d in in_hand if "aggressive" in d.opponent],
            "others": [d for d in in_hand if "aggressive" not in d.opponent],
            "all": in_hand,
        }
        for name, items in parts.items():
            if not items:
                continue
            g = [d.advantage if d.action == d.label else -d.advantage for d in items]
            mean = sum(g) / len(g)
            std = math.sqrt(sum((x - mean) ** 2 for x in g) / len(g))
            rows.append(
                {
                    "hand": hand + 1,
                    "opponents": name,
                    "n": len(g),
                    "sampled_label": sum(d.action == d.label for d in items) / len(items),
                    "mean": mean,
                    "std": std,
                    "snr": mean / std if std > 0 else 0.0,
                }
            )
    return rows


def expected_accuracy(decisions: Sequence[Decision], history: bool) -> float:
    """Expected accuracy of answering for the more probable opponent class."""
    probs = [d.p_history if history else d.p_current for d in decisions]
    return sum(max(p, 1.0 - p) for p in probs) / len(probs)


def choice_logits(
    model: Any, prompts: Sequence[Sequence[int]], answers: Sequence[Sequence[int]]
) -> torch.Tensor:
    """Summed log-probs of each answer after each prompt: ``(B, len(answers))``."""
    columns = []
    for answer in answers:
        seqs = [list(p) + list(answer) for p in prompts]
        width = max(len(s) for s in seqs)
        ids = torch.zeros(len(seqs), width, dtype=torch.long)  # (B, T)
        mask = torch.zeros_like(ids)
        for i, s in enumerate(seqs):
            ids[i, : len(s)] = torch.tensor(s)
            mask[i, : len(s)] = 1
        logp = F.log_softmax(model(input_ids=ids, attention_mask=mask).logits, dim=-1)
        # Position n-1+j predicts answer token j of a prompt of length n.
        rows = torch.tensor([[len(p) - 1 + j for j in range(len(answer))] for p in prompts])
        target = torch.tensor(answer).expand(len(prompts), -1)
        picked = logp.gather(1, rows.unsqueeze(-1).expand(-1, -1, logp.shape[-1]))
        columns.append(picked.gather(2, target.unsqueeze(-1)).squeeze(-1).sum(-1))
    return torch.stack(columns, dim=1)


def bench_identification(
    *,
    config: str | Path = DEFAULT_CONFIG,
    model: str | None = None,
    batches: int = 20,
    epochs: int = 3,
    lr: float = 1e-3,
    batch_size: int = 32,
    test_size: int = 400,
    eval_every: int = 20,
    seed: int = 0,
    overrides: Sequence[str] = (),
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Collect labelled decisions, train on them, and report held-out accuracy.

    Args:
        config: A Kuhn Poker config with the agent first (default: the adaptation one).
        model: Model spec or path (default: the config's ``policy.model``).
        batches: Rollout batches to collect (each ``rollout.tasks x group_size``).
        epochs: Passes over the training decisions.
        lr: AdamW learning rate.
        batch_size: Decisions per step.
        test_size: Held-out decisions.
        eval_every: Steps between accuracy measurements.
        seed: Shuffling seed.
        overrides: ``key=value`` config overrides.
        log: Where progress lines go.

    Raises:
        ValueError: If the config is not Kuhn Poker with the agent first, or too few
            decisions were collected.
    """
    from mage_rl.policy.models import load_model

    cfg = load_config(config, list(overrides))
    if cfg.env.name != "kuhn_poker" or cfg.env.seat not in ("first", "0"):
        raise ValueError("the identification study needs env.name=kuhn_poker, env.seat=first")
    spec = model or cfg.policy.model
    start = time.perf_counter()
    everything = collect_decisions(cfg, spec, batches)
    data = [d for d in everything if d.episode == cfg.meta.episodes - 1]
    if len(data) < test_size + batch_size:
        raise ValueError(f"{len(data)} decisions collected; need test_size + batch_size")
    random.Random(seed).shuffle(data)
    test, train = data[:test_size], data[test_size:]
    net, tokenizer = load_model(spec, dtype="fp32")
    answers = [
        tokenizer(f"<action>{a}</action>", add_special_tokens=False)["input_ids"] for a in ANSWERS
    ]
    test_y = torch.tensor([d.label for d in test])
    majority = max((test_y == k).float().mean().item() for k in range(len(ANSWERS)))
    no_history = expected_accuracy(test, history=False)
    bayes = expected_accuracy(test, history=True)
    log(
        f"{len(data)} decisions ({len(train)} to train on); held-out references: majority "
        f"label {majority:.3f}, best without history {no_history:.3f}, Bayes {bayes:.3f}"
    )
    signal = advantage_signal(everything)
    log("RL's signal towards the same labels (signed advantages, every hand):")
    for row in signal:
        log(
            f"  hand {row['hand']}, {row['opponents']:10s}: {row['n']:5d} decisions, mean "
            f"{row['mean']:+.3f}, std {row['std']:.3f}, snr {row['snr']:+.3f}"
        )

    def accuracy() -> float:
        net.eval()
        with torch.no_grad():
            logits = choice_logits(net, [d.prompt_ids for d in test], answers)
        net.train()
        return (logits.argmax(1) == test_y).float().mean().item()

    optimizer = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=0.0)
    curve = [{"decisions_seen": 0, "accuracy": accuracy()}]
    rng = random.Random(seed)
    net.train()
    step = 0
    for _ in range(epochs):
        rng.shuffle(train)
        for i in range(0, len(train) - batch_size + 1, batch_size):
            batch = train[i : i + batch_size]
            logits = choice_logits(net, [d.prompt_ids for d in batch], answers)
            loss = F.cross_entropy(logits, torch.tensor([d.label for d in batch]))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step += 1
            if step % eval_every == 0:
                curve.append({"decisions_seen": step * batch_size, "accuracy": accuracy()})
                log(
                    f"  {step * batch_size:6d} decisions seen: held-out accuracy "
                    f"{curve[-1]['accuracy']:.3f}"
                )
    if curve[-1]["decisions_seen"] != step * batch_size:
        curve.append({"decisions_seen": step * batch_size, "accuracy": accuracy()})
    net.eval()
    return {
        "model": spec,
        "decisions": len(data),
        "train": len(train),
        "test": len(test),
        "majority_baseline": majority,
        "no_history_accuracy": no_history,
        "bayes_accuracy": bayes,
        "advantage_signal": signal,
        "final_accuracy": curve[-1]["accuracy"],
        "best_accuracy": max(p["accuracy"] for p in curve),
        "curve": curve,
        "seconds": round(time.perf_counter() - start, 1),
    }


if __name__ == "__main__":  # python -m studies.adaptation.identification
    import sys

    from studies.adaptation.cli import identification_main

    sys.exit(identification_main())
