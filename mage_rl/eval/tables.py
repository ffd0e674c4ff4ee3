"""The markdown tables of an evaluation report (``table.md``).

:func:`render_markdown` lays out one or several runs' results (:mod:`mage_rl.eval.report`)
as the paper's Table 1 (methods x tasks, success@K), then per environment success@k per
k with answer quality, success@K per opponent and seat, and for Kuhn Poker ev@k beside the
oracle's best-fixed and ceiling values.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mage_rl.eval.decisions import decisions_table, episodes_table
from mage_rl.players.play_settings import PLAY_KEYS

ENV_TITLES = {
    "kuhn_poker": "Kuhn Poker",
    "tic_tac_toe": "Tic-Tac-Toe",
    "sokoban": "Sokoban",
    "leduc_poker": "Leduc Hold'em",
    "liars_dice": "Liar's Dice",
}
SEATS = ("first", "second")


def fmt_rate(est: dict[str, Any] | None) -> str:
    """``0.375 [0.14, 0.69]`` for a rate estimate; ``-`` when there is none."""
    if not est or est.get("mean") is None:
        return "-"
    if est.get("low") is None:
        return f"{est['mean']:.3f}"
    return f"{est['mean']:.3f} [{est['low']:.2f}, {est['high']:.2f}]"


def fmt_mean(est: dict[str, Any] | None) -> str:
    """``+0.125 [-0.31, +0.56]`` for a signed mean estimate."""
    if not est or est.get("mean") is None:
        return "-"
    if est.get("low") is None:
        return f"{est['mean']:+.3f}"
    return f"{est['mean']:+.3f} [{est['low']:+.2f}, {est['high']:+.2f}]"


def fmt_share(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def short_opponent(spec: str) -> str:
    """``kuhn_poker:conservative`` -> ``conservative``."""
    return spec.split(":", 1)[1] if ":" in spec else spec


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], text: int = 1) -> list[str]:
    """A markdown table; the first ``text`` columns are left-aligned, numbers right."""
    align = [":--"] * text + ["--:"] * (len(header) - text)
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def agent_rows(runs: Sequence[dict[str, Any]]) -> list[tuple[str, dict[str, Any], str]]:
    """(row name, run, agent label) for every agent; the run name is appended to labels
    that occur in more than one run."""
    labels = [a["label"] for run in runs for a in run["agents"]]
    out = []
    for run in runs:
        for agent in run["agents"]:
            label = agent["label"]
            name = label if labels.count(label) == 1 else f"{label} ({run['name']})"
            out.append((name, run, label))
    return out


def run_envs(runs: Sequence[dict[str, Any]]) -> list[str]:
    """Every environment of the runs, in the order they first appear."""
    envs: list[str] = []
    for run in runs:
        envs += [e for e in run["conditions"]["envs"] if e not in envs]
    return envs


def result_cell(run: dict[str, Any], label: str, env: str) -> dict[str, Any] | None:
    """One agent's results on one environment, or ``None`` when it did not play it."""
    return run["results"].get(label, {}).get(env)


def _mark(cell: dict[str, Any]) -> str:
    return "" if cell.get("complete", True) else f" ({cell['n']}/{cell['expected']})"


def _model_text(agent: dict[str, Any]) -> str:
    if agent.get("run"):
        return f"run `{agent['run']}` ({Path(agent['model']).parent.name})"
    return f"{agent.get('endpoint_model') or agent['model']}"


def _conditions_lines(runs: Sequence[dict[str, Any]]) -> list[str]:
    lines = []
    for run in runs:
        c = run["conditions"]
        agents = ", ".join(
            f"{a['label']} = {a['style']} on {_model_text(a)}" for a in run["agents"]
        )
        lines.append(
            f"- `{run['name']}`: {agents}. Opponents `{c['opponents']}`, n = {c['n']} task "
            f"instances x {c['rollouts']} rollout(s) per environment (base seed {c['seed']}, "
            f"seat {c['seat']}), K = {c['episodes']}, protocol {c['protocol']}; sampling "
            f"temperature {c['temperature']}, top-p {c['top_p']}, top-k {c['top_k']}; "
            f"{c['level']:.0%} intervals."
        )
    shared = ("opponents", "n", "rollouts", "seed", "seat", "episodes", "protocol")
    shared += ("temperature", "top_p", "top_k")
    if len(runs) > 1:
        for key in shared:
            values = {run["name"]: run["conditions"].get(key) for run in runs}
            if len({repr(v) for v in values.values()}) > 1:
                listed = ", ".join(f"{name}: {v}" for name, v in values.items())
                lines.append(f"- **The runs differ in {key}** ({listed}).")
    return lines


