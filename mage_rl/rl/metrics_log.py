"""Training metrics to TensorBoard event files and a ``metrics.jsonl``.

Names use fixed namespaces (``charts/``, ``losses/``, ``perf/``, ``eval/``, and
``nodes/<node>/`` for the credit of each graph node's calls) so curves from different
runs line up. Each JSONL line is one iteration's flat mapping, flushed
right away so a crash loses nothing already logged.

A resumed run opens the logger at the iteration of its checkpoint: lines logged after
that checkpoint by the run that was stopped (they will be logged again) and a torn last
line are cut from ``metrics.jsonl``. TensorBoard follows ``metrics.jsonl``: the kept
lines are written to a new event file and the earlier event files are deleted, so every
iteration appears once in both. (Hiding steps with ``SummaryWriter``'s ``purge_step``
depends on the order in which TensorBoard reads the files, which their names do not
always give: two files of one second sort by process id and a counter, as text.)
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mage_rl.fileio import atomic_write_lines
from mage_rl.records import MetaEpisodeRecord, Turn
from mage_rl.rl.advantages import CallCredit

logger = logging.getLogger(__name__)


def flatten_summary(summary: dict[str, Any], prefix: str) -> dict[str, float]:
    """``summarize_records`` output -> flat ``{prefix/metric@k: value}``."""
    out: dict[str, float] = {}

    def put(block: dict[str, Any], where: str) -> None:
        for name in ("success@k", "draw@k", "ev@k"):
            for k, value in enumerate(block.get(name, []), start=1):
                if value is not None:
                    out[f"{where}/{name[:-2]}@{k}"] = float(value)
        if "final_reward" in block:
            out[f"{where}/final_reward"] = float(block["final_reward"])

    put(summary, prefix)
    for opponent, block in summary.get("by_opponent", {}).items():
        put(block, f"{prefix}/opponent/{opponent.split(':', 1)[-1]}")
    for seat, block in summary.get("by_seat", {}).items():
        put(block, f"{prefix}/seat/{seat}")
    return out


def node_metrics(
    records: Sequence[MetaEpisodeRecord], credit: Sequence[Sequence[CallCredit]]
) -> dict[str, float]:
    """The credit of a batch's calls, node by node: ``{nodes/<node>/<metric>: value}``.

    Per node (``Turn.node``; the turn kind when a call names none): ``calls``;
    ``tokens``, the response tokens of its calls in all; ``return_mean``,
    ``return_std``, ``advantage_mean``, ``advantage_std`` (population std),
    ``a_episode_mean``, ``a_step_mean``; ``invalid_share`` over its acting calls (left
    out when it has none); ``entropy``, the mean over its calls of the mean negative
    log-prob of the sampled response tokens (a sample estimate of the per-token entropy
    of the sampling distribution; left out when no call recorded log-probs).

    Args:
        records: The training batch.
        credit: :func:`~mage_rl.rl.advantages.credit_parts` of ``records``.
    """
    by_node: dict[str, list[tuple[Turn, CallCredit]]] = {}
    for record, calls in zip(records, credit, strict=True):
        for turn, part in zip(record.turns, calls, strict=True):
            by_node.setdefault(turn.node or turn.kind, []).append((turn, part))
    out: dict[str, float] = {}
    for node, pairs in sorted(by_node.items()):
        turns = [t for t, _ in pairs]
        returns = np.array([c.ret for _, c in pairs])
        advantages = np.array([c.advantage for _, c in pairs])
        where = f"nodes/{node}"
        out[f"{where}/calls"] = float(len(pairs))
        out[f"{where}/tokens"] = float(sum(len(t.response_ids) for t in turns))
        if np.isfinite(returns).all():  # a registered estimator may give no returns
            out[f"{where}/return_mean"] = float(returns.mean())
            out[f"{where}/return_std"] = float(returns.std())
        out[f"{where}/advantage_mean"] = float(advantages.mean())
        out[f"{where}/advantage_std"] = float(advantages.std())
        out[f"{where}/a_episode_mean"] = float(np.mean([c.a_episode for _, c in pairs]))
        out[f"{where}/a_step_mean"] = float(np.mean([c.a_step for _, c in pairs]))
        acting = [t for t in turns if t.acting]
        if acting:
            out[f"{where}/invalid_share"] = sum(t.invalid for t in acting) / len(acting)
        surprise = [-float(np.mean(t.logprobs)) for t in turns if t.logprobs]
        if surprise:
            out[f"{where}/entropy"] = float(np.mean(surprise))
    return out


def cut_metrics(path: Path, last_iteration: int) -> list[dict[str, Any]]:
    """Keep the lines of ``path`` up to ``last_iteration``; drop a torn last line.

    Args:
        path: A ``metrics.jsonl``; rewritten atomically when anything is dropped.
        last_iteration: The iteration of the checkpoint the run continues from (0 for a
            start from scratch).

    Returns:
        The lines kept, parsed.

    Raises:
        ValueError: A line other than the last one is not JSON (a damaged file, not a
            stopped write); the message names the line.
    """
    if not path.exists():
        return []
    text = path.read_text(encoding="utf-8", errors="replace")
    lines = text.split("\n")
    kept: list[dict[str, Any]] = []
    kept_text: list[str] = []
    dropped = 0
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            step = int(row["iteration"])
        except (ValueError, TypeError, KeyError) as exc:
            # A write stopped by a kill leaves only the last line unfinished.
            if number >= len(lines) - 1:
                logger.warning("%s: dropping a partly written last line", path)
                dropped += 1
                continue
            raise ValueError(
                f"{path}:{number} is not a metrics line ({exc}); delete or fix that line"
            ) from None
        if step > last_iteration:
            dropped += 1
            continue
        kept.append(row)
        kept_text.append(line + "\n")
    if dropped or (text and not text.endswith("\n")):
        if dropped:
            logger.info("%s: dropped %d line(s) after iteration %d", path, dropped, last_iteration)
        atomic_write_lines(path, kept_text)
    return kept


class MetricsLogger:
    """Writes scalars to TensorBoard (``tb/``) and ``metrics.jsonl`` in a run folder.

    Args:
        run_dir: The run folder.
        start_iteration: The iteration the run continues from: later lines of an earlier
            session are cut (:func:`cut_metrics`) and hidden in TensorBoard.
    """

    def __init__(self, run_dir: str | Path, start_iteration: int = 0) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        path = self.run_dir / "metrics.jsonl"
        self.kept = cut_metrics(path, start_iteration)
        tb = self.run_dir / "tb"
        earlier = sorted(tb.glob("events.out.tfevents.*")) if tb.is_dir() else []
        self.writer = SummaryWriter(log_dir=str(tb))
        if earlier:
            # The kept lines go to the new file before the old files go: a kill in
            # between leaves duplicates that the next start removes the same way.
            for row in self.kept:
                self._add(int(row["iteration"]), row)
            self.writer.flush()
            for old in earlier:
                old.unlink(missing_ok=True)
        self._jsonl = path.open("a", encoding="utf-8")

    def _add(self, step: int, scalars: dict[str, Any]) -> None:
        for key, value in scalars.items():
            if key != "iteration" and isinstance(value, int | float):
                self.writer.add_scalar(key, value, step)

    def log(self, step: int, scalars: dict[str, float]) -> None:
        clean = {k: float(v) for k, v in scalars.items() if v is not None and math.isfinite(v)}
        self._add(step, clean)
        self.writer.flush()
        self._jsonl.write(json.dumps({"iteration": step, **clean}) + "\n")
        self._jsonl.flush()

    def close(self) -> None:
        self.writer.close()
        self._jsonl.close()
