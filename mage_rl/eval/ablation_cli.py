"""The ``mage ablate`` sub-command (:mod:`mage_rl.eval.ablation` does the work)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from mage_rl.console import console, error
from mage_rl.eval import ablation as ab
from mage_rl.provenance import write_results


def run_ablation(
    config: str,
    vary: list[str],
    seeds_text: str,
    out: Path,
    sets: list[str],
    argv: list[str] | None = None,
) -> dict[str, Any]:
    """Train every variant for every seed (reusing finished runs), compare, write.

    Raises:
        ValueError: A bad ``--vary`` or ``--seeds``, or a config the overrides break.
    """
    from mage_rl.config import load_config
    from mage_rl.eval.stratified import payoff_range  # loads the games: not behind --help

    started = time.time()
    variants = ab.parse_vary(vary)
    seeds = ab.parse_seeds(seeds_text)
    stale = []
    for variant in variants:  # fail before the first hour of training, not after
        load_config(config, ab.variant_overrides(variant, sets))
        for seed in seeds:
            run_dir = out / "runs" / variant.slug / f"seed{seed}"
            problem = ab.finished(run_dir) and ab.reuse_problem(
                run_dir, config, variant, seed, sets
            )
            if problem:
                stale.append(f"{run_dir}: {problem}")
    if stale:
        raise ValueError(
            "these finished runs were trained with other settings than this command's, so "
            "they cannot be reused; move them away or choose another --out:\n  "
            + "\n  ".join(stale)
        )
    cfg = load_config(config, sets)
    k = cfg.meta.episodes
    bounds = payoff_range(cfg.env.name)
    probe = ab.PROBES.get(cfg.env.name)
    doc: dict[str, Any] = {
        "config": config,
        "command": "mage " + " ".join(argv or []),
        "vary": vary,
        "seeds": seeds,
        "sets": sets,
        "episodes": k,
        "payoff_range": list(bounds),
        "reference": variants[0].name,
        "references": ab.references(cfg),
        "variants": [],
    }
    total = len(variants) * len(seeds)
    episodes: dict[tuple[int, int], Any] = {}
    done = 0
    for i, variant in enumerate(variants):
        entry: dict[str, Any] = {
            "name": variant.name,
            "overrides": dict(variant.overrides),
            "implied": ab.implied(variant),
            "seeds": {},
        }
        doc["variants"].append(entry)
        for seed in seeds:
            done += 1
            run_dir = out / "runs" / variant.slug / f"seed{seed}"
            console.print(f"[{done}/{total}] {variant.name}, seed {seed}: {run_dir}")
            command = ab.train_command(config, variant, seed, run_dir, sets)
            run = ab.run_one(command, run_dir, console.print)
            run["run_dir"] = str(run_dir)
            final = ab.final_eval_file(run_dir) if run["status"] == "done" else None
            if run["status"] == "done" and final is None:
                run.update(status="failed", reason="no final evaluation (set eval.tasks > 0)")
            if final is not None:
                episodes[(i, seed)] = ab.read_episodes(final)
                situation = ab.SITUATIONS.get(cfg.env.name)
                run.update(ab.run_summary(episodes[(i, seed)], k, bounds, probe, situation))
                console.print(
                    f"  first {ab._fmt(run['first'])}, last {ab._fmt(run['last'])}"
                    + (
                        f", first-episode probes {ab._share(run['first_probe_share'])}"
                        if probe
                        else ""
                    )
                )
            entry["seeds"][str(seed)] = run
            # Written after every run: a crash keeps what was finished.
            write_results(
                out / "ablation.json",
                ab._finite(doc),
                started=started,
                argv=["mage", *(argv or [])],
            )
    for i, variant in enumerate(doc["variants"][1:], start=1):
        for seed in seeds:
            run, ref = variant["seeds"][str(seed)], doc["variants"][0]["seeds"][str(seed)]
            if (i, seed) in episodes and (0, seed) in episodes:
                paired = ab.paired_last(episodes[(0, seed)], episodes[(i, seed)], bounds)
                run["verdict"] = ab.verdict(paired, ref["last"], run["last"])
    doc["apart_seeds"] = {
        v["name"]: sum(bool(r.get("verdict", {}).get("apart")) for r in v["seeds"].values())
        for v in doc["variants"][1:]
    }
    for variant in doc["variants"][1:]:
        variant["across_seeds"] = ab.across_seeds(variant)
    doc = ab._finite(doc)  # write_results adds the stamp that ablation.md shows
    write_results(out / "ablation.json", doc, started=started, argv=["mage", *(argv or [])])
    (out / "ablation.md").write_text(ab.markdown(doc))
    ab.plot(doc, out / "ablation.png")
    return doc


def cmd_ablate(args: argparse.Namespace) -> int:
    out = Path(args.out)
    try:
        doc = run_ablation(args.config, args.vary, args.seeds, out, args.set, argv=args.argv)
    except ValueError as exc:
        error(exc)
        return 2
    failed = [
        f"{v['name']} seed {s}"
        for v in doc["variants"]
        for s, r in v["seeds"].items()
        if r["status"] != "done"
    ]
    console.print(f"wrote {out / 'ablation.md'}, {out / 'ablation.json'}, {out / 'ablation.png'}")
    for variant in doc["variants"][1:]:
        name, count = variant["name"], doc["apart_seeds"][variant["name"]]
        found = variant.get("across_seeds")
        summary = (
            f"; across seeds {ab._fmt(found['difference'])}, {found['verdict']}" if found else ""
        )
        console.print(
            f"{doc['reference']} above {name} (paired, last episode): {count} of "
            f"{len(doc['seeds'])} seeds{summary}"
        )
    if failed:
        error(f"{len(failed)} run(s) failed: {', '.join(failed)}")
        return 1
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``ablate`` to the ``mage`` sub-command parser."""
    p = sub.add_parser(
        "ablate",
        help="train a config with each variant of some settings and several seeds, and compare",
        description="Train CONFIG once per combination of the --vary values and per seed (the "
        "same budget each), then compare every variant's last episode with the first "
        "named one's on the same evaluation tasks. Writes OUT/ablation.md, "
        "OUT/ablation.json and OUT/ablation.png; runs live in OUT/runs/ and are reused "
        "when the command runs again.",
    )
    p.add_argument("config", help="a training config (YAML)")
    p.add_argument(
        "--vary", action="append", default=[], metavar="KEY=V1,V2",
        help="a config key and its values; repeat for more keys (every combination runs); "
        "the first combination is the reference",
    )  # fmt: skip
    p.add_argument(
        "--seeds", default="0,1,2", help="training seeds (rollout.seed and learner.seed)"
    )
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override for every run"
    )
    p.set_defaults(func=cmd_ablate)
