"""The ``mage oracle`` sub-command: exact reference values of the games.

Kuhn Poker (SPEC §9, with the Bayes value of the last hand after K-1 observed hands),
Leduc Hold'em and Liar's Dice (Nash value bounded by CFR+, best response to each
opponent, best fixed strategy, opponent-aware ceiling) and rock-paper-scissors.
:func:`register` adds it to the ``mage`` parser; the game modules load when it runs.
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Callable, Sequence
from typing import Any

from rich.table import Table

from mage_rl.console import console

log = logging.getLogger(__name__)


def _fmt(x: float) -> str:
    return f"{x:.4f}"


# -- oracle ------------------------------------------------------------------------------


def cmd_oracle(args: argparse.Namespace) -> int:
    from mage_rl.envs import Population, canonical_game
    from mage_rl.eval.oracles import kuhn_oracle

    if "llm" in (args.population or ""):  # GAME:llm:... opponents load the model stack
        from mage_rl.players.seat_player import install as install_llm_opponents

        install_llm_opponents()

    game = canonical_game(args.game)
    if game == "rock_paper_scissors":
        from mage_rl.eval.rps_oracle import print_rps_oracle

        episodes = 3 if args.episodes is None else args.episodes
        return print_rps_oracle(
            args.population, episodes=episodes, as_json=args.json, console=console
        )
    if game == "showdown":
        from mage_rl.eval.showdown_oracle import print_showdown_oracle

        return print_showdown_oracle(
            args.population, episodes=2 if args.episodes is None else args.episodes,
            gamma_traj=args.gamma_traj,
            omega=args.omega, as_json=args.json, console=console,
        )  # fmt: skip
    if game != "kuhn_poker":
        return _game_oracle(args, game)
    population = Population.parse(args.population or _KUHN_POPULATION, game="kuhn_poker")
    oracle = kuhn_oracle(population)
    bayes = _bayes_values(population)
    if args.json:
        print(json.dumps(oracle.to_dict() | {"bayes_last_hand": bayes}, indent=2))
        return 0
    title = "Kuhn Poker exact values, chips per hand for the agent"
    table = _oracle_table(oracle, title, tail=[("replay win", lambda s: s.replay_winnable)])
    console.print(table)
    console.print(
        "vs X: best response to X alone; best fixed: best single strategy against the "
        "population; ceiling: best response to each opponent, weighted; replay win: "
        "share of (deal, opponent) pairs where some line of play wins."
    )
    if bayes:
        ks = sorted(next(iter(bayes.values()))["fixed"])
        last = Table(title="Last hand of K (fresh deals): best value after watching K-1 hands")
        last.add_column("agent seat")
        last.add_column("probing")
        for k in ks:
            last.add_column(f"K={k}", justify="right")
        for seat, values in bayes.items():
            for kind in ("fixed", "adaptive"):
                last.add_row(seat, kind, *(_fmt(values[kind][k]) for k in ks))
        console.print(last)
        console.print(
            "fixed: the K-1 earlier hands repeat one pure strategy; adaptive: probing may "
            "change after each hand (Bayes-optimal for a last-hand objective). The last "
            "hand best-responds to the posterior over the opponents."
        )
    return 0


_KUHN_POPULATION = "conservative=0.3,aggressive=0.3,intermediate=0.4"
_ORACLE_GAMES = (
    "kuhn", "kuhn_poker", "leduc", "leduc_poker", "liars", "liars_dice", "rps", "rock_paper_scissors",
    "showdown",
)  # fmt: skip


def _game_oracle(args: argparse.Namespace, game: str) -> int:
    """The values of :func:`~mage_rl.eval.game_oracles.game_oracle` as a table or JSON."""
    from mage_rl.envs import Population
    from mage_rl.envs.names import GAME_SHORT
    from mage_rl.eval.game_oracles import game_oracle

    text = args.population or f"{GAME_SHORT.get(game, game)}_train"
    iterations = getattr(args, "nash_iterations", None)
    if iterations is not None and iterations < 1:
        raise SystemExit(f"mage oracle: --nash-iterations must be >= 1, got {iterations}")
    population = Population.parse(text, game=game)
    if args.json:  # keep standard output pure JSON
        oracle = game_oracle(game, population, iterations)
    else:
        with console.status(f"solving {game} (CFR+ is cached after the first run)"):
            oracle = game_oracle(game, population, iterations)
    if args.json:
        print(json.dumps(oracle.to_dict(), indent=2))
        return 0
    title = f"{game} exact values, {oracle.payoff_unit} for the agent"
    half_width = ("±", lambda s: (s.nash_high - s.nash_low) / 2)
    table = _oracle_table(oracle, title, head=[half_width])
    console.print(table)
    console.print(
        "Nash ± half-width: the interval that the best responses to the CFR+ average "
        f"profile ({oracle.nash_iterations} iterations) put around the game value; vs X: best response to X alone; best "
        "fixed: best single strategy against the population; ceiling: best response to "
        "each opponent, weighted."
    )
    return 0


_Column = tuple[str, Callable[[Any], float]]


def _oracle_table(
    oracle: Any, title: str, head: Sequence[_Column] = (), tail: Sequence[_Column] = ()
) -> Table:
    """One row per seat: Nash, ``head``, the best response to each opponent, best fixed,
    ceiling, ``tail``; the title ends with the population's weights."""
    pop = ", ".join(f"{s.split(':', 1)[1]}={w:.2f}" for s, w in oracle.population.items())
    versus: list[_Column] = [
        (f"vs {spec.split(':', 1)[1][:5]}.", lambda s, spec=spec: s.best_response[spec])
        for spec in oracle.population
    ]
    columns: list[_Column] = [
        ("Nash", lambda s: s.nash), *head, *versus,
        ("best fixed", lambda s: s.best_fixed), ("ceiling", lambda s: s.ceiling), *tail,
    ]  # fmt: skip
    table = Table(title=f"{title} ({pop})")
    table.add_column("agent seat")
    for name, _ in columns:
        table.add_column(name, justify="right")
    for seat in oracle.seats:
        table.add_row(seat.seat, *(_fmt(value(seat)) for _, value in columns))
    return table


