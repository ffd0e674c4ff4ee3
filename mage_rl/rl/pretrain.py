"""Language-model pretraining on game transcripts, before RL (``mage pretrain``).

A model built from scratch (``tiny``) has never read the game's text. RL alone must then
teach it to read cards, bets and past hands, from one reward per hand, while it also
learns what to play. A pretrained LLM starts with most of the reading done; this module
gives a from-scratch model the same kind of start, with a world model of the game:

1. The untrained policy plays meta-episodes of the config's environment against its
   training population, in every seat asked for (sampling at temperature 1; a ``tiny``
   model at initialisation, under constrained decoding, picks legal actions nearly
   uniformly at random).
2. Every turn's prompt and response tokens become one training sequence.
3. The model learns next-token prediction on those sequences (AdamW, a few epochs, a
   held-out slice to report).

Every token is a target: the cards dealt, the game's rules (which actions are legal,
what a showdown pays) and the opponents' replies. An opponent's reply depends on its
type, so predicting it from the hands already in the prompt is opponent modelling. The
agent's own actions in the transcripts are random, so no strategy is learned here: what
to play, and how to exploit what the model can predict, is left to RL.

The result is a plain HF model directory with its tokenizer and a ``pretrain.json``
summary; point ``policy.model`` at it. Every method trained from it starts from the
same weights, and its time belongs to any training budget that uses it.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from mage_rl.config import TrainConfig
from mage_rl.fileio import atomic_write_json
from mage_rl.policy.models import load_model

logger = logging.getLogger(__name__)

SUMMARY_FILE = "pretrain.json"
# Task seeds of the transcripts come from iterations far past any training run's, so
# pretraining never plays the exact batches RL will draw.
ITERATION_OFFSET = 1_000_000


@dataclass(frozen=True)
class PretrainSettings:
    """How much to play and how long to train.

    Attributes:
        batches: Rollout batches per seat, each ``rollout.tasks x rollout.group_size``
            meta-episodes of the config. More batches: more varied transcripts, a longer
            collection.
        epochs: Passes over the transcripts. The held-out loss of the Kuhn transcripts
            levels off after 3-4.
        lr: AdamW learning rate (constant).
        batch_size: Sequences per optimizer step.
        holdout: Sequences kept out of training to report a held-out loss.
        seed: Shuffling seed.
    """

    batches: int = 10
    epochs: int = 4
    lr: float = 1e-3
    batch_size: int = 64
    holdout: int = 512
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("batches", "epochs", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"pretrain {name} must be >= 1, got {getattr(self, name)}")
        if self.lr <= 0:
            raise ValueError(f"pretrain lr must be > 0, got {self.lr}")
        if self.holdout < 0:
            raise ValueError(f"pretrain holdout must be >= 0, got {self.holdout}")


def seat_configs(cfg: TrainConfig, seats: Sequence[str]) -> list[TrainConfig]:
    """``cfg`` once per seat, validated (a single-agent game has only ``first``)."""
    out = []
    for seat in seats:
        data = cfg.model_dump()
        data["env"]["seat"] = seat
        out.append(type(cfg).model_validate(data))
    return out


def collect_transcripts(
    cfg: TrainConfig,
    engine: Any,
    seats: Sequence[str],
    batches: int,
    log: Callable[[str], None] = logger.info,
) -> list[list[int]]:
    """Token sequences (prompt + response) of every turn the current policy plays.

    Args:
        cfg: The training config (environment, population, prompt, rollout sizes).
        engine: A local engine serving the policy to pretrain.
        seats: Agent seats to play (each gets ``batches`` batches).
        batches: Rollout batches per seat.
        log: Where progress lines go.

    Raises:
        ValueError: If the policy returns no token ids (a remote policy).
    """
    from mage_rl import runtime

    llm = runtime.rollout_chat_model(cfg, engine)
    sequences: list[list[int]] = []
    for seat, seat_cfg in zip(seats, seat_configs(cfg, seats), strict=True):
        graph = runtime.build_graph(seat_cfg)
        for b in range(batches):
            tasks, group_size = runtime.training_tasks(seat_cfg, ITERATION_OFFSET + b)
            for record in runtime.run_rollouts(seat_cfg, graph, llm, tasks, group_size):
                for turn in record.turns:
                    if not turn.prompt_ids:
                        raise ValueError("pretraining needs token ids; use a local policy")
                    sequences.append(list(turn.prompt_ids) + list(turn.response_ids))
            log(f"pretrain: seat {seat}, batch {b + 1}/{batches}, {len(sequences)} sequences")
    return sequences


def _pad(sequences: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in sequences)
    ids = torch.zeros(len(sequences), width, dtype=torch.long)  # (B, T)
    mask = torch.zeros(len(sequences), width, dtype=torch.long)  # (B, T)
    for i, seq in enumerate(sequences):
        ids[i, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        mask[i, : len(seq)] = 1
    return ids, mask


def lm_loss(model: Any, sequences: Sequence[Sequence[int]]) -> torch.Tensor:
    """Mean next-token cross-entropy over every real (non-padding) position."""
    ids, mask = _pad(sequences)
    device = next(model.parameters()).device
    ids, mask = ids.to(device), mask.to(device)
    logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1]  # (B, T-1, V)
    targets = ids[:, 1:].masked_fill(mask[:, 1:] == 0, -100)  # (B, T-1)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def train_lm(
    model: Any,
    sequences: Sequence[Sequence[int]],
    settings: PretrainSettings,
    log: Callable[[str], None] = logger.info,
) -> list[dict[str, float]]:
    """Next-token training in place; one row of losses per epoch.

    Raises:
        ValueError: If there are fewer sequences than ``holdout + batch_size``.
    """
    if len(sequences) < settings.holdout + settings.batch_size:
        raise ValueError(
            f"{len(sequences)} transcript sequences are too few for holdout "
            f"{settings.holdout} plus one batch of {settings.batch_size}; play more batches"
        )
    rng = random.Random(settings.seed)
    order = list(sequences)
    rng.shuffle(order)
    holdout, train = order[: settings.holdout], order[settings.holdout :]
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=settings.lr, weight_decay=0.0)
    rows = []
    model.train()
    try:
        for epoch in range(settings.epochs):
            rng.shuffle(train)
            total, steps = 0.0, 0
            # The last partial batch is dropped: every step sees batch_size sequences.
            for start in range(0, len(train) - settings.batch_size + 1, settings.batch_size):
                loss = lm_loss(model, train[start : start + settings.batch_size])
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, 1.0)
                optimizer.step()
                total += loss.item()
                steps += 1
            row = {"epoch": epoch + 1, "train_loss": total / steps}
            if holdout:
                row["holdout_loss"] = _mean_loss(model, holdout, settings.batch_size)
            rows.append(row)
            log(
                f"pretrain: epoch {epoch + 1}/{settings.epochs}, train loss "
                f"{row['train_loss']:.4f}, held-out {row.get('holdout_loss', float('nan')):.4f}"
            )
    finally:
        model.eval()
    return rows


@torch.no_grad()
def _mean_loss(model: Any, sequences: Sequence[Sequence[int]], batch_size: int) -> float:
    model.eval()
    total, count = 0.0, 0
    for start in range(0, len(sequences), batch_size):
        chunk = sequences[start : start + batch_size]
        total += lm_loss(model, chunk).item() * len(chunk)
        count += len(chunk)
    model.train()
    return total / count


def pretrain(
    cfg: TrainConfig,
    out_dir: str | Path,
    settings: PretrainSettings | None = None,
    seats: Sequence[str] | None = None,
    log: Callable[[str], None] = logger.info,
) -> dict[str, Any]:
    """Pretrain ``cfg.policy.model`` on transcripts of its own play; save it to ``out_dir``.

    Args:
        cfg: The training config whose model, environment and population are used.
        out_dir: Where the HF model, its tokenizer and ``pretrain.json`` go.
        settings: Collection and training settings (defaults: :class:`PretrainSettings`).
        seats: Agent seats whose transcripts are collected (default: ``env.seat``).
        log: Where progress lines go.

    Returns:
        The summary written to ``out_dir/pretrain.json``: sizes, losses and seconds.

    Raises:
        FileExistsError: If ``out_dir`` already holds a pretrained model.
    """
    from mage_rl import runtime

    settings = settings or PretrainSettings()
    seats = list(seats) if seats else [cfg.env.seat]
    out = Path(out_dir)
    if (out / SUMMARY_FILE).exists():
        raise FileExistsError(f"{out} already holds a pretrained model; choose another --out")
    seat_configs(cfg, seats)  # a bad seat fails here, before any work
    start = time.perf_counter()
    model, tokenizer = load_model(cfg.policy.model, dtype="fp32")
    # The engine samples in policy.dtype from its own copy, as in training.
    engine_model, _ = load_model(cfg.policy.model, dtype=cfg.policy.dtype)
    engine = runtime.build_engine(cfg.policy, engine_model, tokenizer)
    try:
        sequences = collect_transcripts(cfg, engine, seats, settings.batches, log)
    finally:
        engine.close()
    collected = time.perf_counter()
    epochs = train_lm(model, sequences, settings, log)
    trained = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    summary = {
        "base_model": cfg.policy.model,
        "seats": list(seats),
        "settings": asdict(settings),
        "sequences": len(sequences),
        "tokens": sum(len(s) for s in sequences),
        "epochs": epochs,
        "collect_seconds": round(collected - start, 2),
        "train_seconds": round(trained - collected, 2),
        "seconds": round(time.perf_counter() - start, 2),
    }
    # Written last: its presence marks a complete directory.
    atomic_write_json(out / SUMMARY_FILE, summary)
    return summary
