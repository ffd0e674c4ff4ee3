"""Where a training run's time goes: its phases, timed, logged and tabled.

A run of ``mage train`` spends its time in a few phases:

1. set-up: from the start of the ``mage train`` process (imports, config, tasks) to
   the model, the learner and the engine being ready (converting the embedded GGUF file
   the first time);
2. the evaluation before iteration 1: the untrained model and each baseline agent (a
   row each; a row whose figures came from the evaluation cache says so);
3. per iteration: rollouts, the learner (the update and the push of the new weights into
   the engine), saving (checkpoint, samples file, metrics) and periodic evaluations;
4. the evaluation after the last iteration, and the report.

:class:`RunClock` adds up the seconds of each phase, logs one line per iteration (the
iteration's rollout and learner seconds, a figure or two, the time elapsed and an
estimate of the time left) and the phase table at the end, and keeps the table in the
run folder (``phases.json``) after every iteration, so that a run stopped midway keeps
what it measured. The report (``report.md``, ``report.json``) shows the same table. The
process's resident memory goes with it: now, in each iteration's line; at its peak in
each phase, a column of the table (``phase_peak_rss_mb`` in ``phases.json``), sampled
every 50 ms by a thread of the clock; and at its peak over the session (``peak_rss_mb``).
The sampler reads ``/proc`` and resets nothing, so ``/usr/bin/time -v`` still sees the
whole process's peak.

A resumed run adds its session to those before it, and its table sums them: it answers
what the run cost and where that time went, and the iterations played again after a
resume were a real part of that cost. The table says how many sessions it adds up, and
from which iteration each resumed.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from mage_rl.fileio import atomic_write_json

logger = logging.getLogger(__name__)

PHASES_FILE = "phases.json"
"""The run folder's record of its phases, one entry per session (start or resume)."""

SETUP = "set-up"
EVAL_BEFORE = "evaluation before: "
ROLLOUTS = "rollouts"
LEARNER = "learner"
SAVING = "saving"
EVAL_DURING = "evaluation during training"
EVAL_AFTER = "evaluation after"
REPORT = "report"
OTHER = "other"

ORDER = (SETUP, EVAL_BEFORE, ROLLOUTS, LEARNER, SAVING, EVAL_DURING, EVAL_AFTER, REPORT)
"""Table order; the evaluations before training sort in by their common prefix."""


def _rank(name: str) -> int:
    return next((i for i, p in enumerate(ORDER) if name.startswith(p)), len(ORDER))


def process_start_time() -> float | None:
    """``time.time()`` when this process started (read from ``/proc``), so that set-up
    counts the imports too; ``None`` where ``/proc`` does not say."""
    try:
        # Field 22 of /proc/self/stat, the start in clock ticks after boot; the fields
        # after the command name in parentheses begin with field 3.
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


def resident_mb() -> float | None:
    """This process's resident memory now, in MiB (``/proc``; ``None`` where absent)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_resident_mb() -> float:
    """This process's peak resident memory so far, in MiB (``getrusage``; kilobytes on
    Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10


class PeakSampler:
    """The highest resident memory of this process between two :meth:`take` calls,
    sampled every ``interval`` seconds on a daemon thread (``/proc``; Linux)."""

    def __init__(self, interval: float = 0.05) -> None:
        self.interval = interval
        self._peak = resident_mb() or 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mage-rss", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            now = resident_mb()
            if now is not None:
                with self._lock:
                    self._peak = max(self._peak, now)

    def take(self) -> float:
        """The peak since the last call (or the start), in MiB; a new peak starts now."""
        now = resident_mb() or 0.0
        with self._lock:
            peak, self._peak = max(self._peak, now), now
        return peak

    def close(self) -> None:
        """Stop the thread."""
        self._stop.set()
        self._thread.join(timeout=1.0)


def clock_text(seconds: float) -> str:
    """``M:SS`` (``H:MM:SS`` from an hour on)."""
    s = max(0, int(round(seconds)))
    h, rest = divmod(s, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60}:{rest % 60:02d}"


