"""The calls a run trained on, with their credit: ``samples/iter_NNNNNN.jsonl.gz``.

Every ``train.save_samples`` iterations, and at the last one, the trainer writes the
meta-episodes of that iteration's training batch: one gzip JSON line per meta-episode,
and in it every LLM call with its prompt, response, tokens, log-probs and the parts of
its credit (:func:`~mage_rl.rl.advantages.credit_parts`). A call also keeps the fields
credit assignment reads (kind, episode, anchor, opponent, node, invalid flag, lengths,
reward), so :func:`sample_record` rebuilds records that give, through
:func:`~mage_rl.rl.advantages.compute_advantages` with the run's config, the saved
advantages again. ``samples/index.json`` lists the files with their iteration and
counts, stamped with the writer's provenance (:func:`mage_rl.provenance.write_results`).

Files go in atomically (a temporary sibling, then a rename), so a crash never leaves half
a file. A resumed run removes the files of the iterations after its checkpoint before it
plays them again, as ``metrics.jsonl`` is cut (:mod:`mage_rl.rl.metrics_log`). The
format is documented in docs/training.md, "What the run folder shows of the credit".
"""

from __future__ import annotations

import gzip
import json
import logging
import math
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from mage_rl.provenance import write_results
from mage_rl.records import EpisodeResult, MetaEpisodeRecord, Turn, plain_fields
from mage_rl.rl.advantages import CallCredit
from mage_rl.train_folder import checkpoint_iteration, checkpoint_name

logger = logging.getLogger(__name__)

SAMPLES_DIR = "samples"
INDEX_FILE = "index.json"
SUFFIX = ".jsonl.gz"


def samples_due(iteration: int, last: int, every: int) -> bool:
    """Whether ``iteration`` writes its samples: every ``every`` iterations and at the
    ``last`` one; never when ``every`` is 0."""
    return every > 0 and (iteration % every == 0 or iteration == last)


def sample_path(run_dir: str | Path, iteration: int) -> Path:
    """``RUN/samples/iter_000012.jsonl.gz`` for iteration 12."""
    return Path(run_dir) / SAMPLES_DIR / f"{checkpoint_name(iteration)}{SUFFIX}"


def _file_iteration(path: Path) -> int | None:
    if not path.name.endswith(SUFFIX):
        return None
    return checkpoint_iteration(Path(path.name[: -len(SUFFIX)]))