def _bayes_values(population: object) -> dict[str, dict[str, dict[int, float]]]:
    """Bayes last-hand values per seat, or nothing for non-deterministic opponents."""
    from mage_rl.eval.bayes import bayes_last_hand

    try:
        return {
            seat: bayes_last_hand(population, index)  # type: ignore[arg-type]
            for index, seat in enumerate(("first", "second"))
        }
    except ValueError as err:
        log.info("no Bayes last-hand values: %s", err)
        return {}


# -- opponents ---------------------------------------------------------------------------


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``oracle`` to the ``mage`` sub-command parser."""
    p = sub.add_parser(
        "oracle",
        help="exact reference values: Kuhn (SPEC §9), Leduc, Liar's Dice, rock-paper-scissors, "
        "the showdown (SPEC §11)",
    )
    p.add_argument("game", choices=_ORACLE_GAMES)
    p.add_argument(
        "--population",
        default=None,
        help="weighted opponents, e.g. conservative=0.3,aggressive=0.7, or a preset name "
        "(default: the game's training preset, kuhn_train, leduc_train, liars_dice_train)",
    )
    p.add_argument(
        "--nash-iterations",
        type=int,
        default=None,
        help="CFR+ iterations behind the Nash bounds of Leduc and Liar's Dice (default 500 "
        "and 200); more iterations, tighter bounds, longer first run (then cached)",
    )
    p.add_argument(
        "--episodes",
        type=int,
        default=None,
        help="showdown: K, the episodes of a meta-episode (default 2); rps: the K whose "
        "rounds and families are shown in detail (default 3)",
    )
    p.add_argument(
        "--gamma-traj", type=float, default=1.0,
        help="showdown: the cross-episode discount the credit modes are solved for (default 1)",
    )  # fmt: skip
    p.add_argument(
        "--omega", type=float, default=1.0,
        help="showdown: GiGPO's step-level weight the credit modes are solved for (default 1)",
    )  # fmt: skip
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=cmd_oracle)
