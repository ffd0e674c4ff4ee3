"""Reading a language model's exact policy under constrained decoding.

:class:`ModelReader` gives ``pi(a | s)`` for :class:`~mage_rl.eval.exploitability.Decision`
objects exactly as the engine samples: for every branch point of the answers' token trie
(a prefix after which several tokens are allowed), one forward pass over the prompt and
that prefix, as the engine prefills a constrained request, and the engine's own
:func:`~mage_rl.policy.constrained.restricted_logprobs` at the sampling temperature. An
answer's probability is the product over its branch points; forced tokens have
probability 1. :meth:`ModelReader.read` keeps the token-level parts
(:class:`ReadDecision`), from which a language-model opponent draws and records its
answer (:mod:`mage_rl.players.seat_player`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from mage_rl.players.tree_decisions import Decision
from mage_rl.policy.conversation import ConversationTemplate
from mage_rl.policy.tokenization import render_prompt


@dataclass(frozen=True)
class ReadDecision:
    """What :meth:`ModelReader.read` gives for one decision.

    Attributes:
        decision: The decision read.
        prompt_ids: The ids the engine would be asked to continue.
        answers: The token ids of each answer (``decision.choices`` order).
        branches: Answer prefix -> restricted log-prob of each allowed next token, at
            every prefix after which several tokens are allowed (forced tokens have
            probability 1 and no entry).
    """

    decision: Decision
    prompt_ids: list[int]
    answers: list[list[int]]
    branches: dict[tuple[int, ...], dict[int, float]]

    def token_logprobs(self, index: int) -> list[float]:
        """The log-prob of each token of answer ``index`` (0 where it is forced)."""
        answer = self.answers[index]
        return [self.branches.get(tuple(answer[:j]), {}).get(answer[j], 0.0)
                for j in range(len(answer))]  # fmt: skip

    @property
    def probabilities(self) -> list[float]:
        """``pi(a | s)`` of each answer: the product over its branch points."""
        return [math.exp(sum(self.token_logprobs(i))) for i in range(len(self.answers))]


class ModelReader:
    """``pi(a | s)`` of a causal LM under constrained decoding, exactly as the engine samples.

    Args:
        model: The causal LM as the engine holds it (same weights, dtype and device).
        tokenizer: Its tokenizer, with a chat template.
        temperature: The sampling temperature (> 0): constrained decoding samples from
            the restricted softmax of ``logits / temperature``.
        batch_size: Sequences per forward pass.
        progress: Called with the number of sequences each forward pass scored.

    Raises:
        ValueError: A temperature of 0 (greedy decoding plays a pure strategy that ties
            would decide; give a small positive temperature instead).
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        temperature: float,
        batch_size: int = 16,
        progress: Callable[[int], None] | None = None,
    ) -> None:
        if temperature <= 0:
            raise ValueError(
                f"temperature={temperature}: the exact policy needs a temperature above 0 "
                "(greedy decoding is the limit of small ones; try 0.05)"
            )
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.temperature = temperature
        self.batch_size = batch_size
        self.progress = progress
        self._template: Any = None

    def prompt_ids(self, decision: Decision) -> list[int]:
        """The ids the engine would be asked to continue at ``decision``."""
        from mage_rl.policy.constrained import choice_token_ids

        if decision.layout != "conversation":
            return render_prompt(self.tokenizer, list(decision.messages))
        if self._template is None:
            self._template = ConversationTemplate(self.tokenizer)
        if decision.chat is not None:
            conversation = self._template.append_messages(decision.chat, list(decision.messages))
        else:
            conversation = self._template.start(list(decision.messages))
        for reply, message in decision.turns:
            ids = choice_token_ids(self.tokenizer, [reply])[0]  # constrained: sampled as is
            conversation = self._template.append_response(conversation, ids, reply)
            conversation = self._template.append_messages(conversation, [message])
        return conversation.prompt_ids

    def __call__(self, decisions: Sequence[Decision]) -> list[list[float]]:
        return [read.probabilities for read in self.read(decisions)]

    def read(self, decisions: Sequence[Decision]) -> list[ReadDecision]:
        """Each decision's prompt ids, answer tokens and restricted log-probs at every
        branch point of the answers' token trie, in one batched scoring pass."""
        from mage_rl.policy.constrained import allowed_next, choice_token_ids

        # One job per branch point: (decision, answer prefix, prompt + prefix, allowed ids).
        jobs: list[tuple[int, tuple[int, ...], list[int], list[int]]] = []
        prompts, answers = [], []
        for i, decision in enumerate(decisions):
            prompt = self.prompt_ids(decision)
            candidates = choice_token_ids(self.tokenizer, decision.choices)
            prompts.append(prompt)
            answers.append(candidates)
            branches = {tuple(c[:j]) for c in candidates for j in range(len(c))}
            for prefix in sorted(branches):
                allowed = allowed_next(candidates, prefix)
                if len(allowed) > 1:
                    jobs.append((i, prefix, prompt + list(prefix), allowed))
        logps = self._branch_logprobs([(ids, allowed) for _, _, ids, allowed in jobs])
        at: list[dict[tuple[int, ...], dict[int, float]]] = [{} for _ in decisions]
        for (i, prefix, _, _), lp in zip(jobs, logps, strict=True):
            at[i][prefix] = lp
        return [
            ReadDecision(decision, prompt, candidates, branches)
            for decision, prompt, candidates, branches in zip(
                decisions, prompts, answers, at, strict=True
            )
        ]

    def _branch_logprobs(self, jobs: list[tuple[list[int], list[int]]]) -> list[dict[int, float]]:
        """Restricted log-probs of the allowed tokens after each sequence, in job order."""
        import torch

        from mage_rl.policy.constrained import restricted_logprobs
        from mage_rl.policy.prefill import left_pad

        device = next(self.model.parameters()).device
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        order = sorted(range(len(jobs)), key=lambda k: len(jobs[k][0]))  # little padding
        out: list[dict[int, float]] = [{} for _ in jobs]
        with torch.no_grad():
            for start in range(0, len(order), self.batch_size):
                chunk = order[start : start + self.batch_size]
                ids, mask = left_pad([jobs[k][0] for k in chunk], pad)  # (B, T)
                # Positions count real tokens only, as the engine's prefill counts them.
                positions = (mask.cumsum(-1) - 1).clamp(min=0)
                logits = self.model(
                    input_ids=ids.to(device), attention_mask=mask.to(device),
                    position_ids=positions.to(device), use_cache=False, logits_to_keep=1,
                ).logits[:, -1, :]  # (B, V)  # fmt: skip
                for row, k in enumerate(chunk):
                    allowed = jobs[k][1]
                    logp = restricted_logprobs(logits[row], self.temperature, allowed)
                    out[k] = {t: float(logp[t]) for t in allowed}
                if self.progress is not None:
                    self.progress(len(chunk))
        return out


def branch_count(decisions: Sequence[Decision], tokenizer: Any) -> int:
    """Forward-pass sequences :class:`ModelReader` scores for ``decisions`` (for progress)."""
    from mage_rl.policy.constrained import allowed_next, choice_token_ids

    n = 0
    for decision in decisions:
        candidates = choice_token_ids(tokenizer, decision.choices)
        prefixes = {tuple(c[:j]) for c in candidates for j in range(len(c))}
        n += sum(len(allowed_next(candidates, p)) > 1 for p in prefixes)
    return n
