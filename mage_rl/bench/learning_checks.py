"""Two checks beside the probe suite of :mod:`mage_rl.bench.learning`.

- :func:`diagnose_update` (``mage bench learning --diagnose``): which term of one update
  moves the answers everywhere, and which toward reading the opponent;
- :func:`evaluate_checkpoint` (``--checkpoint``): a trained checkpoint against other
  opponents, played exactly as its config plays.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from mage_rl.bench.learning import (
    CARD_PATTERN,
    MOVES,
    PROBES,
    fmt_estimate,
    probe_config,
    read_records,
    rps_beats_last_shown,
    win_by_episode,
)
from mage_rl.config import TrainConfig, load_config
from mage_rl.config_yaml import read_yaml
from mage_rl.envs.rps_values import rps_values
from mage_rl.eval.rps_families import family_table, rps_families
from mage_rl.eval.stats import mean_interval
from mage_rl.provenance import write_results
from mage_rl.rl.advantages import compute_advantages
from mage_rl.rl.batching import samples_from_records

# -- the diagnosis: which term of the update moves which logit ---------------------------


def _branch_logits(model: Any, turn: Any, token_ids: Sequence[int] | None = None) -> Any:
    """The logits of ``token_ids`` (default: the allowed tokens there) at the turn's first
    branch position, with the graph the model builds (no ``no_grad`` here)."""
    import torch

    j = next(i for i, allowed in enumerate(turn.allowed) if len(allowed) > 1)
    ids = torch.tensor([list(turn.prompt_ids) + list(turn.response_ids[:j])])
    return model(ids).logits[0, -1].float()[list(token_ids or turn.allowed[j])]


def _branch_logprobs(model: Any, turns: Sequence[Any], token_ids: Sequence[int]) -> Any:
    """The restricted log-probs of ``token_ids`` at each turn's first branch position."""
    import torch

    with torch.no_grad():
        return torch.stack(
            [torch.log_softmax(_branch_logits(model, t, token_ids), dim=0) for t in turns]
        )


def _probe_trainer(probe: str, config: str | Path, out: Path, overrides: Sequence[str], seed: int):
    """A trainer of one probe's game with ``config``'s learner settings, no evaluation."""
    from mage_rl.rl.trainer import Trainer

    run_dir = out / f"diagnosis_seed{seed}"
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg_dict = probe_config(PROBES[probe], read_yaml(Path(config)), seed, 1)
    cfg_dict["eval"] = {"tasks": 0, "before": False}
    config_path = run_dir / "probe.yaml"
    config_path.write_text(yaml.safe_dump(cfg_dict))
    cfg = load_config(config_path, list(overrides), TrainConfig)
    return Trainer(cfg, run_dir, progress=False)


def _one_update_per_term(
    trainer: Any, records: Sequence[Any], measure: Any
) -> list[tuple[str, Any]]:
    """From the same weights and optimizer state, one update with the episode-level term
    alone (``omega = 0``), the step-level term alone and their sum; ``measure()`` after
    each. The weights are restored at the end."""
    import copy

    cfg, learner = trainer.cfg, trainer.learner
    weights = copy.deepcopy(learner.model.state_dict())
    optimizer = copy.deepcopy(learner.optimizer.state_dict())
    adv = cfg.advantages
    terms = {
        "A_E (episode level)": compute_advantages(
            records, cfg.returns, adv.model_copy(update={"omega": 0.0})
        ),
        "A_S (step level)": compute_advantages(records, cfg.returns, adv, step_only=True),
        f"A = A_E + {adv.omega:g} A_S": compute_advantages(records, cfg.returns, adv),
    }
    out = []
    for name, advantages in terms.items():
        learner.model.load_state_dict(weights)
        learner.optimizer.load_state_dict(optimizer)
        learner.update(
            samples_from_records(records, advantages),
            old_logprobs=trainer.old_logprobs,
            explore=trainer.cfg.policy.explore,
        )
        out.append((name, measure()))
    learner.model.load_state_dict(weights)
    learner.optimizer.load_state_dict(optimizer)
    return out


