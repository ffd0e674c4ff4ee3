"""Hardware ceiling: the learner and the engine as a share of this machine's measured peak.

The other benchmarks compare our own variants; this one says how close each is to what
the hardware can do. One run on one device (``cpu`` or ``cuda``):

1. **Peak.** A large square matmul ``C = A @ B`` (``n x n``, in the learner's compute
   dtype: bf16 under bf16 autocast, else fp32) gives the compute peak,
   ``2 n^3 / t`` FLOP/s; a large copy ``dst.copy_(src)`` of fp32 values gives the
   memory bandwidth, ``2 x bytes / t`` (every byte is read once and written once). Each
   is the fastest of several timings.
2. **Learner.** The project's :class:`~mage_rl.rl.learner.Learner` (fp32 master weights,
   AdamW, forward under autocast, a KL reference copy when ``kl_coef > 0``) runs PPO
   updates on synthetic on-policy samples, as ``mage bench learner`` does
   (:func:`~mage_rl.bench.learner.on_policy_batch`,
   :func:`~mage_rl.bench.learner.time_updates`): one warm-up, then the fastest of
   ``repeats`` updates.
3. **Engine.** The same weights, cast to the compute dtype, decode in a
   :class:`~mage_rl.policy.engine.LocalEngine` at each batch size B: B requests of
   ``prompt_len`` random prompt tokens arrive together and are prefilled in one pass
   (prefix reuse off); decoding ``N`` tokens (EOS ignored) minus decoding 1 token is the
   time of ``N - 1`` decode steps of B rows, each step a forward pass plus sampling.
   Beside it, the plainest decode loop of the same model and batch
   (:func:`~mage_rl.bench.hardware_profile.bare_decode_step`); what the engine adds
   is ``engine_over_bare``.

Arithmetic (per token; L layers, H query and K key/value heads of size D, hidden size
d, vocabulary V). ``body`` is the weight count of every linear layer but the LM head,
``head = d V``; embedding lookups, norms and activations are not counted.

* Attention of a token that sees ``c`` keys: ``4 L H D c`` FLOPs forward
  (``Q K^T`` and the weighted sum of values, 2 FLOPs per multiply-add). A causal
  sequence of T tokens sees ``(T + 1) / 2`` keys on average.
* Forward: ``2 body + 4 L H D (T + 1) / 2``, plus ``2 head`` on the positions whose
  logits are computed (the learner keeps ``response_len + 1`` per sample, not every
  prompt position). Backward costs twice the forward, so the policy's update is 3
  forwards, and the reference adds one forward when ``kl_coef > 0``:
  ``counted = (3 + [kl > 0]) x forward``. ``learner.share`` is counted FLOP/s over the
  matmul peak. The usual convention, ``6 (body + head) + 3 x attention`` per token
  (every position through the LM head, no reference pass), is reported beside it as
  ``share_6n``. Gradient checkpointing recomputes the forward; as in MFU figures, that
  recomputation is not counted.
* Decode step of B rows at context c: the step reads every weight once,
  ``(body + head) x bytes_per_value``, whatever B; ``engine.bandwidth_share`` is those
  bytes per step time over the measured copy bandwidth (1.0 means the step ran as fast
  as streaming the weights can). The key/value cache adds ``B c 2 L K D x
  bytes_per_value`` per step (``bandwidth_share_kv`` counts both); compute is
  ``B x (2 (body + head) + 4 L H D c)`` FLOPs (``compute_share``, over the matmul peak).
  ``c`` is the mean context, ``prompt_len + N / 2``.

Models: ``tiny``, ``smollm2`` (:func:`~mage_rl.policy.models.load_model`), or the shapes
``qwen3-0.6b``, ``qwen3-1.7b``, ``qwen3-4b``: randomly initialised ``Qwen3ForCausalLM``
models with the published hidden sizes, layers, heads and MLP widths, and the SmolLM2
vocabulary (49,152; weights cannot travel to a GPU machine, and throughput does not
depend on their values). On CUDA the reference copy is left out (``kl_coef`` 0) when
the model's states would not fit, and gradient checkpointing is on from 1 B parameters
(``gradient_checkpointing="auto"``); the result says what ran.
"""

from __future__ import annotations

import gc
import logging
import resource
import time
from collections.abc import Callable, Sequence
from typing import Any

from mage_rl.bench.hardware_engine import attention_flops, engine_phase
from mage_rl.bench.hardware_profile import profile_update
from mage_rl.bench.learner import _synthetic_ids, on_policy_batch, time_updates
from mage_rl.cache import cache_root
from mage_rl.provenance import cpu_model