def agent_play(run: dict[str, Any], agent: dict[str, Any]) -> dict[str, Any]:
    """How an agent played: recorded with it, or (older runs) the shared conditions."""
    if agent.get("play"):
        return dict(agent["play"])
    c = run["conditions"]
    return {"agent": agent["style"]} | {k: c[k] for k in PLAY_KEYS if k in c}


def _play_value(key: str, value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if value is None:
        return "game's" if key == "max_turns" else "-"
    if key == "plugins":
        return ", ".join(Path(str(v)).name for v in value) or "none"
    return str(value)


def _play_lines(runs: Sequence[dict[str, Any]]) -> list[str]:
    """How each agent played; the settings in which agents differ get a column each."""
    rows = [(name, run, a) for name, run, label in agent_rows(runs) for a in run["agents"]
            if a["label"] == label]  # fmt: skip
    plays = {name: agent_play(run, a) for name, run, a in rows}
    keys = [k for k in PLAY_KEYS if any(k in p for p in plays.values())]
    overridden = {k for _, _, a in rows for k in a.get("overridden", {})}
    differ = [
        k for k in keys if len({repr(p.get(k)) for p in plays.values()}) > 1 or k in overridden
    ]
    same = [k for k in keys if k not in differ]
    out = [
        "",
        "How each agent plays: a trained agent as its run's config says, unless a flag "
        "overrides it (marked *value (run: x)*).",
        "",
    ]
    if same:
        first = next(iter(plays.values()))
        out += ["All agents: " + ", ".join(f"{k} {_play_value(k, first[k])}" for k in same)]
        out += [""]
    table = []
    for name, _, agent in rows:
        cells = [name, agent.get("run") or "-"]
        for key in differ:
            value = _play_value(key, plays[name].get(key))
            if key in agent.get("overridden", {}):
                value = f"*{value} (run: {_play_value(key, agent['overridden'][key])})*"
            cells.append(value)
        table.append(cells)
    return out + _table(["Agent", "trained run", *differ], table, text=2 + len(differ))


def render_markdown(runs: Sequence[dict[str, Any]]) -> str:
    """The report's tables as markdown (see the module docstring)."""
    envs = run_envs(runs)
    rows = agent_rows(runs)
    out = ["# Evaluation", "", *_conditions_lines(runs), *_play_lines(runs), ""]
    ks = {run["conditions"]["episodes"] for run in runs}
    k_text = f"K = {ks.pop()}" if len(ks) == 1 else "each run's K"
    out += [
        f"## Success rate (success@K, {k_text}), laid out like the paper's Table 1",
        "",
        "Wilson intervals in brackets; (m/n) marks an unfinished cell.",
        "",
    ]
    table = []
    for name, run, label in rows:
        cells = []
        for env in envs:
            cell = result_cell(run, label, env)
            cells.append(fmt_rate(cell["success@k"][-1]) + _mark(cell) if cell else "-")
        table.append([name, *cells])
    out += _table(["Method", *(ENV_TITLES.get(e, e) for e in envs)], table) + [""]

    for env in envs:
        title = ENV_TITLES.get(env, env)
        kmax = max(
            run["conditions"]["episodes"] for run in runs if env in run["conditions"]["envs"]
        )
        out += [f"## {title}", "", "### success@k and answer quality", ""]
        header = ["Agent", *(f"success@{k}" for k in range(1, kmax + 1))]
        header += ["draw@K", "n", "invalid share", "cut by max_tokens", "no <remark>"]
        table = []
        for name, run, label in rows:
            cell = result_cell(run, label, env)
            if not cell:
                continue
            succ = [fmt_rate(e) for e in cell["success@k"]]
            succ += ["-"] * (kmax - len(succ))
            turns = cell["turns"]
            table.append(
                [
                    name,
                    *succ,
                    fmt_rate(cell["draw@k"][-1]),
                    f"{cell['n']}{_mark(cell)}",
                    fmt_share(turns["invalid_share"]),
                    fmt_share(turns["truncated_share"]),
                    fmt_share(turns["reflect_invalid_share"]),
                ]
            )
        out += _table(header, table) + [""]
        out += [
            "invalid share: play turns with no parsable, legal `<action>`; cut by "
            "max_tokens: play turns that hit the token budget; no <remark>: reflect turns "
            "without a reflection tag.",
            "",
            "### success@K per opponent and seat",
            "",
        ]
        header = ["Agent", "opponent", "seat", "n", "success@K", "draw@K"]
        table = []
        for name, run, label in rows:
            cell = result_cell(run, label, env)
            if not cell:
                continue
            for key, sub in cell["by_opponent_seat"].items():
                opponent, seat = key.rsplit("|", 1)
                table.append(
                    [
                        name,
                        short_opponent(opponent),
                        seat,
                        str(sub["n"]),
                        fmt_rate(sub["success@k"][-1]),
                        fmt_rate(sub["draw@k"][-1]),
                    ]
                )
        out += _table(header, table, text=3) + [""]
        out += _decisions_section(rows, env)
        if env == "kuhn_poker":
            out += _kuhn_ev_section(runs, rows, kmax)
    return "\n".join(out).rstrip() + "\n"


def _decisions_section(rows: Sequence[tuple[str, dict[str, Any], str]], env: str) -> list[str]:
    """What each agent answered at each decision state, when the game has few states."""
    agents, episodes = [], []
    for name, run, label in rows:
        cell = result_cell(run, label, env)
        if cell and cell.get("decisions"):
            agents.append((name, cell["decisions"]))
            by_episode = cell.get("decisions_by_episode") or {}  # absent in older results
            episodes.append((name, {int(e): c for e, c in by_episode.items()}))
    table = decisions_table(agents) if agents else None
    if table is None:
        return []
    out = [
        "### Answers by decision state",
        "",
        "The share of each action at each state over every episode, and the number of "
        "answers; `invalid`: no legal action taken.",
        "",
        *table,
        "",
    ]
    by_episode = episodes_table(episodes)
    if by_episode:
        out += [
            "The same answers by episode of the meta-episode, over every state: does an "
            "agent play its last episode as it plays its first?",
            "",
            *by_episode,
            "",
        ]
    return out


def _kuhn_ev_section(
    runs: Sequence[dict[str, Any]], rows: Sequence[tuple[str, dict[str, Any], str]], kmax: int
) -> list[str]:
    """ev@k per agent and seat, beside the oracle's best-fixed and ceiling values."""
    out = [
        "### Kuhn Poker chips per hand (ev@k) beside the oracle",
        "",
        "Student-t intervals. best fixed: the most a single strategy earns against the "
        "population when the opponent is unknown; ceiling: what knowing the opponent "
        "earns (SPEC §9, fresh deals). Per opponent, both are the best response to it. "
        "Rows `all` weigh the seats by their share of task instances. With "
        "stop_on_success, ev@k for k > 1 averages only the meta-episodes not yet won, and "
        "under the replay protocol every episode replays one deal, so compare ev@1 with "
        "best fixed, and ev@K with the ceiling only for `--protocol fresh "
        "--no-stop-on-success` runs. hands@1: first hands that reached a showdown or "
        "fold; hands abandoned after invalid answers have no chip payoff and are left out "
        "of ev@k (they are counted in the invalid share).",
        "",
    ]
    header = ["Agent", "opponent", "seat", *(f"ev@{k}" for k in range(1, kmax + 1))]
    header += ["hands@1", "best fixed", "ceiling"]
    table = []
    for name, run, label in rows:
        cell = result_cell(run, label, "kuhn_poker")
        oracle = run.get("oracle", {}).get("kuhn_poker")
        if not cell or not oracle:
            continue
        share = run["seat_share"]["kuhn_poker"]
        groups: list[tuple[str, str, dict[str, Any], str | None]] = [("all", "all", cell, None)]
        if len(cell["by_seat"]) > 1:  # with one seat its row would repeat the first
            groups += [("all", s, cell["by_seat"][s], s) for s in SEATS if s in cell["by_seat"]]
        for key, sub in cell["by_opponent_seat"].items():
            opponent, seat = key.rsplit("|", 1)
            groups.append((opponent, seat, sub, seat))
        for opponent, seat, sub, seat_key in groups:
            ev = sub.get("ev@k", [])
            evs = [fmt_mean(e) for e in ev] + ["-"] * (kmax - len(ev))
            hands = str(ev[0]["n"]) if ev else "0"
            if opponent != "all":
                br = oracle[seat]["best_response"].get(opponent)
                refs = [f"{br:+.4f}"] * 2 if br is not None else ["-", "-"]
            elif seat_key is None:
                refs = [
                    f"{sum(share[s] * oracle[s][k] for s in SEATS):+.4f}"
                    for k in ("best_fixed", "ceiling")
                ]
            else:
                refs = [f"{oracle[seat_key][k]:+.4f}" for k in ("best_fixed", "ceiling")]
            table.append([name, short_opponent(opponent), seat, *evs, hands, *refs])
    return [*out, *_table(header, table, text=3), ""]
