"""Reset and step times of the Java text worlds (ScienceWorld, TextWorld-Express).

What it measures, per environment (one task variant each):

1. **Simulator start**: the first environment of the process starts the JVM through the
   pool (:mod:`mage_rl.envs.textworlds`); later episodes borrow it.
2. For ``episodes`` seeds: **reset to a new variation** (the simulator loads the
   variation, as when a meta-episode or a ``fresh`` episode begins), then the winning
   path (``gold_actions``, not timed), then **reset to the same variation** (a ``replay``
   episode on the simulator that still holds it), one **invalid step** (a command the
   game does not understand: the world does not change) and every **valid step** of
   the winning path, which must win the episode (+10).
3. Report medians and means in milliseconds, and how many winning paths won.

The figures are wall times through :class:`~mage_rl.envs.base.TextEnv` (tag parsing,
observation rendering and the simulator's round trips included), on whatever else the
machine runs at the same time.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from mage_rl.envs import make_env
from mage_rl.envs.textworlds import SimulatorEnv

DEFAULT_SPECS = (
    "scienceworld:find-non-living-thing:train",
    "textworld_express:coin:train:small",
)


def _ms(values: list[float]) -> dict[str, float]:
    return {
        "median_ms": 1000 * statistics.median(values),
        "mean_ms": 1000 * statistics.fmean(values),
        "n": len(values),
    }


def bench_one(spec: str, episodes: int, seed: int) -> dict[str, Any]:
    """Time one task variant (see the module docstring)."""
    env = make_env(spec.split(":")[0], spec)
    if not isinstance(env, SimulatorEnv):
        raise ValueError(f"{spec!r} is not a ScienceWorld or TextWorld-Express variant")
    started = time.perf_counter()
    was = env.pool.size
    sim = env.pool.acquire()
    start_s = time.perf_counter() - started if env.pool.size > was else None
    env.pool.release(sim)
    new, same, valid, invalid = [], [], [], []
    won, gold_steps = 0, []
    for i in range(episodes):
        task_seed = seed + i
        t = time.perf_counter()
        env.reset(task_seed)
        new.append(time.perf_counter() - t)
        gold = env.gold_actions()
        gold_steps.append(len(gold))
        t = time.perf_counter()
        env.reset(task_seed)
        same.append(time.perf_counter() - t)
        t = time.perf_counter()
        result = env.step("<action>xyzzy plugh</action>")
        invalid.append(time.perf_counter() - t)
        assert result.info.invalid
        for action in gold:
            t = time.perf_counter()
            result = env.step(f"<action>{action}</action>")
            valid.append(time.perf_counter() - t)
            if result.done:
                break
        won += result.info.outcome == "won"
        env.close()
    return {
        "spec": env.variant.spec,
        "simulator_start_s": start_s,
        "reset_new_variation": _ms(new),
        "reset_same_variation": _ms(same),
        "valid_step": _ms(valid),
        "invalid_step": _ms(invalid),
        "gold_path_steps": gold_steps,
        "gold_paths_won": won,
        "episodes": episodes,
    }


def simulator_versions() -> dict[str, str]:
    """The simulator packages' versions and the Java runtime's, for the results file."""
    import subprocess
    from importlib import metadata

    versions: dict[str, str] = {}
    for package in ("scienceworld", "textworld-express", "py4j"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = "not installed"
    try:
        done = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=30)
        versions["java"] = (done.stderr or done.stdout).splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        versions["java"] = "not found"
    return versions


def bench_textenvs(
    specs: tuple[str, ...] | list[str] = DEFAULT_SPECS, episodes: int = 5, seed: int = 0
) -> dict[str, Any]:
    """Time each task variant of ``specs`` over ``episodes`` seeds.

    Raises:
        ValueError: ``episodes`` below 1, or a spec of another environment.
        MissingDependencyError: The textworlds extra or Java is missing.
    """
    if episodes < 1:
        raise ValueError(f"--episodes {episodes}: give at least 1")
    return {
        "config": {"specs": list(specs), "episodes": episodes, "seed": seed},
        "simulators": simulator_versions(),
        "envs": [bench_one(spec, episodes, seed) for spec in specs],
    }


def format_textenvs_report(result: dict[str, Any]) -> str:
    """A markdown table of :func:`bench_textenvs`'s result, one row per task variant."""
    cfg = result["config"]
    lines = [
        f"Text worlds: {cfg['episodes']} seeds from {cfg['seed']} per variant; medians "
        "(means) in ms",
        "",
        "| variant | simulator start s | reset, new variation | reset, same variation "
        "| valid step | invalid step | winning paths won |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]

    def cell(m: dict[str, float]) -> str:
        return f"{m['median_ms']:.1f} ({m['mean_ms']:.1f})"

    for e in result["envs"]:
        start = "-" if e["simulator_start_s"] is None else f"{e['simulator_start_s']:.2f}"
        lines.append(
            f"| {e['spec']} | {start} | {cell(e['reset_new_variation'])} "
            f"| {cell(e['reset_same_variation'])} | {cell(e['valid_step'])} "
            f"| {cell(e['invalid_step'])} | {e['gold_paths_won']}/{e['episodes']} |"
        )
    return "\n".join(lines)
