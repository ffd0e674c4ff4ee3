"""The two prompt layouts side by side on real meta-episodes: rollouts and learner.

What it measures, for one game, prompt style and model:

1. Build the MAGE graph twice from one run config, once per layout (``rerendered``, the
   default, and ``conversation``), and draw ``meta_episodes`` task instances (the same
   seeds for both).
2. Per layout, play them all at once through a batched
   :class:`~mage_rl.policy.engine.LocalEngine` without prefix reuse and with it
   (:func:`~mage_rl.bench.rollout._run_mode`, the rollout benchmark's timing); the
   records of the run with reuse are kept.
3. Turn each layout's records into training samples as the trainer does (SPEC §3-5
   returns and advantages, then :func:`~mage_rl.rl.batching.samples_from_records`: one
   sample per call re-rendered, one sequence per meta-episode in the conversation), and
   time learner updates on them (:func:`~mage_rl.bench.conversation.time_updates`: a
   fresh learner per layout, a warm-up, then timed updates alternating between the
   layouts).

Both layouts play the same tasks with the same sampler seeds but different prompts, so
they sample different games; the token counts are per meta-episode. The layouts' ratios
divide the re-rendered figures by the conversation ones.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from mage_rl.bench.conversation import time_updates
from mage_rl.bench.rollout import POPULATIONS, _run_mode, rollout_setup
from mage_rl.rl.conversation import record_conversation

if TYPE_CHECKING:
    from mage_rl.policy.models import DType

logger = logging.getLogger(__name__)

LAYOUTS = ("rerendered", "conversation")
REUSE = {"without_reuse": 0.0, "with_reuse": 1024.0}


def bench_layouts(
    model: str = "smollm2",
    env: str = "kuhn_poker",
    prompt: str = "compact",
    constrain: bool = True,
    meta_episodes: int = 8,
    episodes: int = 3,
    max_tokens: int = 32,
    dtype: DType = "auto",
    seed: int = 0,
    repeats: int = 1,
    micro_batch_tokens: int = 8192,
) -> dict[str, Any]:
    """Rollout and learner cost of the re-rendered and the conversation layout.

    Args:
        model: Model spec for :func:`~mage_rl.policy.models.load_model`.
        env: ``kuhn_poker``, ``tic_tac_toe`` or ``sokoban``.
        prompt: Play prompt style, ``compact`` or ``standard``.
        constrain: Constrained decoding of the action.
        meta_episodes: Meta-episodes played at once and trained in one update.
        episodes: K, episodes per meta-episode (all are played).
        max_tokens: Response limit of play calls (reflect calls get twice as many).
        dtype: Rollout model dtype and the learner's forward dtype.
        seed: Seed of the tasks, the sampler and the learner.
        repeats: Timed learner updates per layout after one warm-up.
        micro_batch_tokens: Padded tokens per learner forward pass.

    Returns:
        ``{"config": {...}, "layouts": {layout: {"rollout": {"without_reuse": {...},
        "with_reuse": {...}}, "learner": {...}}}, "ratios": {...}}``: the rollout
        measurements of :func:`~mage_rl.bench.rollout._run_mode`, the learner's of
        :func:`~mage_rl.bench.conversation.time_updates`, and ratios re-rendered /
        conversation of learner tokens and seconds and of rollout seconds, plus each
        layout's rollout seconds without / with reuse.

    Raises:
        ValueError: On an unknown environment or prompt style, a count below 1, or a
            conversation that could outgrow the model's context window.
    """
    import torch

    from mage_rl.config import TrainConfig
    from mage_rl.policy.models import resolve_dtype
    from mage_rl.rl.advantages import compute_advantages
    from mage_rl.rl.batching import samples_from_records

    if env not in POPULATIONS:
        raise ValueError(f"env={env!r} is not benchmarked; use one of {sorted(POPULATIONS)}")
    if prompt not in ("compact", "standard"):
        raise ValueError(f"prompt={prompt!r}: use compact or standard")
    if meta_episodes < 1 or episodes < 1 or max_tokens < 1:
        raise ValueError(
            f"meta_episodes={meta_episodes}, episodes={episodes}, max_tokens={max_tokens}: "
            "give each >= 1"
        )
    results: dict[str, dict[str, Any]] = {}
    samples: dict[str, list[Any]] = {}
    for layout in reversed(LAYOUTS):  # the conversation first: its budget check is early
        cfg, lm, tokenizer, graph, tasks = rollout_setup(
            model, meta_episodes, env, episodes, max_tokens, dtype, seed, layout, prompt,
            constrain,
        )  # fmt: skip
        if layout == "conversation":
            from mage_rl import runtime

            window = getattr(lm.config, "max_position_embeddings", None)
            if window:
                runtime.check_conversation_budget(cfg, tokenizer, int(window))
        rollout: dict[str, Any] = {}
        records: list[Any] = []
        for name, cache_mb in REUSE.items():
            logger.info("bench layouts: %s, %s, %s", env, layout, name)
            keep = records if cache_mb else None
            rollout[name] = _run_mode(
                cfg, "batched", lm, tokenizer, graph, tasks, seed, None, cache_mb, keep
            )
        # The training defaults of this game (its penalties, SPEC §3) on top of the run.
        # Every task is played once, so each meta-episode is a group of one: the values of
        # the advantages differ from training's, the samples and their cost do not.
        data = cfg.model_dump(mode="json")
        data["rollout"]["group_size"] = 2
        train_cfg = TrainConfig.model_validate(data)
        advantages = compute_advantages(records, train_cfg.returns, train_cfg.advantages)
        samples[layout] = samples_from_records(records, advantages)
        results[layout] = {"rollout": rollout}
        if layout == "conversation":
            results[layout]["tokens"] = conversation_tokens(records, tokenizer)
        del lm, graph
    results = {layout: results[layout] for layout in LAYOUTS}
    samples = {layout: samples[layout] for layout in LAYOUTS}
    learner = time_updates(
        model, samples, meta_episodes, repeats=repeats, dtype=dtype, kl_coef=0.0,
        micro_batch_tokens=micro_batch_tokens, seed=seed,
    )  # fmt: skip
    for layout in LAYOUTS:
        results[layout]["learner"] = learner[layout]
    rr, conv = results["rerendered"], results["conversation"]
    ratios = {
        "learner_tokens": rr["learner"]["tokens_per_meta_episode"]
        / conv["learner"]["tokens_per_meta_episode"],
        "learner_s": rr["learner"]["update_s"] / conv["learner"]["update_s"],
        "rollout_s_with_reuse": rr["rollout"]["with_reuse"]["wall_s"]
        / conv["rollout"]["with_reuse"]["wall_s"],
    }
    for layout in LAYOUTS:
        r = results[layout]["rollout"]
        ratios[f"{layout}_reuse"] = r["without_reuse"]["wall_s"] / r["with_reuse"]["wall_s"]
    return {
        "config": {
            "model": model,
            "dtype": str(resolve_dtype(dtype)).removeprefix("torch."),
            "env": env,
            "prompt": prompt,
            "constrain": constrain,
            "meta_episodes": meta_episodes,
            "episodes": episodes,
            "max_tokens": max_tokens,
            "seed": seed,
            "repeats": repeats,
            "micro_batch_tokens": micro_batch_tokens,
            "torch_threads": torch.get_num_threads(),
        },
        "layouts": results,
        "ratios": ratios,
    }


# What each stretch of a conversation is, in the order format_layouts_report lists them.
PARTS = (
    "first prompt",
    "observations",
    "after an invalid answer",
    "episode starts",
    "reflect requests",
    "play replies",
    "reflections",
)


def conversation_tokens(records: Sequence[Any], tokenizer: Any) -> dict[str, dict[str, float]]:
    """Where a conversation's tokens go: the mean per meta-episode of each part.

    The ids before the first response are the first prompt; each response is a play reply
    or a reflection (by its turn's kind); the ids between two responses are the user
    message before the second one (with the chat template's tokens around it): a reflect
    request before a reflection, otherwise an episode's start, the message after an
    invalid answer (the reason and the observation), or a plain observation.

    Returns:
        ``{part: {"tokens": mean per meta-episode, "messages": mean count}}`` for each of
        :data:`PARTS`, and ``"total"``.
    """
    sums = {part: [0.0, 0.0] for part in (*PARTS, "total")}

    def add(part: str, n: int) -> None:
        sums[part][0] += n
        sums[part][1] += 1

    traces = [(r, record_conversation(r)) for r in records]
    traces = [(r, t) for r, t in traces if t is not None]
    for record, trace in traces:
        previous = 0
        for index, (start, end, turn) in enumerate(trace.segments):
            reflect = record.turns[turn].kind == "reflect"
            gap = start - previous
            if index == 0:
                add("first prompt", gap)
            elif reflect:
                add("reflect requests", gap)
            else:
                text = tokenizer.decode(trace.ids[previous:start])
                if "Your answer was invalid" in text:
                    add("after an invalid answer", gap)
                elif " starts." in text:
                    add("episode starts", gap)
                else:
                    add("observations", gap)
            add("reflections" if reflect else "play replies", end - start)
            previous = end
        add("total", previous)
    n = max(len(traces), 1)
    return {part: {"tokens": t / n, "messages": m / n} for part, (t, m) in sums.items()}


def format_layouts_report(result: dict[str, Any]) -> str:
    """A markdown table of :func:`bench_layouts`'s result, one row per layout."""
    cfg = result["config"]
    lines = [
        f"Prompt layouts: {cfg['meta_episodes']} {cfg['env']} meta-episodes (K="
        f"{cfg['episodes']}, {cfg['prompt']} prompt, constrained {cfg['constrain']}, "
        f"max_tokens={cfg['max_tokens']}), model {cfg['model']} ({cfg['dtype']}), "
        f"{cfg['torch_threads']} torch threads, seed {cfg['seed']}; learner: fastest of "
        f"{cfg['repeats']} timed update(s) after a warm-up",
        "",
        "| layout | rollout s, no reuse | rollout s, reuse | prompt tokens prefilled "
        "(no reuse / reuse) | LLM calls | learner samples | learner tokens/meta-episode "
        "| longest | learner s/update |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for layout, d in result["layouts"].items():
        off, on, learn = d["rollout"]["without_reuse"], d["rollout"]["with_reuse"], d["learner"]
        lines.append(
            f"| {layout} | {off['wall_s']:.1f} | {on['wall_s']:.1f} | "
            f"{off['prefilled_tokens']} / {on['prefilled_tokens']} | {on['llm_calls']} | "
            f"{learn['samples']} | {learn['tokens_per_meta_episode']:.0f} | "
            f"{learn['longest_sequence']} | {learn['update_s']:.1f} |"
        )
    r = result["ratios"]
    lines += [
        "",
        f"Re-rendered / conversation: **{r['learner_tokens']:.2f}x** learner tokens, "
        f"**{r['learner_s']:.2f}x** learner seconds, {r['rollout_s_with_reuse']:.2f}x "
        f"rollout seconds with reuse. Without / with reuse: re-rendered "
        f"{r['rerendered_reuse']:.2f}x, conversation {r['conversation_reuse']:.2f}x.",
    ]
    parts = result["layouts"]["conversation"].get("tokens")
    if parts:
        total = parts["total"]["tokens"] or 1.0
        lines += [
            "",
            "Where a conversation's tokens go (mean per meta-episode):",
            "",
            "| part | tokens | share | messages | tokens per message |",
            "|---|---:|---:|---:|---:|",
        ]
        for part in PARTS:
            d = parts[part]
            per = d["tokens"] / d["messages"] if d["messages"] else 0.0
            lines.append(
                f"| {part} | {d['tokens']:.0f} | {d['tokens'] / total:.0%} | "
                f"{d['messages']:.1f} | {per:.0f} |"
            )
    return "\n".join(lines)
