"""Learner cost of the conversation prompt layout versus re-rendered per-call prompts.

What it measures, for one game and prompt style:

1. Play ``meta_episodes`` synthetic meta-episodes of K episodes with the real text
   environment and a seeded random legal agent (every episode is played, as if no
   episode were won early). Responses are synthetic text of the configured lengths: a
   constrained ``<action>...</action>`` for the compact style (Kuhn's set-up), a short
   thought and the action for the standard style, ``<remark>...</remark>`` for the
   reflect calls between episodes.
2. Lay every meta-episode out twice with the model's tokenizer:
   *re-rendered*, one :class:`~mage_rl.rl.batching.Sample` per call whose prompt is the
   chat that :mod:`mage_rl.nodes.prompts` builds for it (as the graph nodes do, with the
   ``reflection`` context); *conversation*, one
   :class:`~mage_rl.rl.batching.ConversationSample` grown with
   :class:`~mage_rl.policy.conversation.ConversationTemplate`: the first call's chat,
   then per call the response, and before the next call one user message (the new state,
   from the same prompt functions with no history, memory or moves since the chat holds
   them; or the reflect request). Both layouts train the same response tokens with the
   same advantages.
3. Time one warm-up and ``repeats`` timed :meth:`~mage_rl.rl.learner.Learner.update`
   calls per layout, each layout with its own learner from a fresh copy of the weights
   and the learner settings of ``configs/kuhn_smollm2.yaml`` (KL to a reference copy,
   entropy bonus). The layouts take turns (warm-up of each, then one timed update of
   each per round), so that load from other processes falls on both alike; the fastest
   timed update counts.

The messages the conversation layout sends between calls are this module's choice; the
graph nodes may word them differently, which moves the token counts a little.
"""

from __future__ import annotations

import gc
import logging
import random
import time
from dataclasses import dataclass
from typing import Any

from mage_rl.rl.conversation import ConversationSample, Segment

logger = logging.getLogger(__name__)

OPPONENTS = {"kuhn_poker": "kuhn_poker:intermediate", "tic_tac_toe": "tic_tac_toe:random"}
_FILLER_TEXT = (
    "the opponent bet early so i think they hold a strong card and i should play safe "
    "next time because a pass keeps the pot small while a bet wins when they fold"
)


@dataclass
class _Call:
    """One LLM call of a synthetic meta-episode."""

    messages: list[dict[str, str]]  # the re-rendered layout's chat
    follow_up: list[dict[str, str]]  # what the conversation appends before it (first: none)
    response: str


def _filler(rng: random.Random, words: int) -> str:
    words_ = _FILLER_TEXT.split()
    return " ".join(rng.choice(words_) for _ in range(words))