def diagnose_update(
    config: str | Path,
    *,
    out: str | Path,
    overrides: Sequence[str] = (),
    seed: int = 0,
    started: float | None = None,
) -> dict[str, Any]:
    """One rock-paper-scissors batch of the untrained model, one update per advantage term.

    From the same weights and optimizer state, the learner takes one update with the
    episode-level term alone (``omega = 0``), the step-level term alone, and their sum,
    and the restricted distribution over ROCK / PAPER / SCISSORS is measured at every
    play turn of the batch before and after. Each change of the centred log-probs splits
    into a part shared by every turn (the answer moved whatever the context: the
    *context-free shift*) and, in rounds 2..K, the extra change toward the move that beats
    the opponent's previous one (the *reading gain*). Writes ``diagnosis.json``.
    """
    out = Path(out)
    trainer = _probe_trainer("rps", config, out, overrides, seed)
    try:
        tokenizer = trainer.tokenizer
        moves = [tokenizer.encode(m, add_special_tokens=False)[0] for m in MOVES]
        records = trainer.rollout(0)
        turns, beats = [], []
        for record in records:
            habit = MOVES.index(record.opponent.rsplit("_", 1)[-1].upper())
            for turn in record.turns:
                if turn.kind == "play":
                    turns.append(turn)
                    beats.append((habit + 1) % 3 if turn.episode > 0 else None)
        model = trainer.learner.model
        before = _branch_logprobs(model, turns, moves)
        rows = []
        for name, after in _one_update_per_term(
            trainer, records, lambda: _branch_logprobs(model, turns, moves)
        ):
            change = after - before
            centred = change - change.mean(dim=1, keepdim=True)
            shift = centred.mean(dim=0)
            gains = [float(centred[i, b] - shift[b]) for i, b in enumerate(beats) if b is not None]
            rows.append(
                {
                    "term": name,
                    "context_free_shift": {m: float(v) for m, v in zip(MOVES, shift, strict=True)},
                    "context_free_norm": float(shift.norm()),
                    "reading_gain": sum(gains) / max(1, len(gains)),
                }
            )
        probs = before.exp()
        first = [i for i, b in enumerate(beats) if b is None]
        doc = {
            "probe": "rps",
            "config": str(config),
            "overrides": list(overrides),
            "seed": seed,
            "meta_episodes": len(records),
            "play_turns": len(turns),
            "round1_pi": {m: float(probs[first, k].mean()) for k, m in enumerate(MOVES)},
            "terms": rows,
        }
    finally:
        trainer.engine.close()
    write_results(out / "diagnosis.json", doc, started=started)
    return doc


# The best response to kuhn:aggressive (bets and calls always), agent first: +1 where it
# bets or calls, -1 where it checks or folds, absent where both are worth the same.
CARD_BEST = {"no bet to face": {"J": -1}, "facing a bet": {"J": -1, "Q": 1, "K": 1}}


def _bet_logodds(model: Any, turns: Sequence[Any], bet: Sequence[int]) -> Any:
    """log pi(BET) - log pi(PASS) at each turn's first branch position (``bet[i]``: the
    index of BET's token among that position's two allowed tokens): the logits' difference,
    the restricted softmax's normaliser cancelling."""
    import torch

    with torch.no_grad():
        rows = [_branch_logits(model, t) for t in turns]
    return torch.stack([z[b] - z[1 - b] for z, b in zip(rows, bet, strict=True)])


def _card_gradient_cosines(model: Any, picks: dict[str, tuple[Any, int]]) -> dict[str, float]:
    """Cosine between the gradients (over every trained weight) of the BET log-odds of
    one turn per card (``picks``: card -> (turn, index of BET's token)): 1 means a step that
    moves one card's answer moves the others' as far; 0, that it leaves them."""
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    grads = {}
    for card, (turn, b) in picks.items():
        z = _branch_logits(model, turn)
        odds = z[b] - z[1 - b]
        grad = torch.autograd.grad(odds, params)
        # float64: in float32 a sum over 10^8 products drifts past +-1.
        grads[card] = torch.cat([g.reshape(-1).double() for g in grad])
    cards = sorted(grads, key="JQK".index)
    return {
        f"{a}-{c}": float(torch.nn.functional.cosine_similarity(grads[a], grads[c], dim=0))
        for i, a in enumerate(cards)
        for c in cards[i + 1 :]
    }


