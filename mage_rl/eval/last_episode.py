"""The last episode's strategy after the earlier hands: its exact values, averaged over
sampled histories (SPEC §10).

In episode K of a meta-episode the agent plays ``pi_K(a | h, s)``, a strategy that
depends on the K-1 hands ``h`` before it. Against an opponent ``o`` its value is
``E_h[v(pi_K(. | h, .), o)]``, the expectation over the histories that the agent's own
play against ``o`` produces. The tree of histories is far too large to enumerate once
the chat holds free text, so this module samples it:

1. Play ``n`` meta-episodes of the run's graph against ``o`` in each seat (fixed task
   seeds, the run's sampling temperature, no exploration), and keep each one's first
   K-1 hands as a history ``h`` (:func:`past_of`: the environment is replayed with the
   recorded answers to rebuild the graph's ``history``, and in the conversation layout
   the chat before episode K is rebuilt from the recorded calls, checked token for token
   against the record's own).
2. For each ``h``, read ``pi_K(. | h, s)`` at every information state ``s`` of the seat
   exactly (:func:`~mage_rl.eval.exploitability.decision_at` with that past, then the
   model reader), and value that strategy exactly with OpenSpiel: against ``o`` (its
   table) and against a best response to it.
3. Average over the histories, with Student-t intervals per opponent and seat; the
   population's value weighs its opponents (a normal interval from their variances).

The best-response value of the last episode is per seat: the agent keeps its seat for
the whole meta-episode, so ``pi_K`` exists for one seat only and no NashConv is formed;
``-E_h[BR value]`` averaged over the seats is the last episode's counterpart of the
first episode's exploitability.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import pyspiel

from mage_rl.envs import Population, canonical_spec, game_rules, make_env
from mage_rl.envs.base import derive_seed, episode_seed
from mage_rl.envs.openspiel_env import OpenSpielEnv, decision_states
from mage_rl.envs.opponents import PlaceholderOpponent
from mage_rl.eval.exploitability import SEATS, tabular_policy
from mage_rl.eval.game_oracles import best_response_values, opponent_table
from mage_rl.eval.stats import mean_interval, normal_quantile
from mage_rl.graphs.rollouts import TaskInstance
from mage_rl.nodes.core import past_episode
from mage_rl.nodes.state import MetaEpisodeContext, graph_options
from mage_rl.players.tree_decisions import ActionReader, Past, decision_at, read_policy
from mage_rl.policy.conversation import ConversationTemplate
from mage_rl.records import MetaEpisodeRecord

HISTORY_SEED = 2026
"""The base seed of the histories ``mage exploitability --last`` plays (``mage eval``'s)."""


def check_config(cfg: Any) -> None:
    """Refuse a config whose meta-episodes may not reach episode K with K-1 hands before.

    Raises:
        ValueError: K is 1, or ``meta.stop_on_success`` ends meta-episodes early.
    """
    if cfg.meta.episodes < 2:
        raise ValueError("the last episode needs K >= 2 episodes (meta.episodes)")
    if cfg.meta.stop_on_success:
        raise ValueError(
            "with meta.stop_on_success a meta-episode that wins early never plays its last "
            "episode; measure with --set meta.stop_on_success=false"
        )


def past_of(record: MetaEpisodeRecord, cfg: Any, template: ConversationTemplate | None) -> Past:
    """What the agent saw before the last episode of ``record``.

    The environment replays the first K-1 episodes with the recorded answers (the same
    seeds and opponent), which rebuilds each ``history`` entry as the graph's
    ``env_step`` built it; ``memory`` is the record's reflections; in the conversation
    layout the chat is rebuilt from the recorded calls before episode K.

    Raises:
        ValueError: The replay disagrees with the record (an episode's outcome, or the
            chat's tokens), or the record has no episode K.
    """
    k_last = cfg.meta.episodes - 1
    if len(record.episodes) <= k_last:
        raise ValueError(f"record {record.uid!r} ended after {len(record.episodes)} episodes")
    env = make_env(record.env, record.opponent, seat=record.seat, max_turns=cfg.env.max_turns)
    history = []
    for k in range(k_last):
        initial = env.reset(episode_seed(record.seed, k, cfg.env.protocol))
        moves: list[str] = []
        result = None
        for turn in (t for t in record.turns if t.kind == "play" and t.episode == k):
            result = env.step(turn.text)
            moves += result.info.events
        if result is None or not result.done or result.info.outcome != record.episodes[k].outcome:
            raise ValueError(
                f"record {record.uid!r} (rollout {record.rollout}): replaying episode {k + 1} "
                "does not reproduce its outcome"
            )
        history.append(past_episode(k, initial, moves, result.info, env))
    chat = None
    if template is not None:
        first = next(
            i for i, t in enumerate(record.turns) if t.kind == "play" and t.episode == k_last
        )
        chat = template.start(list(record.turns[0].prompt_text))
        for j, turn in enumerate(record.turns[:first]):
            if j:
                chat = template.append_messages(chat, [turn.prompt_text[-1]])
            chat = template.append_response(chat, list(turn.response_ids), turn.text)
        recorded = (record.conversation or {}).get("ids") or []
        if list(chat.ids) != list(recorded[: len(chat.ids)]):
            raise ValueError(
                f"record {record.uid!r} (rollout {record.rollout}): the rebuilt chat before "
                "the last episode differs from the recorded one"
            )
    return Past(k_last, tuple(history), tuple(record.reflections), chat)


def history_tasks(specs: Sequence[str], n: int, base_seed: int) -> list[TaskInstance]:
    """``n`` task instances per opponent and seat, a fixed function of the seed."""
    return [
        TaskInstance(derive_seed("last-episode", base_seed, spec, seat, i), spec, seat)
        for spec in specs
        for seat in (0, 1)
        for i in range(n)
    ]


def last_episode_values(
    cfg: Any,
    records: Sequence[MetaEpisodeRecord],
    reader: ActionReader,
    populations: Mapping[str, Population],
    template: ConversationTemplate | None = None,
    progress: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """The last episode's exact values after each record's history, averaged.

    Args:
        cfg: The run config the records were played with.
        records: Meta-episodes of the run's graph against fixed opponents, K episodes each.
        reader: Gives ``pi(a | s)`` for decisions (:class:`~mage_rl.players.model_reader.ModelReader`).
        populations: Named populations to weigh the per-opponent values with; their
            members must be among the records' opponents.
        template: The conversation template (conversation layout), else ``None``.
        progress: Called with 1 after each record.

    Returns:
        ``{"histories": ..., "seats": [{seat, vs_best_response, vs_opponent,
        vs_population}, ...]}``, each value an estimate (``mean``, ``low``, ``high``,
        ``n``); the ``mean`` seat averages the two seats.
    """
    from open_spiel.python.algorithms import expected_game_score

    check_config(cfg)
    rules = game_rules(cfg.env.name)
    game = pyspiel.load_game(rules.game_name)
    options = replace(graph_options(cfg), constrain_actions=True)
    root = game.new_initial_state()
    tables: dict[tuple[str, int], Any] = {}
    samples: dict[tuple[str, int], list[float]] = {}
    read: dict[int, list[Any]] = {0: [], 1: []}  # each history's table, by seat
    contexts = {}
    for seat in (0, 1):
        env = make_env(cfg.env.name, PlaceholderOpponent(), seat=seat, max_turns=cfg.env.max_turns)
        assert isinstance(env, OpenSpielEnv)
        env.reset(0)
        ctx = MetaEpisodeContext(env=env, llm=None, options=options)  # type: ignore[arg-type]
        states = [s for s in decision_states(game) if s.current_player() == seat]
        contexts[seat] = (env, ctx, states)
    for record in records:
        spec, seat = canonical_spec(record.opponent), record.seat
        env, ctx, states = contexts[seat]
        past = past_of(record, cfg, template)
        table = read_policy([decision_at(env, ctx, s, past) for s in states], reader)
        if (spec, seat) not in tables:
            tables[spec, seat] = tabular_policy(
                game, dict(opponent_table(rules.game_name, spec, 1 - seat))
            )
        mine = tabular_policy(game, table)
        pair = [mine, tables[spec, seat]] if seat == 0 else [tables[spec, seat], mine]
        value = float(expected_game_score.policy_value(root, pair)[seat])
        samples.setdefault((spec, seat), []).append(value)
        read[seat].append(table)
        if progress is not None:
            progress(1)
    specs = list(dict.fromkeys(spec for spec, _ in samples))
    # One best-response solver per seat serves every history's table (its tree is built once).
    brs = {seat: [-v for v in best_response_values(rules.game_name, seat_tables, 1 - seat)]
           for seat, seat_tables in read.items()}  # fmt: skip
    seats = []
    for seat, label in enumerate(SEATS):
        values = {spec: samples.get((spec, seat), []) for spec in specs}
        seats.append(
            {
                "seat": label,
                "vs_best_response": _Mean.of(brs[seat]),
                "vs_opponent": {spec: _Mean.of(v) for spec, v in values.items()},
                "vs_population": {
                    name: _Mean.weighted(
                        [
                            (_Mean.of(values.get(canonical_spec(s), [])), float(w))
                            for s, w in zip(pop.specs, pop.weights, strict=True)
                        ]
                    )
                    for name, pop in populations.items()
                },  # fmt: skip
            }
        )
    first, second = seats
    seats.append(
        {
            "seat": "mean",
            "vs_best_response": _Mean.weighted(
                [(first["vs_best_response"], 0.5), (second["vs_best_response"], 0.5)]
            ),
            "vs_opponent": {
                k: _Mean.weighted([(v, 0.5), (second["vs_opponent"][k], 0.5)])
                for k, v in first["vs_opponent"].items()
            },
            "vs_population": {
                k: _Mean.weighted([(v, 0.5), (second["vs_population"][k], 0.5)])
                for k, v in first["vs_population"].items()
            },
        }
    )
    return {
        "episode": f"last (episode {cfg.meta.episodes}, after {cfg.meta.episodes - 1} sampled "
        "hands)",
        "histories": {f"{spec} {SEATS[seat]}": len(got) for (spec, seat), got in samples.items()},
        "seats": [_plain(row) for row in seats],
    }


def _plain(row: Mapping[str, Any]) -> dict[str, Any]:
    """A seat's row with its estimates as dicts."""
    out: dict[str, Any] = {
        "seat": row["seat"],
        "vs_best_response": row["vs_best_response"].to_dict(),
    }
    for key in ("vs_opponent", "vs_population"):
        out[key] = {name: est.to_dict() for name, est in row[key].items()}
    return out


class _Mean:
    """A sample mean with the variance of that mean; composites weigh independent means."""

    def __init__(self, mean: float | None, var: float | None, n: int, t_based: Any = None):
        self.mean, self.var, self.n, self.t_based = mean, var, n, t_based

    @classmethod
    def of(cls, values: Sequence[float]) -> _Mean:
        est = mean_interval(values)
        n = len(values)
        var = None
        if n > 1:
            m = math.fsum(values) / n
            var = math.fsum((v - m) ** 2 for v in values) / (n - 1) / n
        return cls(est.mean, var, n, est)

    @classmethod
    def weighted(cls, parts: Sequence[tuple[_Mean, float]]) -> _Mean:
        """``sum w_i m_i`` with variance ``sum w_i^2 var_i`` (a normal interval)."""
        if any(m.mean is None for m, _ in parts):
            return cls(None, None, sum(m.n for m, _ in parts))
        mean = math.fsum(w * m.mean for m, w in parts)  # type: ignore[operator]
        known = all(m.var is not None for m, _ in parts)
        var = math.fsum(w * w * m.var for m, w in parts) if known else None  # type: ignore[operator]
        return cls(mean, var, sum(m.n for m, _ in parts))

    def to_dict(self) -> dict[str, Any]:
        if self.t_based is not None:  # one opponent and seat: the Student-t interval
            return self.t_based.to_dict()
        if self.mean is None or self.var is None:
            return {"mean": self.mean, "low": None, "high": None, "n": self.n}
        half = normal_quantile(0.95) * math.sqrt(self.var)
        return {"mean": self.mean, "low": self.mean - half, "high": self.mean + half, "n": self.n}
