"""The learner on a training config's own batch: right-padded rows against prefix trees.

What it measures:

1. Build the config's trainer in a scratch folder (its model, engine and learner, as
   ``mage train`` does) and play ``batches`` iterations of rollouts with the untrained
   policy; each batch becomes the learner's samples exactly as in training (credit,
   conversation samples, the rescoring of old log-probs when training rescores them).
2. Check that both layouts train alike: on the first batch, the gradient of one
   mini-batch under each layout (the loss terms and the relative difference of the
   gradients). In fp32 they agree to about 1e-6; in bf16 any two layouts round
   differently, so the same mini-batch fed padded one sample per pass is measured too,
   as the scale of that rounding.
3. Time ``Learner.update`` on each batch with each layout, alternating (paths, tree,
   padded, paths, ...), ``repeats`` times after one untimed warm-up each; the shuffling
   seed is reset before every update so the layouts cut the same mini-batches. The
   updates move the weights a little (the config's learning rate), which costs the same
   either way.

The layouts: ``padded`` (one right-padded row per sample), ``tree`` (prefix trees, every
tree attending under its mask) and ``paths`` (prefix trees as training feeds them: a tree
attends along its paths where that is cheaper, :data:`~mage_rl.rl.prefix_tree.PATHS_MIN_RATIO`).

Reported per layout: the fastest update, the samples' tokens (every pass of the update,
the rescoring pass included) and the tokens the model computed for them (padding
included, or tree nodes), the samples' tokens per second, and the ratios.
"""

from __future__ import annotations

import logging
import math
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from mage_rl.api import load_config

logger = logging.getLogger(__name__)

LAYOUTS = ("padded", "tree", "paths")


def bench_learner_batch(
    config: str,
    sets: Sequence[str] = (),
    batches: int = 1,
    repeats: int = 2,
) -> dict[str, Any]:
    """Time one learner update per layout on ``batches`` real batches of ``config``.

    Args:
        config: A training config file (say ``configs/rps_smollm2.yaml``).
        sets: ``key=value`` overrides, as ``mage train --set``.
        batches: Iterations of rollouts to play (each one batch of samples).
        repeats: Timed updates per layout and batch, after one warm-up each.

    Returns:
        ``{"config": {...}, "batches": [...], "layouts": {...}, "ratios": {...},
        "agreement": {...}}``: per batch its samples, sample tokens and the tokens each
        layout computes; per layout ``update_s`` (sum over batches of the fastest update),
        ``repeat_s``, ``sample_tokens``, ``fed_tokens`` and ``tokens_per_s``; ratios
        padded / tree of seconds and of fed tokens.

    Raises:
        ValueError: On a non-positive count, or a model whose attention cannot take a
            tree mask (nothing to compare).
    """
    import torch

    from mage_rl.rl import prefix_tree
    from mage_rl.rl.trainer import Trainer

    if batches < 1 or repeats < 1:
        raise ValueError(f"batches and repeats must be >= 1, got {batches}, {repeats}")
    cfg = load_config(config, [*sets, "eval.tasks=0", "eval.before=false"])
    shipped = prefix_tree.PATHS_MIN_RATIO
    with tempfile.TemporaryDirectory(prefix="mage-bench-learner-") as scratch:
        trainer = Trainer(cfg, scratch, progress=False)
        try:
            learner = trainer.learner
            if not learner.tree:
                raise ValueError(
                    f"{cfg.policy.model}'s attention takes no custom mask (Hugging Face SDPA "
                    "is needed), so its learner feeds padded rows only; nothing to compare"
                )
            old, explore = trainer.old_logprobs, cfg.policy.explore
            played = []
            for it in range(batches):
                start = time.perf_counter()
                records = trainer.rollout(it)
                played.append(trainer.samples(records))
                logger.info("bench learner-batch: batch %d played in %.1f s", it,
                            time.perf_counter() - start)  # fmt: skip
            agreement = _agreement(learner, played[0], old, explore, shipped)
            layouts: dict[str, dict[str, Any]] = {
                name: {"update_s": 0.0, "repeat_s": [], "sample_tokens": 0.0, "fed_tokens": 0.0}
                for name in LAYOUTS
            }
            per_batch = []
            seed_state = learner._generator.get_state()
            for samples in played:
                fed: dict[str, float] = {}
                timings: dict[str, list[float]] = {name: [] for name in LAYOUTS}
                for round_ in range(repeats + 1):
                    for name in ("paths", "tree", "padded"):
                        _set_layout(learner, name, shipped)
                        learner._generator.set_state(seed_state)
                        start = time.perf_counter()
                        stats = learner.update(samples, old_logprobs=old, explore=explore)
                        elapsed = time.perf_counter() - start
                        if round_:  # the first round warms up
                            timings[name].append(elapsed)
                        fed[name] = stats["fed_tokens"]
                        sample_tokens = stats["sample_tokens"]
                for name in LAYOUTS:
                    entry = layouts[name]
                    entry["update_s"] += min(timings[name])
                    entry["repeat_s"].append(timings[name])
                    entry["sample_tokens"] += sample_tokens
                    entry["fed_tokens"] += fed[name]
                per_batch.append({
                    "samples": len(samples),
                    "sample_tokens": sample_tokens,
                    "fed_tokens": fed,
                })  # fmt: skip
        finally:
            _set_layout(trainer.learner, "paths", shipped)
            trainer.engine.close()
    for entry in layouts.values():
        entry["tokens_per_s"] = entry["sample_tokens"] / entry["update_s"]
    padded, tree, paths = layouts["padded"], layouts["tree"], layouts["paths"]
    return {
        "config": {
            "config": config,
            "sets": list(sets),
            "batches": batches,
            "repeats": repeats,
            "model": cfg.policy.model,
            "learner_dtype": str(learner.autocast_dtype or torch.float32).removeprefix("torch."),
            "mini_batch_size": cfg.learner.mini_batch_size,
            "micro_batch_tokens": cfg.learner.micro_batch_tokens,
            "old_logprobs": old,
            "torch_threads": torch.get_num_threads(),
        },
        "batches": per_batch,
        "layouts": layouts,
        "agreement": agreement,
        "ratios": {
            "update_s": padded["update_s"] / tree["update_s"],
            "fed_tokens": padded["fed_tokens"] / tree["fed_tokens"],
            "tree_over_paths_update_s": tree["update_s"] / paths["update_s"],
        },
    }