def diagnose_cards(
    config: str | Path,
    *,
    out: str | Path,
    overrides: Sequence[str] = (),
    seed: int = 0,
    started: float | None = None,
) -> dict[str, Any]:
    """One ``kuhn_card`` batch of the untrained model, one update per advantage term.

    Single hands in the first seat against ``kuhn:aggressive``. At every play turn the BET
    log-odds (BET against PASS: bet or call against check or fold) is read before and
    after each update. Per spot (no bet to face, facing a bet) its change splits into the
    mean over the cards (the *card-free shift*: the answer moved whatever the card) and
    each card's departure from it; the *card gain* is the mean departure toward the best
    response (:data:`CARD_BEST`). Beside it, the cosine between the gradients of the
    log-odds at one turn per card: how far one card's update moves the others'. Writes
    ``diagnosis.json``.
    """
    out = Path(out)
    trainer = _probe_trainer("kuhn_card", config, out, overrides, seed)
    try:
        tokenizer = trainer.tokenizer
        records = trainer.rollout(0)
        turns, spots, cards, bet = [], [], [], []
        for record in records:
            for turn in record.turns:
                card = CARD_PATTERN.search(turn.anchor or "")
                if turn.kind != "play" or not card or not turn.allowed:
                    continue
                j = next(i for i, allowed in enumerate(turn.allowed) if len(allowed) > 1)
                pieces = [tokenizer.decode([t]).strip().upper() for t in turn.allowed[j]]
                if len(pieces) != 2 or not any(p and "BET".startswith(p) for p in pieces):
                    continue
                turns.append(turn)
                spots.append(
                    "facing a bet" if "No bet to face" not in turn.anchor else "no bet to face"
                )
                cards.append(card.group(1))
                bet.append(next(i for i, p in enumerate(pieces) if p and "BET".startswith(p)))
        model = trainer.learner.model
        before = _bet_logodds(model, turns, bet)
        groups: dict[str, dict[str, list[int]]] = {}
        for i, (spot, card) in enumerate(zip(spots, cards, strict=True)):
            groups.setdefault(spot, {}).setdefault(card, []).append(i)

        def split(change: Any) -> dict[str, Any]:
            by_spot = {}
            for spot, by_card in sorted(groups.items()):
                means = {
                    c: float(change[idx].mean())
                    for c, idx in sorted(by_card.items(), key=lambda x: "JQK".index(x[0]))
                }
                shift = sum(means.values()) / len(means)
                best = CARD_BEST[spot]
                gains = [best[c] * (v - shift) for c, v in means.items() if c in best]
                by_spot[spot] = {
                    "by_card": means,
                    "card_free_shift": shift,
                    "card_gain": sum(gains) / max(1, len(gains)),
                }
            return by_spot

        rows = [
            {"term": name, **split(after - before)}
            for name, after in _one_update_per_term(
                trainer, records, lambda: _bet_logodds(model, turns, bet)
            )
        ]
        one = {
            spot: {c: (turns[idx[0]], bet[idx[0]]) for c, idx in by_card.items()}
            for spot, by_card in groups.items()
        }
        cosines = {spot: _card_gradient_cosines(model, picks) for spot, picks in one.items()}
        pi_bet = before.sigmoid()
        doc = {
            "probe": "kuhn_card",
            "config": str(config),
            "overrides": list(overrides),
            "seed": seed,
            "meta_episodes": len(records),
            "play_turns": len(turns),
            "untrained_bet": {
                spot: {c: float(pi_bet[idx].mean()) for c, idx in by_card.items()}
                for spot, by_card in groups.items()
            },
            "turns": {
                spot: {c: len(idx) for c, idx in by_card.items()}
                for spot, by_card in groups.items()
            },
            "gradient_cosine": cosines,
            "terms": rows,
        }
    finally:
        trainer.engine.close()
    write_results(out / "diagnosis.json", doc, started=started)
    return doc


def format_diagnosis(doc: dict[str, Any]) -> str:
    lines = [
        f"One update from the untrained model on {doc['meta_episodes']} meta-episodes "
        f"({doc['play_turns']} answers), seed {doc['seed']}; untrained round-1 answers "
        + ", ".join(f"{m} {p:.3f}" for m, p in doc["round1_pi"].items())
        + ".",
        "",
        "| update with | context-free shift of the centred log-probs, ROCK / PAPER / "
        "SCISSORS (nats) | its size | reading gain, rounds 2-3 (nats) |",
        "| --- | --- | --- | --- |",
    ]
    for row in doc["terms"]:
        shift = " / ".join(f"{v:+.3f}" for v in row["context_free_shift"].values())
        lines.append(
            f"| {row['term']} | {shift} | {row['context_free_norm']:.3f} | "
            f"{row['reading_gain']:+.3f} |"
        )
    return "\n".join(lines)


def format_card_diagnosis(doc: dict[str, Any]) -> str:
    lines = [
        f"One update from the untrained model on {doc['meta_episodes']} single hands "
        f"({doc['play_turns']} answers), seed {doc['seed']}. Untrained P(BET): "
        + "; ".join(
            f"{spot} " + ", ".join(f"{c} {p:.2f}" for c, p in by_card.items())
            for spot, by_card in doc["untrained_bet"].items()
        )
        + ". Gradient cosine of the BET log-odds between cards: "
        + "; ".join(
            f"{spot} " + ", ".join(f"{pair} {v:.3f}" for pair, v in pairs.items())
            for spot, pairs in doc["gradient_cosine"].items()
        )
        + ".",
        "",
        "| update with | spot | change of the BET log-odds, J / Q / K (nats) | card-free shift | card gain |",
        "| --- | --- | --- | --- | --- |",
    ]
    for row in doc["terms"]:
        for spot, part in row.items():
            if spot == "term":
                continue
            changes = " / ".join(f"{part['by_card'].get(c, float('nan')):+.3f}" for c in "JQK")
            lines.append(
                f"| {row['term']} | {spot} | {changes} | {part['card_free_shift']:+.3f} | "
                f"{part['card_gain']:+.3f} |"
            )
    return "\n".join(lines)