class RunClock:
    """The phases of one run: this session's and, on resume, those of the earlier ones.

    Args:
        run_dir: The run folder (``phases.json`` is read from and written to it).
        started: ``time.time()`` when this session began (the start of set-up).
        start_iteration: The iteration this session starts from (0: a fresh run).
        iterations: ``train.iterations``.
    """

    def __init__(
        self, run_dir: str | Path, started: float, start_iteration: int, iterations: int
    ) -> None:
        self.path = Path(run_dir) / PHASES_FILE
        self.started = started
        self.start_iteration = start_iteration
        self.iterations = iterations
        self.seconds: dict[str, float] = {}
        self.running: dict[str, float] = {}
        """Phases under way (name: ``perf_counter`` at their start): the table counts them
        up to the moment it is made, so the report can hold the time of its own phase."""
        self.notes: dict[str, str] = {}
        self.iteration_seconds: list[float] = []
        self.eval_estimate: float | None = None
        """Seconds one evaluation of the fixed tasks takes, for the time left."""
        self.earlier: list[dict[str, Any]] = []
        if start_iteration > 0 and self.path.exists():
            try:
                self.earlier = list(json.loads(self.path.read_text())["sessions"])
            except (ValueError, KeyError, TypeError) as exc:
                logger.warning("%s is unreadable (%s): its sessions are left out", self.path, exc)
        self.iteration = start_iteration
        self.phase_peaks: dict[str, float] = {}
        """The highest resident memory seen in each phase (MiB)."""
        self.sampler = PeakSampler() if resident_mb() is not None else None

    # -- measuring -----------------------------------------------------------------------

    def add(self, name: str, seconds: float, note: str | None = None) -> None:
        """Add ``seconds`` to phase ``name``, which has just ended (``note``: a word for
        its table row). The memory peak since the previous phase ended is its; the first
        phase (set-up) takes the process's peak since it started."""
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds
        if note:
            self.notes[name] = note
        if self.sampler is not None:
            peak = self.sampler.take()
            if not self.phase_peaks:
                peak = max(peak, peak_resident_mb())
            self.phase_peaks[name] = max(self.phase_peaks.get(name, 0.0), peak)

    def close(self) -> None:
        """Stop sampling the memory (the figures stay)."""
        if self.sampler is not None:
            self.sampler.close()

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the block as phase ``name`` (also when it raises)."""
        t0 = self.running.setdefault(name, time.perf_counter())
        if self.sampler is not None and self.phase_peaks:
            self.sampler.take()  # what came since the last phase is no phase's
        try:
            yield
        finally:
            self.running.pop(name, None)
            self.add(name, time.perf_counter() - t0)

    def elapsed(self) -> float:
        """Seconds since this session began."""
        return time.time() - self.started

    def iteration_done(
        self, iteration: int, rollout_s: float, learn_s: float, seconds: float, figures: str
    ) -> str:
        """Log the line of a finished iteration and return it.

        Args:
            iteration: The iteration just finished (1-based).
            rollout_s: Its rollouts' seconds.
            learn_s: Its learner's seconds.
            seconds: Its whole wall time (saving and evaluations included).
            figures: A figure or two of the batch (``success 0.33→0.50 loss +0.012``).
        """
        self.iteration = iteration
        self.iteration_seconds.append(seconds)
        left = self.estimate_left(iteration)
        now = resident_mb()
        memory = "" if now is None else f", memory {now / 1024:.2f} GiB"
        line = (
            f"iteration {iteration}/{self.iterations}: rollouts {rollout_s:.1f} s, learner "
            f"{learn_s:.1f} s, {figures}; elapsed {clock_text(self.elapsed())}, "
            f"about {clock_text(left)} left{memory}"
        )
        logger.info("%s", line)
        return line

    def estimate_left(self, iteration: int, final_eval: bool = True) -> float:
        """The time left after ``iteration``: the mean iteration of this session times
        the iterations left, plus one evaluation when one follows (``final_eval``) and
        its cost is known."""
        mean = sum(self.iteration_seconds) / max(1, len(self.iteration_seconds))
        left = mean * max(0, self.iterations - iteration)
        if final_eval and self.eval_estimate is not None:
            left += self.eval_estimate
        return left

    # -- the table -----------------------------------------------------------------------

    def session(self) -> dict[str, Any]:
        """This session as ``phases.json`` keeps it."""
        seconds = dict(self.seconds)
        now = time.perf_counter()
        for name, t0 in self.running.items():
            seconds[name] = seconds.get(name, 0.0) + now - t0
        return {
            "started_at": datetime.fromtimestamp(self.started, timezone.utc).isoformat(),
            "resumed_from": self.start_iteration or None,
            "iterations": [self.start_iteration, self.iteration],
            "wall_s": round(self.elapsed(), 3),
            "seconds": {k: round(v, 3) for k, v in seconds.items()},
            "notes": dict(self.notes),
            "peak_rss_mb": round(max(peak_resident_mb(), *self.phase_peaks.values()), 1),
            "phase_peak_rss_mb": {k: round(v, 1) for k, v in self.phase_peaks.items()},
        }

    def sessions(self) -> list[dict[str, Any]]:
        """Every session of the run, this one last."""
        return [*self.earlier, self.session()]

    def save(self) -> Path:
        """Write ``phases.json`` (atomically); the caller guards it with ``writing``."""
        return atomic_write_json(self.path, {"sessions": self.sessions()})

    def summary(self) -> dict[str, Any]:
        """The phase table of all sessions: rows of name, seconds and share of the wall
        time, ``other`` (what no phase covers) last, and the sessions."""
        sessions = self.sessions()
        wall = sum(s["wall_s"] for s in sessions)
        totals: dict[str, float] = {}
        notes: dict[str, str] = {}
        peak_of: dict[str, float] = {}
        for s in sessions:
            for name, secs in s["seconds"].items():
                totals[name] = totals.get(name, 0.0) + secs
            notes.update(s.get("notes", {}))
            for name, mb in (s.get("phase_peak_rss_mb") or {}).items():
                peak_of[name] = max(peak_of.get(name, 0.0), mb)
        rows = [
            {"phase": n, "seconds": round(totals[n], 1), "note": notes.get(n, ""),
             "peak_rss_mb": peak_of.get(n)}
            for n in sorted(totals, key=_rank)  # stable: evaluations keep their order
        ]  # fmt: skip
        other = wall - sum(totals.values())
        rows.append(
            {"phase": OTHER, "seconds": round(max(0.0, other), 1), "note": "", "peak_rss_mb": None}
        )
        for row in rows:
            row["share"] = round(row["seconds"] / wall, 4) if wall > 0 else 0.0
        peaks = [s["peak_rss_mb"] for s in sessions if s.get("peak_rss_mb")]
        return {"wall_s": round(wall, 1), "rows": rows, "sessions": sessions,
                "peak_rss_mb": max(peaks) if peaks else None}  # fmt: skip

    def markdown(self) -> list[str]:
        """The phase table as markdown lines, with a line on the sessions it sums."""
        summary = self.summary()
        lines = ["| phase | seconds | share | peak memory |", "| --- | --- | --- | --- |"]
        for r in summary["rows"]:
            name = r["phase"] + (f" ({r['note']})" if r["note"] else "")
            lines.append(f"| {name} | {r['seconds']:.1f} | {100 * r['share']:.1f} % | {_gib(r)} |")
        peak = summary["peak_rss_mb"]
        total = f"{peak / 1024:.2f} GiB" if peak else "–"
        lines.append(f"| total | {summary['wall_s']:.1f} | 100 % | {total} |")
        if summary["peak_rss_mb"]:
            lines += ["", f"Peak resident memory: {summary['peak_rss_mb'] / 1024:.2f} GiB."]
        sessions = summary["sessions"]
        if len(sessions) > 1:
            resumed = ", ".join(
                f"iteration {s['resumed_from']}" for s in sessions[1:] if s["resumed_from"]
            )
            lines += [
                "",
                f"The run ran in {len(sessions)} sessions (resumed from {resumed}); the table "
                "adds them up, the iterations played again after a resume included.",
            ]
        return lines

    def log_table(self) -> None:
        """Log the phase table, one line per phase."""
        summary = self.summary()
        logger.info("phases of the run (%s in all):", clock_text(summary["wall_s"]))
        for r in summary["rows"]:
            note = f" ({r['note']})" if r["note"] else ""
            logger.info(
                "  %-38s %8.1f s %5.1f %%  peak %s",
                r["phase"] + note, r["seconds"], 100 * r["share"], _gib(r),
            )  # fmt: skip
        if summary["peak_rss_mb"]:
            logger.info("peak resident memory: %.2f GiB", summary["peak_rss_mb"] / 1024)


def _gib(row: dict[str, Any]) -> str:
    """A table row's memory peak in GiB, or a dash where it was not measured."""
    mb = row.get("peak_rss_mb")
    return f"{mb / 1024:.2f} GiB" if mb else "–"
