"""Benchmarks: throughput figures measured as ratios within one run on one machine.

* :func:`bench_rollout`: meta-episodes through the real graph and local engine, with
  requests batched across concurrent meta-episodes versus decoded one at a time.
* :func:`bench_learner`: PPO-update throughput of the embedded learner per forward dtype.
* :func:`bench_serve`: requests per second of ``mage serve`` at 1 vs 16 concurrent clients.
* :func:`~mage_rl.bench.hardware.bench_hardware`: the learner's update and the engine's
  decode as a share of the machine's measured matmul peak and copy bandwidth.

The learning probes (:mod:`mage_rl.bench.learning`) measure learning rather than speed.
:mod:`mage_rl.bench.cli` is ``mage bench``. (The adaptation and identification studies
are not part of the package: they are in the checkout's ``studies/adaptation/``.)

Absolute numbers depend on the machine and on whatever else runs on it; the ratios,
measured back to back in one process, are the claims. ``docs/benchmarks.md`` records
measured figures and the command that produced them.
"""

from __future__ import annotations

from mage_rl.bench.learner import bench_learner, format_learner_report
from mage_rl.bench.rollout import bench_rollout, format_rollout_report
from mage_rl.bench.serve import bench_serve, format_serve_report

__all__ = [
    "bench_learner",
    "bench_rollout",
    "bench_serve",
    "format_learner_report",
    "format_rollout_report",
    "format_serve_report",
]