logger = logging.getLogger(__name__)

SHAPES: dict[str, dict[str, int]] = {
    # The published configs of Qwen/Qwen3-* (and head_dim 128, tied embeddings).
    "qwen3-0.6b": {"hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
                   "num_attention_heads": 16, "num_key_value_heads": 8},
    "qwen3-1.7b": {"hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 28,
                   "num_attention_heads": 16, "num_key_value_heads": 8},
    "qwen3-4b": {"hidden_size": 2560, "intermediate_size": 9728, "num_hidden_layers": 36,
                 "num_attention_heads": 32, "num_key_value_heads": 8},
}  # fmt: skip
MODELS = ("tiny", "smollm2", *SHAPES)
SMOLLM2_VOCAB = 49152
"""Vocabulary of the SmolLM2 tokenizer, which the Qwen3 shapes use."""


def bench_hardware(
    model: str = "smollm2", device: str | None = None, dtype: str = "auto", samples: int = 16,
    prompt_len: int = 300, response_len: int = 40, kl_coef: float = 0.1,
    micro_batch_tokens: int = 8192, repeats: int = 2, batch_sizes: Sequence[int] = (1, 16, 64),
    decode_tokens: int = 32, rounds: int = 1, matmul_size: int = 0, copy_mib: int = 0,
    gradient_checkpointing: str = "auto", tokenizer: str | None = None, profile: bool = False,
    seed: int = 0, static_decode: Sequence[str] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Measure the peak, then the learner and the engine, on one device (module docstring).

    ``model``: ``tiny``, ``smollm2`` or a shape of :data:`SHAPES`; ``device``: ``cpu`` or
    ``cuda`` (default: CUDA when available); ``dtype``: the learner's forward dtype, which
    the engine's weights and the peak matmul share. ``samples`` of ``prompt_len +
    response_len`` tokens make an update (``kl_coef``, ``micro_batch_tokens`` as in
    :class:`~mage_rl.rl.learner.LearnerConfig`), timed ``repeats`` times after a warm-up.
    The engine decodes ``decode_tokens`` (>= 2) per request at each of ``batch_sizes``,
    ``rounds`` times (the fastest counts). ``matmul_size`` and ``copy_mib`` size the peak
    (0: 2048 and 512 MiB on a CPU, 8192 and 2048 MiB on CUDA); ``gradient_checkpointing``
    is ``on``, ``off`` or ``auto`` (CUDA from 1 B parameters); ``tokenizer`` is the SmolLM2
    tokenizer's folder for the Qwen3 shapes (default: the cached conversion, else the tiny
    test tokenizer, said so in the result); ``profile`` adds the top operators of one
    learner update (``torch.profiler``) and, per batch size, where a short decode spends
    its host time (:func:`~mage_rl.bench.hardware_profile.profile_decode`); ``seed``
    seeds weights, samples and prompts; ``static_decode`` lists the ways of running a
    decode step to time (:func:`~mage_rl.bench.hardware_engine.static_modes`).
    Returns ``config``, ``device``, ``peak``, ``model``, ``learner``, ``engine`` and
    ``profile``; a phase that failed (out of memory...) holds ``{"error": ...}`` instead.
    """
    config = {**locals(), "batch_sizes": list(batch_sizes)}  # the arguments
    config["static_decode"] = list(static_decode) if static_decode else None
    import torch

    from mage_rl.rl.learner import resolve_autocast_dtype

    if decode_tokens < 2 or min(batch_sizes, default=0) < 1 or min(samples, repeats) < 1:
        raise ValueError("give decode_tokens >= 2, batch sizes >= 1, samples and repeats >= 1")
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; use one of {', '.join(MODELS)}")
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    cuda = dev.type == "cuda"
    sync: Callable[[], None] = torch.cuda.synchronize if cuda else (lambda: None)
    compute = resolve_autocast_dtype(dtype, dev) or torch.float32  # type: ignore[arg-type]
    config.update(device=str(dev), torch_threads=torch.get_num_threads())
    result: dict[str, Any] = {"config": config, "device": _device_info(dev)}
    size, mib = matmul_size or (8192 if cuda else 2048), copy_mib or (2048 if cuda else 512)
    result["peak"] = peak = measure_peak(dev, compute, size, mib)

    lm, tok, source = build_model(model, dev, tokenizer=tokenizer, seed=seed)
    result["model"] = shape = {**model_arithmetic(lm), "tokenizer": source}
    try:
        result["learner"] = _learner_phase(
            lm, shape, peak, sync, profile,
            samples=samples, prompt_len=prompt_len, response_len=response_len,
            kl_coef=kl_coef, micro_batch_tokens=micro_batch_tokens, repeats=repeats,
            dtype=dtype, checkpointing=gradient_checkpointing, seed=seed,
        )  # fmt: skip
    except Exception as error:  # an out-of-memory must not cost the engine's figures
        logger.exception("bench hardware: the learner phase failed")
        result["learner"] = {"error": repr(error)}
    result["profile"] = result["learner"].pop("profile", None)
    _free(cuda)
    try:
        _checkpointing(lm, False)  # harmless when it was off
        lm = lm.to(dtype=compute).eval()
        result["engine"] = engine_phase(
            lm, tok, shape, peak, sync, batch_sizes=batch_sizes, prompt_len=prompt_len,
            decode_tokens=decode_tokens, rounds=rounds, seed=seed, profile=profile,
            modes=static_decode,
        )  # fmt: skip
    except Exception as error:
        logger.exception("bench hardware: the engine phase failed")
        result["engine"] = {"error": repr(error)}
    result["peak_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    return result


# -- models and arithmetic ---------------------------------------------------------------


def build_model(name: str, device: Any, *, tokenizer: str | None = None, seed: int = 0) -> tuple:
    """``(fp32 model on device, tokenizer, where the tokenizer came from)``."""
    import torch

    from mage_rl.policy.models import load_model

    if name not in SHAPES:
        model, tok = load_model(name, dtype="fp32", device=device, seed=seed)
        return model, tok, name
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tok, source = shape_tokenizer(tokenizer)
    config = Qwen3Config(
        vocab_size=SMOLLM2_VOCAB, head_dim=128, max_position_embeddings=40960,
        rms_norm_eps=1e-6, tie_word_embeddings=True, bos_token_id=None,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, **SHAPES[name],
    )  # fmt: skip
    torch.manual_seed(seed)
    with torch.device(device):  # initialised where it runs: seconds on a GPU
        model = Qwen3ForCausalLM(config)
    model.config.name_or_path = name
    return model.eval(), tok, source


def shape_tokenizer(path: str | None = None) -> tuple[Any, str]:
    """The SmolLM2 tokenizer (``path``, the cached conversion or ``load_model``), else the
    tiny one: only ids flow through the benchmark, and the model's vocabulary is fixed."""
    from transformers import AutoTokenizer

    from mage_rl.policy.models import SMOLLM2_CACHE_NAME, load_model

    if path:
        return AutoTokenizer.from_pretrained(path), f"smollm2 ({path})"
    cached = cache_root() / SMOLLM2_CACHE_NAME
    if (cached / "tokenizer.json").is_file():
        return AutoTokenizer.from_pretrained(cached), "smollm2"
    try:
        return load_model("smollm2", "fp32", device="cpu")[1], "smollm2"
    except ImportError:
        from mage_rl.policy.tiny import build_tiny_tokenizer

        logger.warning("SmolLM2 tokenizer not found; the tiny tokenizer stands in")
        return build_tiny_tokenizer(), "tiny (SmolLM2 tokenizer not found)"