def _set_layout(learner: Any, name: str, shipped: float) -> None:
    """Feed ``learner`` padded rows, trees under their masks, or trees as training does
    (``shipped``: :data:`~mage_rl.rl.prefix_tree.PATHS_MIN_RATIO` as the process began)."""
    from mage_rl.rl import prefix_tree  # defers torch

    learner.tree = name != "padded"
    prefix_tree.PATHS_MIN_RATIO = math.inf if name == "tree" else shipped


def _agreement(
    learner: Any, samples: list[Any], old: str, explore: float, shipped: float
) -> dict[str, Any]:
    """One mini-batch's loss terms and gradient under each layout, on the same weights."""
    import torch

    group = learner._mini_batches(samples)[0]
    mini = [samples[i] for i in group]
    if old == "rescored":  # the old log-probs training would use: the policy's own, mixed
        from mage_rl.rl.batching import behaviour_logprobs

        fresh = learner.compute_logprobs(mini)
        mini = [
            s.with_old_logprobs(behaviour_logprobs(s, lp, explore))
            for s, lp in zip(mini, fresh, strict=True)
        ]
    out: dict[str, Any] = {}
    grads = {}
    config = learner.config
    # "rows": padded again, one sample per pass, which rounds differently from "padded"
    # in bf16 and so tells how far apart two equivalent layouts land in this dtype.
    for name in (*LAYOUTS, "rows"):
        _set_layout(learner, "padded" if name == "rows" else name, shipped)
        if name == "rows":
            learner.config = config.model_copy(update={"micro_batch_tokens": 1})
        learner.optimizer.zero_grad(set_to_none=True)
        stats = learner.accumulate_gradients(mini)
        out[name] = {k: stats[k] for k in ("loss", "pg_loss", "entropy")}
        grads[name] = torch.cat([p.grad.flatten() for p in learner.params if p.grad is not None])
    learner.config = config
    learner.optimizer.zero_grad(set_to_none=True)
    _set_layout(learner, "paths", shipped)
    norm = grads["padded"].norm().clamp(min=1e-30)
    out["grad_relative_difference"] = float((grads["tree"] - grads["padded"]).norm() / norm)
    out["grad_relative_difference_paths"] = float((grads["paths"] - grads["padded"]).norm() / norm)
    out["grad_relative_difference_rows"] = float((grads["rows"] - grads["padded"]).norm() / norm)
    out["samples"] = len(mini)
    return out


def format_learner_batch_report(result: dict[str, Any]) -> str:
    """A markdown table per layout, the ratios and how far the layouts' gradients agree."""
    cfg = result["config"]
    lines = [
        f"Learner on {cfg['batches']} batch(es) of {cfg['config']} ({cfg['model']}, "
        f"{cfg['learner_dtype']} forward, mini-batches of {cfg['mini_batch_size']} calls, "
        f"{cfg['micro_batch_tokens']} tokens a pass, rescoring "
        f"{'on' if cfg.get('old_logprobs') == 'rescored' else 'off'}), fastest of {cfg['repeats']} "
        f"updates per batch after a warm-up, {cfg['torch_threads']} torch threads",
        "",
        "| layout | s/update | sample tokens | tokens computed | sample tokens/s |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, d in result["layouts"].items():
        lines.append(
            f"| {name} | {d['update_s']:.2f} | {d['sample_tokens']:.0f} "
            f"| {d['fed_tokens']:.0f} | {d['tokens_per_s']:.0f} |"
        )
    ratios, agree = result["ratios"], result["agreement"]
    lines += [
        "",
        f"padded / tree: {ratios['update_s']:.2f}x seconds, {ratios['fed_tokens']:.2f}x "
        f"tokens computed; tree / paths: {ratios['tree_over_paths_update_s']:.2f}x seconds.",
        f"One mini-batch of {agree['samples']} samples on the same weights: loss "
        f"{agree['padded']['loss']:+.6f} padded, {agree['tree']['loss']:+.6f} tree, "
        f"{agree['paths']['loss']:+.6f} paths; the trees' gradients differ from the padded "
        f"one by {agree['grad_relative_difference']:.1e} and "
        f"{agree['grad_relative_difference_paths']:.1e} of the norm (padded "
        f"one sample per pass: {agree['grad_relative_difference_rows']:.1e}, the rounding "
        "of this dtype).",
    ]
    return "\n".join(lines)