def _meta_episode_calls(
    game: str, prompt: str, episodes: int, seed: int, play_words: int, reflect_words: int
) -> list[_Call]:
    """The calls of one meta-episode played by a seeded random legal agent."""
    from mage_rl.envs import make_env
    from mage_rl.nodes.prompts import (
        PastEpisode,
        compact_play_messages,
        play_messages,
        reflect_messages,
    )

    rng = random.Random(seed)
    env = make_env(game, OPPONENTS[game], seat=rng.randrange(2))
    calls: list[_Call] = []
    memory: list[str] = []
    history: list[PastEpisode] = []
    for k in range(episodes):
        if k:
            finished = history[-1]
            chat = reflect_messages(
                task_description=env.task_description,
                finished=finished,
                num_episodes=episodes,
                memory=memory,
            )
            request = reflect_messages(
                task_description=env.task_description,
                finished=finished,
                num_episodes=episodes,
                memory=[],
            )
            remark = _filler(rng, reflect_words)
            calls.append(_Call(chat, [request[1]], f"<remark>{remark}</remark>"))
            memory.append(remark)
        observation = env.reset(seed * 100 + k)
        done = False
        while not done:
            if prompt == "compact":
                # The graph's compact prompt: no moves, the brief observation.
                brief = env.brief_observation or observation
                chat, step = (
                    compact_play_messages(
                        brief_description=env.brief_description,
                        episode=k,
                        num_episodes=episodes,
                        context=context,
                        memory=mem,
                        history=past,
                        moves=[],
                        observation=brief,
                    )
                    for context, mem, past in (("reflection", memory, history), ("none", [], []))
                )
            else:
                chat, step = (
                    play_messages(
                        task_description=env.task_description,
                        episode=k,
                        num_episodes=episodes,
                        context=context,
                        memory=mem,
                        history=past,
                        initial_observation=env.initial_observation,
                        moves=moves,
                        observation=observation,
                    )
                    for context, mem, past, moves in (
                        ("reflection", memory, history, list(env.transcript)),
                        ("none", [], [], []),
                    )
                )
            action = f"<action>{rng.choice(env.legal_actions())}</action>"
            response = (
                action if prompt == "compact" else f"Thought: {_filler(rng, play_words)}. {action}"
            )
            calls.append(_Call(chat, [step[1]], response))
            result = env.step(action)
            observation, done = result.observation, result.done
        outcome = result.info.outcome or "unfinished"
        history.append(
            PastEpisode(
                index=k,
                initial_observation=env.initial_observation,
                moves=list(env.transcript),
                feedback=result.info.feedback,
                outcome=outcome,
                brief=env.brief_summary,
            )
        )
    calls[0].follow_up = []
    return calls


def build_layouts(
    tokenizer: Any,
    game: str,
    prompt: str,
    episodes: int,
    meta_episodes: int,
    seed: int = 0,
    max_play_tokens: int = 32,
    max_reflect_tokens: int = 64,
) -> tuple[list[Any], list[Any]]:
    """The same synthetic meta-episodes as per-call samples and as conversation samples.

    Returns:
        ``(per_call, conversations)``; log-probs are zeros (score them before training).
    """
    import torch

    from mage_rl.policy.conversation import ConversationTemplate
    from mage_rl.policy.tokenization import render_prompt
    from mage_rl.rl.batching import ConversationSample, Sample, Segment

    template = ConversationTemplate(tokenizer)
    gen = torch.Generator().manual_seed(seed)
    per_call: list[Sample] = []
    conversations: list[ConversationSample] = []
    for m in range(meta_episodes):
        # About 1.3 tokens per filler word: the thought and the remark stay within their
        # limits, so every response is whole (it ends with its closing tag).
        calls = _meta_episode_calls(
            game, prompt, episodes, seed * 1000 + m, max_play_tokens // 3, max_reflect_tokens // 2
        )
        conv = template.start(calls[0].messages)
        segments = []
        for i, call in enumerate(calls):
            limit = max_reflect_tokens if call.response.startswith("<remark>") else max_play_tokens
            response = template.encode(call.response)[:limit]
            advantage = float(torch.randn(1, generator=gen))
            zeros = [0.0] * len(response)
            per_call.append(
                Sample(render_prompt(tokenizer, call.messages), response, zeros, advantage)
            )
            if i:
                conv = template.append_messages(conv, call.follow_up)
            start = len(conv.ids)
            conv = template.append_response(conv, response, call.response)
            segments.append(Segment(start, len(conv.ids), zeros, advantage))
        conversations.append(ConversationSample(list(conv.ids), segments))
    return per_call, conversations