def model_arithmetic(model: Any) -> dict[str, Any]:
    """Sizes the FLOP and byte counts need (see the module docstring)."""
    from torch import nn

    cfg = model.config
    head = model.get_output_embeddings().weight
    linear = [m.weight for m in model.modules() if isinstance(m, nn.Linear)]
    body = sum(w.numel() for w in linear if w is not head)
    heads = cfg.num_attention_heads
    return {
        "params": sum(p.numel() for p in model.parameters()), "body": body,
        "head": head.numel(), "layers": cfg.num_hidden_layers, "heads": heads,
        "kv_heads": cfg.num_key_value_heads, "hidden": cfg.hidden_size, "vocab": cfg.vocab_size,
        "head_dim": getattr(cfg, "head_dim", None) or cfg.hidden_size // heads,
    }  # fmt: skip


def update_flops(
    shape: dict[str, Any], samples: int, prompt_len: int, response_len: int, kl: bool
) -> dict[str, float]:
    """FLOPs of one learner update: ``counted`` and the ``6n`` convention."""
    length = prompt_len + response_len
    tokens = samples * length
    attention = attention_flops(shape, (length + 1) / 2)
    forward = tokens * (2.0 * shape["body"] + attention)
    forward += samples * (response_len + 1) * 2.0 * shape["head"]
    return {
        "counted": (3 + int(kl)) * forward,
        "6n": tokens * (6.0 * (shape["body"] + shape["head"]) + 3 * attention),
    }


# -- measurements ------------------------------------------------------------------------