class _Decoder:
    """Token ids to text with the run's tokenizer; each id is decoded on its own once."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.pieces: dict[int, str] = {}

    def tokens(self, ids: Sequence[int]) -> list[str]:
        if self.tokenizer is None:
            return []
        out = []
        for i in ids:
            piece = self.pieces.get(i)
            if piece is None:
                piece = self.pieces[i] = self.tokenizer.decode([i])
            out.append(piece)
        return out

    def text(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids)) if self.tokenizer is not None and ids else ""


def _call(turn: Turn, credit: CallCredit, decoder: _Decoder) -> dict[str, Any]:
    return {
        "node": turn.node,
        "kind": turn.kind,
        "episode": turn.episode,
        "step": turn.step,
        # The messages as the call rendered them; a call that kept only token ids (a
        # policy outside the tracing layer) is shown as its decoded prompt.
        "prompt": list(turn.prompt_text) if turn.prompt_text else decoder.text(turn.prompt_ids),
        "response": turn.text,
        "tokens": decoder.tokens(turn.response_ids),
        "logprobs": list(turn.logprobs),
        "reward": credit.reward,
        "return": _finite(credit.ret),
        "score": _finite(credit.score),
        "a_episode": credit.a_episode,
        "a_step": credit.a_step,
        "advantage": credit.advantage,
        "invalid": turn.invalid,
        "trained": turn.trained,
        "acting": turn.acting,
        "invalid_reason": turn.invalid_reason,
        "finish_reason": turn.finish_reason,
        # What credit assignment reads besides the fields above (sample_record).
        "anchor": turn.anchor,
        "opponent": turn.opponent,
        "response_length": turn.response_length,
        "max_response_length": turn.max_response_length,
    }


def sample_rows(
    records: Sequence[MetaEpisodeRecord],
    credit: Sequence[Sequence[CallCredit]],
    iteration: int,
    tokenizer: Any = None,
) -> list[dict[str, Any]]:
    """One JSON-able row per meta-episode: its task, episodes, reflections and calls.

    Args:
        records: The iteration's training batch.
        credit: :func:`~mage_rl.rl.advantages.credit_parts` of ``records``.
        iteration: The iteration (1-based, as in ``metrics.jsonl``).
        tokenizer: Decodes ``tokens`` (each response token on its own) and the prompt of
            a call without messages; ``None`` leaves them empty.
    """
    decoder = _Decoder(tokenizer)
    rows = []
    for record, parts in zip(records, credit, strict=True):
        if len(parts) != len(record.turns):
            raise ValueError(
                f"record {record.uid!r} (rollout {record.rollout}) has {len(record.turns)} "
                f"turns but {len(parts)} credit entries"
            )
        rows.append(
            {
                "iteration": iteration,
                "uid": record.uid,
                "rollout": record.rollout,
                "env": record.env,
                "seed": record.seed,
                "opponent": record.opponent,
                "seat": record.seat,
                "agent": record.agent,
                "episodes": [plain_fields(e) for e in record.episodes],
                "reflections": list(record.reflections),
                "calls": [_call(t, c, decoder) for t, c in zip(record.turns, parts, strict=True)],
            }
        )
    return rows


def _atomic_write_gzip(path: Path, lines: Iterable[str]) -> None:
    # As mage_rl.fileio.atomic_write_lines, for a gzip file: a hidden sibling named after
    # the target, flushed, then renamed into place.
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("wb") as raw:
            # mtime 0: the same rows give the same bytes.
            with gzip.GzipFile(path.name, "wb", compresslevel=6, fileobj=raw, mtime=0) as gz:
                for line in lines:
                    gz.write(line.encode("utf-8"))
            raw.flush()
            os.fsync(raw.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_samples(
    run_dir: str | Path,
    iteration: int,
    records: Sequence[MetaEpisodeRecord],
    credit: Sequence[Sequence[CallCredit]],
    tokenizer: Any = None,
    started: float | None = None,
) -> Path:
    """Write ``samples/iter_NNNNNN.jsonl.gz`` (replacing it) and refresh the index.

    Args:
        run_dir: The run folder.
        iteration: The iteration the batch trained.
        records: The training batch.
        credit: :func:`~mage_rl.rl.advantages.credit_parts` of ``records``.
        tokenizer: See :func:`sample_rows`.
        started: ``time.time()`` when the run started, for the index's provenance.

    Returns:
        The samples file.
    """
    path = sample_path(run_dir, iteration)
    rows = sample_rows(records, credit, iteration, tokenizer)
    _atomic_write_gzip(path, (json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
    entry = _entry(path, iteration, len(rows), sum(len(row["calls"]) for row in rows))
    _write_index(path.parent, started, {path.name: entry})
    return path


def prune_samples(run_dir: str | Path, last_iteration: int, started: float | None = None) -> None:
    """Remove the samples files of iterations after ``last_iteration`` (a resumed run
    plays them again; a run started over plays all of them again) and their index rows."""
    folder = Path(run_dir) / SAMPLES_DIR
    if not folder.is_dir():
        return
    removed = 0
    for path in folder.glob(f"iter_*{SUFFIX}"):
        iteration = _file_iteration(path)
        if iteration is not None and iteration > last_iteration:
            path.unlink()
            removed += 1
    for stray in folder.glob(".*.tmp"):  # a write a kill interrupted
        stray.unlink(missing_ok=True)
    if removed:
        logger.info("%s: removed %d file(s) after iteration %d", folder, removed, last_iteration)
        _write_index(folder, started)


def _finite(value: float) -> float | None:
    """A value for JSON: ``None`` where a registered estimator gave no return or score."""
    return value if math.isfinite(value) else None


def _entry(path: Path, iteration: int, meta_episodes: int, calls: int) -> dict[str, Any]:
    return {"file": path.name, "iteration": iteration, "meta_episodes": meta_episodes,
            "calls": calls}  # fmt: skip


def _write_index(
    folder: Path, started: float | None, fresh: dict[str, dict[str, Any]] | None = None
) -> None:
    """``index.json``: one entry per samples file in the folder, in iteration order.

    Entries come from ``fresh``, else from the index as it was, else from reading the
    file (an index lost or written by an older version)."""
    known: dict[str, dict[str, Any]] = {}
    index = folder / INDEX_FILE
    if index.exists():
        try:
            known = {e["file"]: e for e in json.loads(index.read_text())["files"]}
        except (ValueError, KeyError, TypeError):
            logger.warning("%s is not a samples index; rebuilding it from the files", index)
    known.update(fresh or {})
    entries = []
    for path in folder.glob(f"iter_*{SUFFIX}"):
        iteration = _file_iteration(path)
        if iteration is None:
            continue
        entry = known.get(path.name)
        if entry is None:
            try:
                rows = list(read_samples(path))
            except (OSError, EOFError, ValueError) as exc:
                logger.warning("%s cannot be read (%s); left out of the index", path, exc)
                continue
            entry = _entry(path, iteration, len(rows), sum(len(r["calls"]) for r in rows))
        entries.append(entry)
    entries.sort(key=lambda e: e["iteration"])
    write_results(index, {"files": entries}, started=started)


def read_samples(path: str | Path) -> Iterator[dict[str, Any]]:
    """The rows (one per meta-episode) of a samples file, in order.

    Args:
        path: A ``samples/iter_NNNNNN.jsonl.gz`` file, or a run folder or its
            ``samples/`` folder: every samples file in it, in iteration order.

    Yields:
        Each row as a dict (the format of docs/training.md).
    """
    path = Path(path)
    if path.is_dir():
        folder = path / SAMPLES_DIR if (path / SAMPLES_DIR).is_dir() else path
        found = [(_file_iteration(p), p) for p in folder.glob(f"iter_*{SUFFIX}")]
        for _, file in sorted((i, p) for i, p in found if i is not None):
            yield from read_samples(file)
        return
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def sample_record(row: dict[str, Any]) -> MetaEpisodeRecord:
    """A row back as a :class:`~mage_rl.records.MetaEpisodeRecord`.

    The turns carry every field credit assignment reads, the texts and the log-probs,
    but no token ids: enough for :func:`~mage_rl.rl.advantages.credit_parts`, not for
    the learner.
    """
    turns = [
        Turn(
            kind=c["kind"],
            episode=c["episode"],
            step=c["step"],
            logprobs=list(c["logprobs"]),
            text=c["response"],
            anchor=c["anchor"],
            opponent=c["opponent"],
            invalid=c["invalid"],
            invalid_reason=c["invalid_reason"],
            response_length=c["response_length"],
            max_response_length=c["max_response_length"],
            finish_reason=c["finish_reason"],
            reward=c["reward"],
            prompt_text=c["prompt"] if isinstance(c["prompt"], list) else [],
            node=c["node"],
            trained=c["trained"],
        )
        for c in row["calls"]
    ]
    return MetaEpisodeRecord(
        uid=row["uid"],
        rollout=row["rollout"],
        env=row["env"],
        seed=row["seed"],
        opponent=row["opponent"],
        seat=row["seat"],
        episodes=[EpisodeResult(**e) for e in row["episodes"]],
        turns=turns,
        reflections=list(row["reflections"]),
        agent=row["agent"],
    )
