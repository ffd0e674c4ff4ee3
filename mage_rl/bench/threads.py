"""Torch's thread count for a benchmark, set once before any model is built."""

from __future__ import annotations


def apply_threads(threads: int | None) -> int:
    """Give torch ``threads`` intra-op threads for the rest of the process.

    Set before any model is built, the count holds in every thread torch starts later
    (the engine's decoding thread included). ``None`` keeps torch's default, one thread
    per core. Ray rollout workers (``train.backend=ray``) run in their own processes with
    one thread each whatever this says.

    Returns:
        The thread count torch now uses.

    Raises:
        ValueError: On a count below 1.
    """
    import torch

    if threads is not None:
        if threads < 1:
            raise ValueError(f"--threads {threads}: give a thread count >= 1")
        torch.set_num_threads(threads)
    return torch.get_num_threads()
