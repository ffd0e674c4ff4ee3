"""The settings of an evaluation, defined once: defaults, help and command-line flags.

:class:`EvalSettings` is the one definition of what every agent of an evaluation shares
(environments, opponents, task instances, K, protocol, sampling, token budgets).
:class:`~mage_rl.eval.conditions.EvalConfig` adds the agents and the checks, and
``mage eval`` builds its flags from the same fields (:func:`add_arguments`), so a default
or a help text cannot drift between the Python API and the command line. A setting that
is a run-config key (how an agent plays, K, the protocol, the seat) takes its choices and
its default for agents without a run from :class:`~mage_rl.config.RunConfig`
(:func:`from_run`), so the two cannot drift either. The module imports nothing heavy
(the config is pydantic alone), so ``mage --help`` stays fast.

The evaluation sampling (:data:`EVAL_TEMPERATURE`, :data:`EVAL_TOP_P`, :data:`EVAL_TOP_K`)
and seed (:data:`EVAL_SEED`) are also the defaults of the periodic evaluation during
training (``eval:`` in a training config).
"""

from __future__ import annotations

import argparse
import typing
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any

from mage_rl.config import RunConfig
from mage_rl.defaults import EVAL_SEED, EVAL_TEMPERATURE, EVAL_TOP_K, EVAL_TOP_P


def setting(
    default: Any = MISSING,
    *,
    help: str,  # noqa: A002 - argparse's name for it
    factory: Any = MISSING,
    flag: str | None = None,
    aliases: tuple[str, ...] = (),
    choices: tuple[str, ...] | None = None,
    metavar: str | None = None,
) -> Any:
    """A settings field: its default, its help text and how ``mage eval`` spells it."""
    metadata = {"help": help, "flag": flag, "aliases": aliases, "choices": choices}
    metadata["metavar"] = metavar
    if factory is not MISSING:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def _run_field(key: str) -> Any:
    """The pydantic field of a dotted run-config key (``"meta.layout"``)."""
    model: Any = RunConfig
    *sections, name = key.split(".")
    for section in sections:
        model = model.model_fields[section].annotation
    return model.model_fields[name]


def from_run(key: str, help: str, *, otherwise: str | None = None, **kwargs: Any) -> Any:  # noqa: A002
    """A setting that is the run-config key ``key``, left ``None`` to take the agents' runs'
    value: its choices are the key's (a ``Literal``), and its help ends with the key and
    the default an agent without a run gets (``otherwise`` to word it; else the key's
    default)."""
    spec = _run_field(key)
    kind = typing.get_origin(spec.annotation)
    choices = typing.get_args(spec.annotation) if kind is typing.Literal else None
    if otherwise is None:
        default = spec.get_default(call_default_factory=True)
        otherwise = {True: "on", False: "off"}.get(default, str(default))
    text = f"{help}, as {key} (default: the run's, else {otherwise})"
    return setting(None, help=text, choices=choices, **kwargs)


