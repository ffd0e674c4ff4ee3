"""Embedded PyTorch learner: PPO-clip updates of a Hugging Face causal LM.

References:
    PPO (arXiv 1707.06347); SPEC.md section 6 (PPO-clip 0.2, token-mean, one epoch,
    AdamW at a constant learning rate, gradient clipping, k3 KL to the reference, entropy
    bonus 0.001); LoRA (arXiv 2106.09685).

One call to :meth:`Learner.update`:

1. Coerce and validate the samples (prompt ids, response ids, sampling log-probs, one
   advantage each; or a conversation sample, one sequence per meta-episode whose
   assistant segments carry their own); drop samples without response tokens.
2. For each PPO epoch, shuffle (seeded) and cut the samples into mini-batches of
   ``mini_batch_size`` LLM calls (a conversation sample counts one per segment and is
   never split); each mini-batch is one optimizer step. With ``old_logprobs="rescored"``,
   the old log-probs are rescored under the weights that sampled them: the first mini-batch
   reads them from its own forward pass, the later ones from one no-grad pass taken
   before the first step.
3. Pack each mini-batch into micro-batches under ``micro_batch_tokens`` padded tokens.
   Each micro-batch runs one right-padded forward pass; the log-prob of response token j
   is read from the logits at position ``len(prompt) - 1 + j`` (in a conversation, the
   position before each segment token), after dividing the logits by the sampling
   temperature.
4. Loss per micro-batch: PPO-clip surrogate + ``kl_coef`` * k3 KL to the reference -
   ``entropy_coef`` * entropy, each a token sum divided by the token count of the whole
   mini-batch, so accumulated gradients equal the mini-batch token mean exactly.
5. Clip the gradient norm, take an AdamW step.

The policy runs in eval mode (dropout off), so that on fresh on-policy samples the ratio
is exactly 1 up to numerics. Master weights stay in float32; ``dtype="bf16"`` only
autocasts the forward pass.
"""

from __future__ import annotations

import logging
import math
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any, Literal

import torch
from torch import nn

from mage_rl.policy.constrained import mixture_logprobs
from mage_rl.rl.batching import (
    MicroBatch,
    TrainingSample,
    behaviour_logprobs,
    coerce_sample,
    collate,
    collate_tree,
    sequence_ids,
)
from mage_rl.rl.checkpoint import LearnerCheckpoints
from mage_rl.rl.loss import (
    entropy_from_logits,
    gather_logprobs,
    kl_penalty,
    policy_loss,
    token_mean,
)
from mage_rl.rl.loss_terms import LOSS_TERMS, LossInputs
from mage_rl.rl.model_setup import (
    accepts_logits_to_keep,
    accepts_tree_mask,
    attend_along_paths,
    make_reference,
    prepare_policy,
    resolve_autocast_dtype,
)
from mage_rl.rl.packing import cut_mini_batches, pack_micro_batches
from mage_rl.rl.prefix_tree import pack_tree_batches
from mage_rl.sections import LearnerConfig

logger = logging.getLogger(__name__)

OldLogprobs = Literal["recorded", "rescored"]
"""Where :meth:`Learner.update` takes PPO's old log-probs from."""