def bench_conversation(
    model: str = "smollm2",
    game: str = "kuhn_poker",
    prompt: str = "compact",
    episodes: int = 3,
    meta_episodes: int = 4,
    seed: int = 0,
    repeats: int = 1,
    dtype: str = "auto",
    kl_coef: float = 0.1,
    micro_batch_tokens: int = 8192,
    max_play_tokens: int = 32,
    max_reflect_tokens: int = 64,
) -> dict[str, Any]:
    """Learner tokens and seconds per update, conversation versus re-rendered layout.

    Args:
        model: Model spec for :func:`~mage_rl.policy.models.load_model`.
        game: ``kuhn_poker`` or ``tic_tac_toe``.
        prompt: ``compact`` or ``standard`` play prompts.
        episodes: K.
        meta_episodes: Meta-episodes per update (one mini-batch, one optimizer step).
        seed: Seed of the synthetic play, responses and advantages.
        repeats: Timed updates per layout after one warm-up.
        dtype: Learner forward dtype (``auto``, ``bf16``, ``fp32``).
        kl_coef: KL weight (a reference copy and one more forward pass when > 0).
        micro_batch_tokens: Padded tokens per forward pass.
        max_play_tokens: Response limit of play calls (the standard style's thought is cut
            to it).
        max_reflect_tokens: Response limit of reflect calls.

    Returns:
        ``{"config": {...}, "layouts": {name: {...}}, "ratios": {...}}``; each layout has
        ``samples``, ``calls``, ``tokens_per_meta_episode`` (tokens fed to the model),
        ``trained_tokens_per_meta_episode``, ``longest_sequence``, ``warmup_s``,
        ``update_s`` (fastest timed update) and ``repeat_s``; the layouts are
        ``re-rendered``, ``re-rendered, response logits only`` (the same samples, the
        learner computing only the logits it reads) and ``conversation``. ``ratios``
        divide the re-rendered figures by the conversation ones.
    """
    import torch

    from mage_rl.policy.models import load_model

    if game not in OPPONENTS or prompt not in ("compact", "standard"):
        raise ValueError(
            f"game must be one of {sorted(OPPONENTS)} and prompt 'compact' or 'standard', "
            f"got {game!r}, {prompt!r}"
        )
    lm, tokenizer = load_model(model, dtype="fp32")
    per_call, conversations = build_layouts(
        tokenizer, game, prompt, episodes, meta_episodes, seed, max_play_tokens, max_reflect_tokens
    )
    del lm
    # The per-call samples again, each as a one-segment conversation sample: the same
    # training, but the learner asks the model for the logits of the response positions
    # only (as it does for conversations) rather than of every position after the
    # shortest prompt of a micro-batch. It separates what the layout saves from what
    # that saves.
    as_segments = [
        ConversationSample(
            [*s.prompt_ids, *s.response_ids],
            [Segment(len(s.prompt_ids), s.length, s.old_logprobs, s.advantage)],
        )
        for s in per_call
    ]
    layouts = {
        "re-rendered": per_call,
        "re-rendered, response logits only": as_segments,
        "conversation": conversations,
    }
    results = time_updates(
        model, layouts, meta_episodes, repeats=repeats, dtype=dtype, kl_coef=kl_coef,
        micro_batch_tokens=micro_batch_tokens, seed=seed,
    )  # fmt: skip
    rr, conv = results["re-rendered"], results["conversation"]
    lean = results["re-rendered, response logits only"]
    return {
        "config": {
            "model": model,
            "game": game,
            "prompt": prompt,
            "episodes": episodes,
            "meta_episodes": meta_episodes,
            "seed": seed,
            "repeats": repeats,
            "dtype": dtype,
            "kl_coef": kl_coef,
            "micro_batch_tokens": micro_batch_tokens,
            "max_play_tokens": max_play_tokens,
            "max_reflect_tokens": max_reflect_tokens,
            "torch_threads": torch.get_num_threads(),
        },
        "layouts": results,
        "ratios": {
            "tokens": rr["tokens_per_meta_episode"] / conv["tokens_per_meta_episode"],
            "update_s": rr["update_s"] / conv["update_s"],
            "update_s_response_logits_only": lean["update_s"] / conv["update_s"],
        },
    }


