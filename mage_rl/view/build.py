"""``mage view``: a local web page for run folders, written as a static folder.

The folder opens without a server and without a network (``file://``): the page's
scripts, its chart library (uPlot, vendored in :mod:`mage_rl.view` with its licence) and
its data are local files. Data travels as small scripts rather than JSON, since a page
opened from a file may not fetch files: ``data/site.js`` (every run's figures),
``data/index.js`` (one short row per meta-episode, which the page filters and pages)
and ``data/chunk_NNNNN.js`` (the meta-episodes themselves, :data:`CHUNK_SIZE` a file,
loaded when one of them is opened). The first page reads the figures and the index
only, so it opens as fast with 10,000 meta-episodes as with ten.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from mage_rl.provenance import provenance
from mage_rl.view.data import INDEX_COLUMNS, meta_episode, meta_episodes, run_summary

CHUNK_SIZE = 100
ASSETS = ("view.js", "view.css", "uPlot.iife.min.js", "uPlot.min.css", "LICENSE.uPlot")


def _script(call: str, *args: Any) -> str:
    body = ",".join(json.dumps(a, separators=(",", ":"), allow_nan=False) for a in args)
    return f"MAGE.{call}({body});\n"


def _names(paths: Sequence[Path]) -> list[str]:
    names: list[str] = []
    for path in paths:
        name = path.resolve().name or str(path)
        while name in names:
            name += "'"
        names.append(name)
    return names


def build_site(
    runs: Sequence[str | Path],
    out: str | Path,
    *,
    chunk_size: int = CHUNK_SIZE,
    on_meta_episode: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Write the page of ``runs`` into ``out`` (replacing an earlier page there).

    Returns:
        ``{"index": PATH, "meta_episodes": N, "chunks": C, "runs": [names]}``.

    Raises:
        ValueError: A folder is neither a training run nor an evaluation.
    """
    from jinja2 import Environment, PackageLoader, select_autoescape

    paths = [Path(r) for r in runs]
    for path in paths:
        if not path.is_dir():
            raise ValueError(
                f"{path} is not a folder; give a run folder of mage train or mage eval"
            )
    out = Path(out)
    data = out / "data"
    if data.exists():
        shutil.rmtree(data)
    (out / "assets").mkdir(parents=True, exist_ok=True)
    data.mkdir(parents=True)
    static = resources.files("mage_rl.view") / "static"
    for name in ASSETS:
        (out / "assets" / name).write_bytes((static / name).read_bytes())

    names = _names(paths)
    summaries = [run_summary(path, name) for path, name in zip(paths, names, strict=True)]
    rows: list[list[Any]] = []
    chunk: list[dict[str, Any]] = []
    chunks = 0

    def flush() -> None:
        nonlocal chunks
        if chunk:
            (data / f"chunk_{chunks:05d}.js").write_text(_script("chunk", chunks, chunk))
            chunks += 1
            chunk.clear()

    for run, path in enumerate(paths):
        for source, label, iteration, record in meta_episodes(path):
            row, full = meta_episode(run, source, label, iteration, record)
            full["id"] = len(rows)
            rows.append(row)
            chunk.append(full)
            if len(chunk) >= chunk_size:
                flush()
            if on_meta_episode is not None:
                on_meta_episode()
    flush()
    (data / "index.js").write_text(_script("index", list(INDEX_COLUMNS), rows))
    site = {"runs": summaries, "chunk_size": chunk_size, "count": len(rows),
            "provenance": provenance()}  # fmt: skip
    (data / "site.js").write_text(_script("site", site))
    env = Environment(loader=PackageLoader("mage_rl.view", "templates"),
                      autoescape=select_autoescape(["html"]))  # fmt: skip
    page = env.get_template("index.html").render(runs=names, count=len(rows))
    (out / "index.html").write_text(page)
    return {"index": str(out / "index.html"), "meta_episodes": len(rows), "chunks": chunks,
            "runs": names}  # fmt: skip