# -- a trained checkpoint against other opponents -----------------------------------------


def evaluate_checkpoint(
    config: str | Path,
    checkpoint: str | Path,
    population: str,
    *,
    out: str | Path,
    overrides: Sequence[str] = (),
    started: float | None = None,
) -> dict[str, Any]:
    """Play a checkpoint against ``population`` exactly as ``config`` trains and evaluates.

    The config's prompt, layout, context and decoding (``eval.temperature``) apply, and
    its ``eval.tasks`` evaluation tasks are drawn from ``population`` (stratified when
    ``eval.stratify`` is). Nothing is trained. Writes ``OUT/eval/iter_000000.json(l)`` and
    ``OUT/transfer.json``: the payoff and win rate of every episode with 95 % intervals,
    and whether the last episode beats the first, intervals apart.
    """
    from mage_rl import runtime
    from mage_rl.rl.trainer import Trainer

    out = Path(out)
    sets = [
        *overrides,
        f"policy.model={checkpoint}",
        f"env.population={population}",
        "eval.before=false",
        "eval.baselines=[]",
    ]
    cfg = load_config(Path(config), sets, TrainConfig)
    trainer = Trainer(cfg, out, progress=False)
    try:
        summary = trainer.evaluate(0)
    finally:
        trainer.engine.close()
    records = read_records(out / "eval" / "iter_000000.jsonl")  # written by evaluate()
    block = summary.get("stratified") or summary["intervals"]
    evs = block.get("ev@k") or []
    doc = {
        "config": str(config),
        "checkpoint": str(checkpoint),
        "population": population,
        "n": summary["n"],
        "ev_by_episode": evs,
        "win_by_episode": win_by_episode(records, cfg.meta.episodes),
        "last_above_first": bool(
            len(evs) > 1 and evs[-1].get("low") is not None and evs[-1]["low"] > evs[0]["high"]
        ),
    }
    # The same meta-episodes play both episodes: their difference, paired, is the finer
    # test (the opponent's draws and the deal cancel out).
    full = [r for r in records if len(r["episodes"]) == cfg.meta.episodes]
    gain = mean_interval([r["episodes"][-1]["payoff"] - r["episodes"][0]["payoff"] for r in full])
    doc["last_minus_first"] = {"mean": gain.mean, "low": gain.low, "high": gain.high, "n": gain.n}
    doc["last_better_than_first"] = bool(gain.low is not None and gain.low > 0)
    if cfg.env.name == "rock_paper_scissors":
        doc["beats_last_shown"] = rps_beats_last_shown(records)
        pop = runtime.population(cfg)
        values = rps_values(dict(zip(pop.specs, pop.weights, strict=True)), cfg.meta.episodes)
        doc["oracle"] = values.to_dict()
        doc["families"] = rps_families(records, values)
    write_results(out / "transfer.json", doc, started=started)
    return doc


def format_transfer(doc: dict[str, Any]) -> str:
    k = len(doc["ev_by_episode"])
    lines = [
        f"{doc['checkpoint']} against {doc['population']}, {doc['n']} meta-episodes:",
        "",
        "| episode | " + " | ".join(str(i + 1) for i in range(k)) + " |",
        "| --- |" + " --- |" * k,
        "| payoff | " + " | ".join(fmt_estimate(e, 3, True) for e in doc["ev_by_episode"]) + " |",
        "| win rate | " + " | ".join(fmt_estimate(w) for w in doc["win_by_episode"]) + " |",
    ]
    oracle = doc.get("oracle")
    if oracle:
        lines.append(
            f"| exact | best fixed {oracle['best_fixed']:+.3f} | | Bayes last "
            f"{oracle['bayes_last']:+.3f} (win {oracle['win_bayes_last']:.2f}) |"
        )
    gain = doc.get("last_minus_first")
    if gain:
        lines += ["", f"last minus first, paired over {gain['n']} meta-episodes: "
                  f"{fmt_estimate(gain, 3, True)}"]  # fmt: skip
    if doc.get("beats_last_shown"):
        lines.append(f"answers beating the opponent's previous move (rounds 2..{k}): "
                     f"{fmt_estimate(doc['beats_last_shown'])}")  # fmt: skip
    if doc.get("families"):
        lines += ["", *family_table([("trained", doc["families"])])]
    lines += ["", f"last episode above the first, intervals apart: {doc['last_above_first']}",
              f"last episode better than the first, paired: {doc.get('last_better_than_first')}"]  # fmt: skip
    return "\n".join(lines)
