"""``mage bench sampling``: the engine's sampling step against a plain PyTorch one.

Every decode step of the local engine turns a ``(B, V)`` block of logits into one token
per row (:mod:`mage_rl.policy.sampling`): temperature, top-k, top-p, then a draw from
each row's own generator. On a CPU with a vocabulary of 50,000 tokens that step can cost
as much as the model's forward pass, so it is timed on its own here, on random logits
(no model is loaded), against the textbook way of writing it: a stable sort of the whole
vocabulary for top-k and top-p, and one ``torch.multinomial`` per row. Both keep the same
tokens (checked on every setting before timing); only the random stream of the draw
differs.

The settings: ``free`` (temperature 1, nothing truncated, as the training rollouts of an
unconstrained graph) and ``evaluation`` (temperature 0.7, top-k 20, top-p 0.8, the
evaluation defaults of :mod:`mage_rl.defaults`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

SETTINGS = {
    "free": {"temperature": 1.0, "top_k": 0, "top_p": 1.0},
    "evaluation": {"temperature": 0.7, "top_k": 20, "top_p": 0.8},
}


def _plain_logprobs(logits: Any, temperature: float, top_k: int, top_p: float) -> Any:
    """The reference distribution: the whole vocabulary sorted, stably, per call."""
    import torch

    scaled = logits.float() / temperature
    vocab = scaled.shape[-1]
    if (0 < top_k < vocab) or top_p < 1:
        ranked, order = torch.sort(scaled, dim=-1, descending=True, stable=True)
        remove = torch.arange(vocab)[None, :] >= (top_k if 0 < top_k < vocab else vocab)
        probs = torch.softmax(ranked.masked_fill(remove, float("-inf")), dim=-1)
        remove = remove | ((probs.cumsum(-1) - probs) >= top_p)
        remove[:, 0] = False
        mask = torch.zeros_like(remove).scatter(-1, order, remove)  # vocabulary order
        scaled = scaled.masked_fill(mask, float("-inf"))
    return torch.log_softmax(scaled, dim=-1)


def _plain_draw(logprobs: Any, generators: Sequence[Any]) -> list[int]:
    import torch

    probs = logprobs.exp()
    return [int(torch.multinomial(probs[i], 1, generator=g)) for i, g in enumerate(generators)]


def _time(fn: Callable[[], Any], repeats: int) -> float:
    """Milliseconds per call: the fastest of ``repeats`` after one warm-up."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best * 1000


def _measure(
    params: dict[str, Any], batch: int, vocab: int, repeats: int, seed: int
) -> dict[str, Any]:
    """One setting at one batch size: both sides timed, the kept tokens compared."""
    import torch

    from mage_rl.policy.sampling import draw_rows, sampling_logprobs

    generator = torch.Generator().manual_seed(seed)
    # bf16 logits, as the engine's forward pass returns them: ties are common
    logits = (torch.randn(batch, vocab, generator=generator) * 3).bfloat16()
    engine = sampling_logprobs(logits, **params)
    plain = _plain_logprobs(logits, **params)
    streams = [torch.Generator().manual_seed(seed + i) for i in range(batch)]
    ours = {
        "logprobs_ms": _time(lambda: sampling_logprobs(logits, **params), repeats),
        "draw_ms": _time(lambda: draw_rows(engine, [False] * batch, streams), repeats),
    }
    theirs = {
        "logprobs_ms": _time(lambda: _plain_logprobs(logits, **params), repeats),
        "draw_ms": _time(lambda: _plain_draw(plain, streams), repeats),
    }
    for side in (ours, theirs):
        side["step_ms"] = side["logprobs_ms"] + side["draw_ms"]
    return {
        "engine": ours,
        "plain": theirs,
        "speedup": theirs["step_ms"] / ours["step_ms"],
        "same_tokens_kept": bool(torch.equal(torch.isfinite(engine), torch.isfinite(plain))),
    }


def bench_sampling(
    batches: Sequence[int] = (1, 16, 64), vocab: int = 49152, repeats: int = 10, seed: int = 0
) -> dict[str, Any]:
    """Time a sampling step, the engine's and the plain one, per setting and batch size.

    Args:
        batches: Rows per step.
        vocab: Vocabulary size (SmolLM2's by default).
        repeats: Timed calls per measurement; the fastest counts.
        seed: Seed of the random logits.

    Returns:
        ``{"config": {...}, "rows": [...]}``: per setting and batch, milliseconds per step
        of the distribution (``logprobs_ms``) and the draw (``draw_ms``) for both, their
        sums and ``speedup`` (plain over engine), and ``same_tokens_kept``.

    Raises:
        ValueError: On an empty batch list, a batch or vocabulary under 1, or repeats < 1.
    """
    import torch

    if not batches or min(batches) < 1 or vocab < 1 or repeats < 1:
        raise ValueError("give batch sizes >= 1, a vocabulary >= 1 and repeats >= 1")
    rows = [
        {"setting": name, "batch": batch, **_measure(params, batch, vocab, repeats, seed)}
        for name, params in SETTINGS.items()
        for batch in batches
    ]
    config = {"batches": list(batches), "vocab": vocab, "repeats": repeats, "seed": seed,
              "settings": SETTINGS, "threads": torch.get_num_threads()}  # fmt: skip
    return {"config": config, "rows": rows}


def format_sampling_report(result: dict[str, Any]) -> str:
    """A markdown table of :func:`bench_sampling`'s result."""
    cfg = result["config"]
    lines = [
        f"Sampling step on random bf16 logits, vocabulary {cfg['vocab']:,}, "
        f"{cfg['threads']} torch threads, fastest of {cfg['repeats']} (ms per step):",
        "",
        "| setting | batch | engine: distribution | engine: draw | engine: step | plain: "
        "distribution | plain: draw | plain: step | plain / engine | same tokens kept |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for row in result["rows"]:
        ours, theirs = row["engine"], row["plain"]
        lines.append(
            f"| {row['setting']} | {row['batch']} | {ours['logprobs_ms']:.2f} | "
            f"{ours['draw_ms']:.2f} | {ours['step_ms']:.2f} | {theirs['logprobs_ms']:.2f} | "
            f"{theirs['draw_ms']:.2f} | {theirs['step_ms']:.2f} | {row['speedup']:.2f}x | "
            f"{'yes' if row['same_tokens_kept'] else 'NO'} |"
        )
    return "\n".join(lines)