def time_updates(
    model: str,
    layouts: dict[str, list[Any]],
    meta_episodes: int,
    *,
    repeats: int = 1,
    dtype: str = "auto",
    kl_coef: float = 0.1,
    micro_batch_tokens: int = 8192,
    seed: int = 0,
) -> dict[str, dict[str, Any]]:
    """Time one learner update per set of samples: a warm-up, then ``repeats`` timed ones.

    Each set gets its own :class:`~mage_rl.rl.learner.Learner` on a fresh fp32 copy of
    ``model`` (a mini-batch as large as the largest set, so one optimizer step per
    update), its old log-probs recomputed by that learner. The updates alternate between the sets
    (all warm-ups, then one timed update of each per round), so that load from other
    processes falls on all alike.

    Returns:
        Per set: ``samples``, ``calls``, ``tokens_per_meta_episode`` (tokens fed to the
        model), ``longest_sequence``, ``warmup_s``, ``trained_tokens_per_meta_episode``,
        ``steps``, ``repeat_s`` and ``update_s`` (the fastest timed update, or the
        warm-up when ``repeats`` is 0).
    """
    from mage_rl.policy.models import load_model
    from mage_rl.rl.learner import Learner, LearnerConfig

    learners, batches, results = {}, {}, {}
    largest = max(len(samples) for samples in layouts.values())
    for name, samples in layouts.items():
        lm, _ = load_model(model, dtype="fp32")
        config = LearnerConfig(
            lr=1e-6,
            kl_coef=kl_coef,
            mini_batch_size=largest,
            micro_batch_tokens=micro_batch_tokens,
            dtype=dtype,  # type: ignore[arg-type]
            seed=seed,
        )
        learners[name] = Learner(lm, config)
        old = learners[name].compute_logprobs(samples)
        batches[name] = [s.with_old_logprobs(lp) for s, lp in zip(samples, old, strict=True)]
        batch = batches[name]
        results[name] = {
            "samples": len(batch),
            "calls": sum(s.num_calls for s in batch),
            "tokens_per_meta_episode": sum(s.length for s in batch) / meta_episodes,
            "longest_sequence": max(s.length for s in batch),
            "repeat_s": [],
        }
    for round_ in range(repeats + 1):
        for name, learner in learners.items():
            start = time.perf_counter()
            stats = learner.update(batches[name])
            elapsed = time.perf_counter() - start
            if round_ == 0:
                results[name]["warmup_s"] = elapsed
                results[name]["trained_tokens_per_meta_episode"] = stats["tokens"] / meta_episodes
                results[name]["steps"] = stats["steps"]
            else:
                results[name]["repeat_s"].append(elapsed)
            logger.info("learner update, %s, round %d: %.1f s", name, round_, elapsed)
    for d in results.values():
        d["update_s"] = min(d["repeat_s"]) if d["repeat_s"] else d["warmup_s"]
    del learners, batches
    gc.collect()
    return results


def format_conversation_report(result: dict[str, Any]) -> str:
    """A markdown table of :func:`bench_conversation`'s result, one row per layout."""
    cfg = result["config"]
    lines = [
        f"Learner, {cfg['game']} K={cfg['episodes']} ({cfg['prompt']} prompt), model "
        f"{cfg['model']} {cfg['dtype']}, {cfg['meta_episodes']} meta-episodes per update, "
        f"kl_coef {cfg['kl_coef']}, fastest of {cfg['repeats']} timed updates after a warm-up",
        "",
        "| layout | samples | calls | tokens/meta-episode | trained/meta-episode "
        "| longest | warm-up s | s/update |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, d in result["layouts"].items():
        lines.append(
            f"| {name} | {d['samples']} | {d['calls']} | {d['tokens_per_meta_episode']:.0f} "
            f"| {d['trained_tokens_per_meta_episode']:.0f} | {d['longest_sequence']} "
            f"| {d['warmup_s']:.1f} | {d['update_s']:.1f} |"
        )
    r = result["ratios"]
    lines += [
        "",
        f"Re-rendered / conversation: **{r['tokens']:.2f}x** tokens, "
        f"**{r['update_s']:.2f}x** seconds per update "
        f"({r['update_s_response_logits_only']:.2f}x with response logits only).",
    ]
    return "\n".join(lines)