class Learner(LearnerCheckpoints):
    """PPO-clip learner around a Hugging Face causal LM (full fine-tuning or LoRA).

    Args:
        model: A causal LM whose ``forward(input_ids, attention_mask)`` returns
            ``.logits`` of shape ``(B, T, V)``. It is trained in place (wrapped with LoRA
            adapters when ``config.lora``; use :attr:`model` afterwards).
        config: Optimization settings.
        ref_model: Frozen reference policy for the KL loss. When ``kl_coef > 0`` and none
            is given, a deep copy of ``model`` is made (full fine-tuning) or the base
            model with adapters disabled is used (LoRA).
    """

    def __init__(
        self,
        model: nn.Module,
        config: LearnerConfig | None = None,
        ref_model: nn.Module | None = None,
    ) -> None:
        self.config = config or LearnerConfig()
        # HF and PEFT models add methods (save_pretrained, disable_adapter) that nn.Module
        # does not declare, so the attribute is typed loosely.
        self.model: Any = prepare_policy(model, self.config)
        self.device = next(self.model.parameters()).device
        self.autocast_dtype = resolve_autocast_dtype(self.config.dtype, self.device)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        if not self.params:
            raise ValueError("the model has no trainable parameters (all requires_grad=False)")
        self.optimizer = torch.optim.AdamW(
            self.params,
            lr=self.config.lr,
            betas=self.config.betas,
            eps=self.config.adam_eps,
            weight_decay=self.config.weight_decay,
            # One fused kernel per step instead of a loop of tensor ops: about 3x faster
            # on a CPU, the same update.
            fused=self.device.type in ("cpu", "cuda"),
        )
        self.ref_model = make_reference(self.model, ref_model, self.config)
        self.step = 0
        self._generator = torch.Generator().manual_seed(self.config.seed)
        # Tokens fed to the model (padding or tree nodes included), counted by every pass.
        self.fed_tokens = 0
        self._keep_logits = {id(self.model): accepts_logits_to_keep(self.model)}
        # Prefix trees need an attention that takes a custom (N, N) mask; a reference
        # model must take it too, since it scores the same batches.
        scorers = [m for m in (self.model, self.ref_model) if m is not None]
        self.tree = self.config.prefix_tree and all(accepts_tree_mask(m) for m in scorers)
        if self.tree:  # trees that share little attend along their paths
            for m in scorers:
                attend_along_paths(m)
        if self.ref_model is not None:
            self._keep_logits[id(self.ref_model)] = accepts_logits_to_keep(self.ref_model)

    # ---- set-up --------------------------------------------------------------------

    def _autocast(self) -> Any:
        if self.autocast_dtype is None:
            return nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.autocast_dtype)

    # ---- forward -------------------------------------------------------------------

    def _response_logits(
        self, model: nn.Module, batch: MicroBatch, temperature: float
    ) -> torch.Tensor:
        """Logits that predict each response token, divided by the temperature: ``(B, R, V)``."""
        width = batch.input_ids.shape[1]
        kwargs: dict[str, Any] = {}
        if batch.tree:
            rows, trained = batch.positions.shape
            keep = batch.positions.reshape(1, -1)
            if self._keep_logits.get(id(model)):
                kwargs["logits_to_keep"] = keep
            if batch.tree_paths is not None:
                kwargs["tree_paths"] = batch.tree_paths
            with self._autocast():
                out = model(
                    input_ids=batch.input_ids,
                    attention_mask=batch.attention_mask,
                    position_ids=batch.position_ids,
                    use_cache=False,
                    **kwargs,
                )
            logits = out.logits
            if logits.shape[1] != keep.shape[1]:  # the model returned every node's logits
                logits = logits[:, keep[0]]
            return logits.reshape(rows, trained, -1).float() / temperature
        if batch.conversation and self._keep_logits.get(id(model), False):
            # A conversation's trained positions are scattered between long stretches of
            # context: ask for the logits of exactly those, (B, R, V), rather than of
            # every position after the first prompt.
            with self._autocast():
                out = model(
                    input_ids=batch.input_ids,
                    attention_mask=batch.attention_mask,
                    use_cache=False,
                    logits_to_keep=batch.positions,
                )
            return out.logits.float() / temperature
        if self._keep_logits.get(id(model), False):
            # Logits of positions before the shortest prompt's last token are never used.
            kwargs["logits_to_keep"] = width - batch.min_prompt_len + 1
        with self._autocast():
            out = model(
                input_ids=batch.input_ids,
                attention_mask=batch.attention_mask,
                use_cache=False,
                **kwargs,
            )
        logits = out.logits  # (B, K, V), K = kept positions at the end of the sequence
        offset = width - logits.shape[1]
        index = (batch.positions - offset).clamp(min=0)  # (B, R); padding reads position 0
        vocab = logits.shape[-1]
        picked = logits.gather(1, index.unsqueeze(-1).expand(-1, -1, vocab))  # (B, R, V)
        return picked.float() / temperature

    @contextmanager
    def _reference(self) -> Iterator[nn.Module]:
        if self.ref_model is not None:
            yield self.ref_model
        elif self.config.lora:
            with self.model.disable_adapter():
                yield self.model
        else:
            raise RuntimeError("kl_coef > 0 but the learner holds no reference model")

    def _reference_logprobs(self, batch: MicroBatch, temperature: float) -> torch.Tensor:
        with torch.no_grad(), self._reference() as ref:
            logits = self._response_logits(ref, batch, temperature)
            return gather_logprobs(logits, batch.response_ids, batch.allowed_index)

    @staticmethod
    def _prepare_samples(samples: Iterable[Any]) -> list[TrainingSample]:
        prepared = []
        for i, item in enumerate(samples):
            sample = coerce_sample(item)
            sample.validate(i)
            if sample.num_response_tokens:
                prepared.append(sample)
        return prepared

    def _micro_batches(
        self, items: Sequence[TrainingSample]
    ) -> Iterator[tuple[list[int], MicroBatch]]:
        """The forward passes over ``items``: indices into it, and their batch on the
        learner's device. Packed as prefix trees of at most ``micro_batch_tokens`` nodes
        when :attr:`tree` is on, else right-padded rows under that many padded tokens."""
        budget = self.config.micro_batch_tokens
        if self.tree:
            sequences = [sequence_ids(s) for s in items]
            groups = pack_tree_batches(sequences, budget)
        else:
            groups = pack_micro_batches([s.length for s in items], budget)
        pack = collate_tree if self.tree else collate
        for group in groups:
            batch = pack([items[i] for i in group])
            self.fed_tokens += batch.input_ids.numel()
            yield group, batch.to(self.device)

    def _mini_batches(self, items: Sequence[TrainingSample]) -> list[list[int]]:
        """Shuffle (seeded) and cut the samples into mini-batches of ``mini_batch_size``
        calls; each mini-batch is a list of indices into ``items``."""
        cfg = self.config
        if cfg.shuffle:
            order = torch.randperm(len(items), generator=self._generator).tolist()
        else:
            order = list(range(len(items)))
        return cut_mini_batches(order, [s.num_calls for s in items], cfg.mini_batch_size)

    def _refresh_later(
        self,
        items: list[TrainingSample],
        groups: list[list[int]],
        explore: float,
        temperature: float | None,
    ) -> None:
        """Rescore the old log-probs of every mini-batch after the first, in place."""
        later = [i for group in groups[1:] for i in group]
        if not later:
            return
        fresh = self.compute_logprobs([items[i] for i in later], temperature)
        for i, logprobs in zip(later, fresh, strict=True):
            items[i] = items[i].with_old_logprobs(behaviour_logprobs(items[i], logprobs, explore))

    # ---- public API ----------------------------------------------------------------

    @torch.no_grad()
    def compute_logprobs(
        self, samples: Sequence[Any], temperature: float | None = None
    ) -> list[list[float]]:
        """Log-probs of each sample's response tokens under the current policy.

        Useful to fill ``old_logprobs`` when a backend cannot, and in tests. Only the ids
        and ``allowed`` (constrained positions are scored under the restricted softmax) of
        the samples are read. A conversation sample gets the log-probs of its segments'
        tokens, concatenated in segment order.
        """
        temp = self.config.temperature if temperature is None else temperature
        items = [coerce_sample(s) for s in samples]
        out: list[list[float]] = [[] for _ in items]
        nonempty = [i for i, s in enumerate(items) if s.num_response_tokens]
        # Only the ids matter here; zero log-probs and advantages fill the batch.
        for group, batch in self._micro_batches([items[i].ids_only() for i in nonempty]):
            chosen = [nonempty[g] for g in group]
            logits = self._response_logits(self.model, batch, temp)
            logp = gather_logprobs(logits, batch.response_ids, batch.allowed_index)
            for row, i in enumerate(chosen):
                out[i] = logp[row, : items[i].num_response_tokens].tolist()
        return out

    def accumulate_gradients(
        self,
        samples: Sequence[Any],
        num_tokens: int | None = None,
        temperature: float | None = None,
    ) -> dict[str, float]:
        """Forward and backward passes over micro-batches, adding into ``.grad``.

        No optimizer step is taken. :meth:`update` calls this once per mini-batch; it is
        public for gradient checks and custom loops.

        Args:
            samples: :class:`Sample` or :class:`ConversationSample` objects, or 4-tuples.
            num_tokens: Token-mean denominator; defaults to the response tokens of
                ``samples`` (pass the whole mini-batch's count when ``samples`` is part
                of it).
            temperature: Sampling temperature of the rollouts (default: config).

        Returns:
            Loss terms and statistics, each a token sum divided by ``num_tokens``:
            ``loss``, ``pg_loss``, ``kl``, ``entropy``, ``clip_frac``, ``approx_kl``, and
            ``free_frac``, the share of response tokens where more than one token was
            allowed (1 without constrained decoding).
        """
        items = self._prepare_samples(samples)
        total = num_tokens if num_tokens is not None else sum(s.num_response_tokens for s in items)
        return self._accumulate(items, total, temperature, None)[0]

    def _accumulate(
        self,
        items: Sequence[TrainingSample],
        total: int,
        temperature: float | None,
        refresh_old: float | None,
    ) -> tuple[dict[str, float], list[list[float]]]:
        """:meth:`accumulate_gradients` over prepared samples.

        With ``refresh_old`` (an exploration share), each sample's old log-probs are taken
        from this forward pass (detached, mixed as :func:`behaviour_logprobs` does) instead
        of its own; they are returned, indexed like ``items``, so later epochs reuse them.
        """
        cfg = self.config
        temp = cfg.temperature if temperature is None else temperature
        stats: dict[str, float] = defaultdict(float)
        refreshed: list[list[float]] = [[] for _ in items]
        for group, batch in self._micro_batches(items):
            logits = self._response_logits(self.model, batch, temp)  # (B, R, V)
            logp = gather_logprobs(logits, batch.response_ids, batch.allowed_index)  # (B, R)
            old = batch.old_logprobs
            if refresh_old is not None:
                old = logp.detach()
                if batch.allowed_index is not None:
                    n_allowed = (batch.allowed_index >= 0).sum(-1)
                    old = mixture_logprobs(old, n_allowed, refresh_old)
                for row, i in enumerate(group):
                    refreshed[i] = old[row, : items[i].num_response_tokens].tolist()
            pg_loss, pg_stats = policy_loss(
                logp, old, batch.advantages, batch.mask, cfg.clip_eps, total
            )
            loss = pg_loss
            if cfg.entropy_coef > 0:
                entropy = token_mean(
                    entropy_from_logits(logits, batch.allowed_index), batch.mask, total
                )
                loss = loss - cfg.entropy_coef * entropy
                entropy = entropy.detach()
            else:
                with torch.no_grad():
                    entropy = token_mean(
                        entropy_from_logits(logits.detach(), batch.allowed_index), batch.mask, total
                    )
            if cfg.kl_coef > 0:
                ref_logp = self._reference_logprobs(batch, temp)
                kl = token_mean(kl_penalty(logp, ref_logp, cfg.kl_kind), batch.mask, total)
                loss = loss + cfg.kl_coef * kl
                stats["kl"] += kl.item()
            for name in cfg.loss_terms:  # registered extra terms (mage_rl.rl.loss_terms)
                term = LOSS_TERMS.get(name)(LossInputs(logits, logp, old,
                    batch.advantages, batch.mask, batch.allowed_index, total))  # fmt: skip
                loss = loss + term
                stats[f"term/{name}"] += term.item()
            loss.backward()
            free = batch.mask
            if batch.allowed_index is not None:
                forced = (batch.allowed_index >= 0).sum(-1) == 1  # (B, R)
                free = free * (~forced).to(free.dtype)
            stats["free_frac"] += float(free.sum()) / total
            stats["loss"] += loss.item()
            stats["pg_loss"] += pg_loss.item()
            stats["entropy"] += entropy.item()
            for name, value in pg_stats.items():
                stats[name] += value.item()
        stats.setdefault("kl", 0.0)
        return dict(stats), refreshed

    def update(
        self,
        samples: Sequence[Any],
        temperature: float | None = None,
        old_logprobs: OldLogprobs = "recorded",
        explore: float = 0.0,
    ) -> dict[str, float]:
        """One PPO update over a batch of samples.

        Args:
            samples: :class:`Sample` objects or ``(prompt_ids, response_ids, old_logprobs,
                advantage)`` tuples, the advantage applying to every response token; or
                :class:`ConversationSample` objects (one per meta-episode), each segment
                with its own advantage. The token mean runs over every trained token of a
                mini-batch, so a conversation trains exactly as its calls would one by one.
            temperature: Sampling temperature of the rollouts (default:
                ``config.temperature``).
            old_logprobs: Where PPO's old log-probs come from. ``"recorded"``: each
                sample's own, as the sampler recorded them. ``"rescored"``: the policy's
                under the current weights (those that sampled the batch), turned into the
                behaviour policy's with ``explore``; use it when the sampler's numerics
                differ from the learner's (a bf16 engine). The first mini-batch takes them
                from its own forward pass, so rescoring costs one no-grad pass over the
                later mini-batches only, none when the batch is one mini-batch.
            explore: The behaviour policy's exploration share (``policy.explore``,
                :func:`~mage_rl.policy.constrained.mixture_logprobs`), applied to
                rescored log-probs; recorded ones are already the mixture's.

        Returns:
            Statistics: ``loss``, ``pg_loss``, ``kl``, ``entropy``, ``clip_frac``,
            ``approx_kl`` (token-weighted means over all mini-batches), ``grad_norm`` (mean
            pre-clip norm over optimizer steps), ``steps``, ``skipped_steps`` (non-finite
            gradients), ``tokens`` (response tokens trained on), ``tokens_per_s`` (prompt
            and response tokens through the learner per second), ``sample_tokens`` (those
            tokens: the samples' lengths summed over the update's passes),
            ``fed_tokens`` (what the model computed for them in every pass, the rescoring
            pass included: padded rows, or the nodes of prefix trees), ``entropy_free`` (the mean
            entropy of the positions where more than one token was allowed; ``entropy``
            without constrained decoding), ``lr``, and ``term/<name>`` for each registered
            loss term.
        """
        self._check_not_released()
        if old_logprobs not in ("recorded", "rescored"):
            raise ValueError(f"old_logprobs must be 'recorded' or 'rescored', got {old_logprobs!r}")
        refresh_old = explore if old_logprobs == "rescored" else None
        cfg = self.config
        items = self._prepare_samples(samples)
        keys = ("loss", "pg_loss", "kl", "entropy", "clip_frac", "approx_kl")
        counters = ("grad_norm", "steps", "skipped_steps", "tokens", "tokens_per_s",
                    "sample_tokens", "fed_tokens")  # fmt: skip
        result: dict[str, float] = dict.fromkeys((*keys, "entropy_free", *counters), 0.0)
        if not items:
            logger.warning("Learner.update got no samples with response tokens; nothing to do")
            return result
        max_norm = cfg.max_grad_norm if cfg.max_grad_norm > 0 else math.inf
        start = time.perf_counter()
        fed_before = self.fed_tokens
        weighted: dict[str, float] = defaultdict(float)
        grad_norms: list[float] = []
        seen_tokens = 0
        trained_tokens = 0
        for epoch in range(cfg.ppo_epochs):
            groups = self._mini_batches(items)
            for k, group in enumerate(groups):
                refresh = refresh_old if epoch == 0 and k == 0 else None
                if refresh is not None:
                    self._refresh_later(items, groups, refresh, temperature)
                mini = [items[i] for i in group]
                n_tokens = sum(s.num_response_tokens for s in mini)
                self.optimizer.zero_grad(set_to_none=True)
                stats, refreshed = self._accumulate(mini, n_tokens, temperature, refresh)
                if refresh is not None:
                    for i, logprobs in zip(group, refreshed, strict=True):
                        items[i] = items[i].with_old_logprobs(logprobs)
                grad_norm = self._optimizer_step(max_norm)
                result["steps" if math.isfinite(grad_norm) else "skipped_steps"] += 1
                grad_norms.append(grad_norm)
                for name in (*keys, "free_frac", *(f"term/{t}" for t in cfg.loss_terms)):
                    weighted[name] += stats.get(name, 0.0) * n_tokens
                trained_tokens += n_tokens
                seen_tokens += sum(s.length for s in mini)
        elapsed = max(time.perf_counter() - start, 1e-9)
        for name in (*keys, *(f"term/{t}" for t in cfg.loss_terms)):
            result[name] = weighted[name] / trained_tokens
        # Forced positions have entropy 0, so the free positions' mean is the token sum
        # over the free count.
        free = weighted["free_frac"]
        result["entropy_free"] = weighted["entropy"] / free if free > 0 else 0.0
        result["grad_norm"] = sum(grad_norms) / len(grad_norms)
        result["lr"] = float(self.optimizer.param_groups[0]["lr"])
        result["tokens"] = float(trained_tokens)
        result["tokens_per_s"] = seen_tokens / elapsed
        result["sample_tokens"] = float(seen_tokens)
        result["fed_tokens"] = float(self.fed_tokens - fed_before)
        return result

    def _optimizer_step(self, max_norm: float) -> float:
        """Clip the accumulated gradient and step, unless its norm is not finite; clear
        the gradient either way. Returns the norm before clipping."""
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, max_norm))
        if math.isfinite(grad_norm):
            self._set_lr()
            self.optimizer.step()
            self.step += 1
        else:
            logger.warning("non-finite gradient norm %s; optimizer step skipped", grad_norm)
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm

    def release_training_state(self) -> None:
        """Free what only later updates need (AdamW's moments, gradients), at the end of
        training: about 8 bytes per trained parameter. The weights stay; :meth:`update`
        and :meth:`save` refuse afterwards, since the moments are gone."""
        self.optimizer.zero_grad(set_to_none=True)
        self.optimizer.state.clear()
        self.released = True

    def _check_not_released(self) -> None:
        if getattr(self, "released", False):
            raise RuntimeError(
                "the learner's optimizer state was released at the end of training; build "
                "a new Learner (or load a checkpoint) to train or save again"
            )

    def _set_lr(self) -> None:
        """The learning rate of the next optimizer step (linear warm-up, then ``lr``)."""
        warmup = self.config.lr_warmup_steps
        lr = self.config.lr * min(1.0, (self.step + 1) / warmup) if warmup else self.config.lr
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def state_dict_for_inference(self) -> dict[str, torch.Tensor]:
        """Weights for a rollout engine (``engine.update_weights(sd)``), HF key names.

        Full fine-tuning returns the model's own (detached) tensors, which share storage
        with the training weights: copy them before modifying. With LoRA, every adapted
        weight is returned merged, ``W + scale * B @ A``, as a new tensor, and adapter
        parameters are left out; the training model is not modified.
        """
        if not self.config.lora:
            return {k: v.detach() for k, v in self.model.state_dict().items()}
        from peft.tuners.lora import LoraLayer

        base = self.model.get_base_model()
        deltas: dict[str, torch.Tensor] = {}
        with torch.no_grad():
            for name, module in base.named_modules():
                if isinstance(module, LoraLayer) and not module.merged:
                    adapters = [a for a in module.active_adapters if a in module.lora_A]
                    if adapters:
                        layer: Any = module
                        delta = [layer.get_delta_weight(a) for a in adapters]
                        deltas[f"{name}.weight"] = torch.stack(delta).sum(dim=0)
            merged = {}
            for key, value in base.state_dict().items():
                if "lora_" in key:
                    continue
                clean = key.replace(".base_layer.", ".")
                tensor = value.detach()
                if clean in deltas:
                    tensor = tensor + deltas[clean].to(tensor.dtype)
                merged[clean] = tensor
        return merged