@dataclass(kw_only=True)
class EvalSettings:
    """What every agent of an evaluation shares (see each field's ``help``).

    A field left ``None`` takes its value from the agents' training runs (an agent given
    as a run folder or a checkpoint inside one; see :mod:`mage_rl.players.play_settings`), or else
    the default its help names.
    """

    envs: list[str] | None = setting(
        None,
        flag="--env",
        metavar="ENV",
        help="environment, repeatable: kuhn_poker (kuhn), tic_tac_toe (ttt), sokoban, "
        "scienceworld (sciworld), textworld_express (twx), rock_paper_scissors (rps), or "
        "one a plugin registers; one column each in the paper's Table 1 layout; default: "
        "the trained agents' environment, else kuhn_poker",
    )
    opponents: str | None = setting(
        None,
        help="opponent set: train (in-distribution: the training populations), unseen "
        "(Kuhn cfr, Tic-Tac-Toe mcts:1000, Sokoban rooms of 1 and 3 boxes, the text "
        "worlds' test variations), a preset (kuhn_train...) or weighted specs; default: "
        "the trained agents' population when they trained on the environment evaluated, "
        "else train",
    )
    n: int = setting(
        32,
        help="task instances (seed, opponent, seat) per environment; the paper reports "
        "128, more narrows the intervals (a rate's half-width is about 1/sqrt(n))",
    )
    rollouts: int = setting(
        1,
        help="meta-episodes per task instance (above 1 the intervals, which treat "
        "meta-episodes as independent, come out somewhat too narrow)",
    )
    episodes: int | None = from_run(
        "meta.episodes", "K, episodes per meta-episode; success@k for k = 1..K", aliases=("-k",)
    )
    seed: int = setting(EVAL_SEED, help="base seed of the task instances")
    seat: str | None = from_run(
        "env.seat",
        "agent seat: first, second or sampled (drawn from each task seed); single-agent "
        "environments (Sokoban) always use their one seat",
    )
    protocol: str | None = from_run(
        "env.protocol",
        "replay: every episode replays one deal/board (paper); fresh: new deal each "
        "against the same opponent",
    )
    temperature: float = setting(EVAL_TEMPERATURE, help="sampling temperature (paper eval: 0.7)")
    top_p: float = setting(EVAL_TOP_P, help="nucleus truncation (paper: 0.8)")
    top_k: int = setting(EVAL_TOP_K, help="top-k truncation (paper: 20; 0: off)")
    level: float = setting(0.95, help="confidence level of the intervals")
    concurrency: int = setting(
        16, help="meta-episodes in flight at once (their LLM calls share batches)"
    )
    max_batch_size: int = setting(32, help="most requests a local engine decodes together")
    keep_ids: bool = setting(
        False,
        help="keep every call's token ids and log-probs in records/*.jsonl (from the local "
        "engine, or from an endpoint that returns them: vLLM, mage serve); default: text only",
    )
    # How an agent plays (mage_rl.players.play_settings.PLAY_KEYS): unset, a trained agent plays as
    # its run's config says and any other agent as the defaults below.
    context: str | None = from_run(
        "meta.context",
        "what earlier episodes put into play prompts",
        otherwise="reflection; react keeps none",
    )
    layout: str | None = from_run("meta.layout", "prompt layout")
    prompt: str | None = from_run("meta.prompt", "play-prompt template")
    stop_on_success: bool | None = from_run(
        "meta.stop_on_success",
        "end a meta-episode at its first win, so success@k is Pass@k; turn off to play "
        "all K episodes, e.g. for ev@k",
    )
    constrain_actions: bool | None = from_run(
        "policy.constrain_actions", "constrained decoding on play turns (local models)"
    )
    max_tokens: int | None = from_run(
        "policy.max_tokens", "token budget of a play turn (reflect turns get twice as many)"
    )
    max_turns: int | None = from_run(
        "env.max_turns", "agent turns per episode, invalid ones included", otherwise="the game's"
    )
    dtype: str | None = from_run("policy.dtype", "local models' compute dtype")


_TYPES = {"int": int, "float": float, "str": str}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add a flag for every field of :class:`EvalSettings` (``n`` becomes ``--n``)."""
    for f in fields(EvalSettings):
        meta = f.metadata
        flag = meta["flag"] or "--" + f.name.replace("_", "-")
        names = [flag, *meta["aliases"]]
        common: dict[str, Any] = {"dest": f.name, "help": meta["help"]}
        if meta["metavar"]:
            common["metavar"] = meta["metavar"]
        # An annotation string, under `from __future__ import annotations`.
        kind = str(f.type).removesuffix(" | None")
        if kind == "bool":
            parser.add_argument(
                *names, action=argparse.BooleanOptionalAction, default=f.default, **common
            )
        elif kind.startswith("list["):
            # Repeatable; nothing given means the field's default (see settings_from_args).
            parser.add_argument(*names, action="append", default=[], **common)
        else:
            parser.add_argument(
                *names, type=_TYPES[kind], default=f.default, choices=meta["choices"], **common
            )


def settings_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The :class:`EvalSettings` fields of parsed ``mage eval`` arguments, as keywords."""
    values = {}
    for f in fields(EvalSettings):
        value = getattr(args, f.name)
        if isinstance(value, list) and not value:
            value = _default(f)
        values[f.name] = value
    return values


def _default(f: Field[Any]) -> Any:
    return f.default_factory() if f.default_factory is not MISSING else f.default