def measure_peak(device: Any, dtype: Any, n: int, copy_mib: int, tries: int = 5) -> dict[str, Any]:
    """Fastest of ``tries`` timings of an ``n``-cube matmul and of a ``copy_mib`` copy."""
    import torch

    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    inner = 20 if cuda else 1  # GPU kernels of a millisecond are timed in a burst

    def best(op: Callable[..., Any], *tensors: Any) -> float:
        op(*tensors)  # warm-up
        times = []
        for _ in range(tries):
            start = time.perf_counter()
            for _ in range(inner):
                op(*tensors)
            sync()
            times.append((time.perf_counter() - start) / inner)
        return min(times)

    gen = torch.Generator(device=device).manual_seed(0)
    a, b = (torch.randn(n, n, device=device, dtype=dtype, generator=gen) for _ in range(2))
    matmul_s = best(lambda x, y, out: torch.matmul(x, y, out=out), a, b, torch.empty_like(a))
    del a, b
    src = torch.ones(copy_mib * 2**20 // 4, device=device)
    copy_s = best(lambda x, out: out.copy_(x), src, torch.empty_like(src))
    del src
    _free(cuda)
    return {
        "matmul_n": n, "matmul_dtype": str(dtype).removeprefix("torch."), "matmul_s": matmul_s,
        "matmul_flops_per_s": 2.0 * n**3 / matmul_s, "copy_mib": copy_mib, "copy_s": copy_s,
        "copy_bytes_per_s": 2.0 * copy_mib * 2**20 / copy_s,
    }  # fmt: skip


def _learner_phase(
    model: Any, shape: dict[str, Any], peak: dict[str, Any], sync: Callable[[], None],
    profile: bool, *, samples: int, prompt_len: int, response_len: int, kl_coef: float,
    micro_batch_tokens: int, repeats: int, dtype: Any, checkpointing: str, seed: int,
) -> dict[str, Any]:  # fmt: skip
    import torch

    from mage_rl.rl.learner import Learner, LearnerConfig

    device = next(model.parameters()).device
    cuda, notes = device.type == "cuda", []
    if cuda and kl_coef > 0:
        # fp32 weights, gradients and two Adam moments (16 bytes a parameter) plus a
        # 4-byte reference copy; drop the copy when the whole would crowd the GPU.
        total = torch.cuda.get_device_properties(device).total_memory
        if shape["params"] * 20 > 0.85 * total:
            notes.append(f"reference copy left out (kl_coef {kl_coef} -> 0): fp32 states of "
                         f"{shape['params'] * 20 / 2**30:.0f} GiB would crowd the GPU")  # fmt: skip
            kl_coef = 0.0
    ckpt = checkpointing == "on" or (checkpointing == "auto" and cuda and shape["params"] >= 1e9)
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    learner = Learner(
        model,
        LearnerConfig(lr=1e-6, kl_coef=kl_coef, mini_batch_size=samples,
                      micro_batch_tokens=micro_batch_tokens, dtype=dtype, seed=seed),
    )  # fmt: skip
    if ckpt:
        # Hugging Face checkpoints layers in training mode only; these models have no
        # dropout, so train() changes nothing else.
        _checkpointing(model, True)
        model.train()
    ids = _synthetic_ids(shape["vocab"], samples, prompt_len, response_len, seed)
    batch = on_policy_batch(learner, ids)
    tokens = sum(s.length for s in batch)
    timed = time_updates(learner, batch, repeats, sync)
    flops = update_flops(shape, samples, prompt_len, response_len, kl_coef > 0)
    update_s = timed["update_s"]
    peak_flops = peak["matmul_flops_per_s"]
    out: dict[str, Any] = {
        "autocast": str(learner.autocast_dtype or torch.float32).removeprefix("torch."),
        "kl_coef": kl_coef, "gradient_checkpointing": ckpt, "tokens_per_update": tokens,
        **timed, "tokens_per_s": tokens / update_s,
        "flops_per_update": flops["counted"], "flops_per_s": flops["counted"] / update_s,
        "share": flops["counted"] / update_s / peak_flops,
        "flops_per_update_6n": flops["6n"], "share_6n": flops["6n"] / update_s / peak_flops,
        "notes": notes,
    }  # fmt: skip
    if cuda:
        out["peak_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    try:  # a profiler that fails (no CUPTI...) must not cost the figures above
        out["profile"] = profile_update(learner, batch, sync) if profile else None
    except Exception as error:
        out["profile"] = {"error": repr(error), "ops": []}
    learner.model.eval()
    return out


def _device_info(device: Any) -> dict[str, Any]:
    import torch

    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return {"type": "cuda", "name": props.name, "memory_gib": props.total_memory / 2**30}
    return {"type": "cpu", "name": cpu_model(), "torch_threads": torch.get_num_threads()}


def _checkpointing(model: Any, on: bool) -> None:
    """Activation checkpointing on or off (transformers' new names, else the old ones)."""
    name, kwargs = ("enable", ({"use_reentrant": False},)) if on else ("disable", ())
    method = getattr(model, f"activation_checkpointing_{name}", None)
    (method or getattr(model, f"gradient_checkpointing_{name}"))(*kwargs)


def _free(cuda: bool) -> None:
    gc.collect()
    if cuda:
        __import__("torch").cuda.empty_cache()


def format_hardware_report(result: dict[str, Any]) -> str:
    """Markdown: the peak, the learner and the engine side by side, with their shares."""
    cfg, peak, dev = result["config"], result["peak"], result["device"]
    shape = result.get("model", {})
    lines = [
        f"Hardware: {dev['name']} ({cfg['device']}, {cfg['torch_threads']} torch threads); "
        f"model {cfg['model']} ({shape.get('params', 0) / 1e6:.1f} M parameters, "
        f"tokenizer {shape.get('tokenizer', '?')})",
        "",
        f"Peak: {peak['matmul_n']}-cube {peak['matmul_dtype']} matmul "
        f"{peak['matmul_flops_per_s'] / 1e9:.0f} GFLOP/s; copy of {peak['copy_mib']} MiB "
        f"{peak['copy_bytes_per_s'] / 1e9:.1f} GB/s (read + write)",
        "",
    ]
    learner = result.get("learner", {})
    if "error" in learner:
        lines.append(f"Learner: failed: {learner['error']}")
    elif learner:
        memory = learner.get("peak_memory_gib")
        lines += [
            f"Learner ({learner['autocast']} autocast, {cfg['samples']} x ({cfg['prompt_len']} "
            f"+ {cfg['response_len']}) tokens, kl_coef {learner['kl_coef']}, checkpointing "
            f"{'on' if learner['gradient_checkpointing'] else 'off'}"
            f"{f', peak {memory:.1f} GiB' if memory else ''}): "
            f"{learner['tokens_per_s']:.0f} tokens/s, {learner['update_s']:.2f} s/update, "
            f"{learner['flops_per_s'] / 1e9:.0f} GFLOP/s = {learner['share']:.0%} of the "
            f"matmul peak ({learner['share_6n']:.0%} counting 6 x parameters + attention)",
            *(f"  note: {n}" for n in learner.get("notes", [])),
        ]
    engine = result.get("engine", {})
    if "error" in engine:
        lines += ["", f"Engine: failed: {engine['error']}"]
    elif engine:
        lines += [
            f"\nEngine decode ({engine['dtype']} weights, {cfg['decode_tokens']} tokens after "
            f"{cfg['prompt_len']} prompt tokens; figures of static_decode "
            f"{engine.get('modes', ['off'])[0]}):\n",
            "| batch | ms/step | tokens/s | weights / bandwidth | weights + KV / bandwidth "
            "| compute / matmul peak | bare loop ms/step | engine / bare | ms/step by mode |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        ]
        for size, e in engine["batches"].items():
            modes = ", ".join(f"{m} {t['step_s'] * 1e3:.1f}" for m, t in e.get("modes", {}).items())
            speedup = e.get("graphs_speedup")
            modes += f" (graphs {speedup:.1f}x faster)" if speedup else ""
            lines.append(
                f"| {size} | {e['step_s'] * 1e3:.1f} | {e['tokens_per_s']:.0f} "
                f"| {e['bandwidth_share']:.0%} | {e['bandwidth_share_kv']:.0%} "
                f"| {e['compute_share']:.0%} | {e['bare_step_s'] * 1e3:.1f} "
                f"| {e['engine_over_bare']:.1f} | {modes} |"
            )
        for size, e in engine["batches"].items():
            if e.get("profile"):
                where = ", ".join(
                    f"{p['where']} {p['share']:.0%}" for p in e["profile"]["python"][:6]
                )
                lines.append(f"\nEngine thread at batch {size} (sampled): {where}")
    prof = result.get("profile")
    if prof and "error" in prof:
        lines += ["", f"Profile failed: {prof['error']}"]
    elif prof:
        lines += ["", f"Profile of one update ({prof['wall_s']:.1f} s, {prof['sorted_by']}):", ""]
        lines += ["| operator | self s | share | calls |", "|---|---:|---:|---:|"]
        lines += [
            f"| {o['op']} | {o['self_s']:.2f} | {o['share']:.0%} | {o['calls']} |"
            for o in prof["ops"]
        ]
    return "\n".join(lines)
