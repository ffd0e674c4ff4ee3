"""``mage bench view``: how fast the page of a large run folder opens.

A run folder of ``meta_episodes`` training meta-episodes is made from a real run's saved
samples (each one repeated with a new task seed until the count is reached, so the
meta-episodes have real sizes), ``mage view`` writes its page, and headless Chromium
opens it from a local HTTP server: the time from navigation to the first page of the
list drawn (the figures, the index and 50 rows), and to one meta-episode of the last
chunk drawn (its chunk loaded on demand). Each timing is repeated ``rounds`` times in a
fresh tab with the cache off.
"""

from __future__ import annotations

import gzip
import json
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from mage_rl.view.browser import chromium, wait_for
from mage_rl.view.cli import folder_server


def _synthetic_run(source: Path, folder: Path, count: int) -> int:
    """Copy ``source``'s figures and fill ``samples/`` with ``count`` meta-episodes made
    from its saved ones; returns the bytes of the samples."""
    from mage_rl.rl.samples import read_samples

    records = list(read_samples(source))
    if not records:
        raise ValueError(
            f"{source} has no saved samples (samples/iter_*.jsonl.gz); train it with "
            "train.save_samples > 0"
        )
    folder.mkdir(parents=True)
    for name in ("config.yaml", "metrics.jsonl", "report.json"):
        if (source / name).exists():
            shutil.copy(source / name, folder / name)
    (folder / "samples").mkdir()
    per_file = max(1, count // 10)
    written = 0
    size = 0
    while written < count:
        path = folder / "samples" / f"iter_{written // per_file + 1:06d}.jsonl.gz"  # 10 files
        with gzip.open(path, "wt") as handle:
            for _ in range(min(per_file, count - written)):
                iteration = written // per_file + 1
                record = dict(records[written % len(records)], seed=written, iteration=iteration)
                handle.write(json.dumps(record) + "\n")
                written += 1
        size += path.stat().st_size
    return size


def bench_view(run: str, meta_episodes: int = 10_000, rounds: int = 3) -> dict[str, Any]:
    """Build the page of a synthetic run of ``meta_episodes`` and time it in Chromium."""
    from mage_rl.view.build import build_site

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "run"
        samples_bytes = _synthetic_run(Path(run), folder, meta_episodes)
        t0 = time.perf_counter()
        built = build_site([folder], Path(tmp) / "page")
        build_s = time.perf_counter() - t0
        data = Path(tmp) / "page" / "data"
        index_bytes = (data / "index.js").stat().st_size
        site_bytes = (data / "site.js").stat().st_size
        last = built["meta_episodes"] - 1
        server = folder_server(Path(tmp) / "page")
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        url = f"http://127.0.0.1:{server.server_address[1]}/"
        first_page: list[float] = []
        open_last: list[float] = []
        try:
            with chromium() as driver:
                driver.execute_cdp_cmd("Network.setCacheDisabled", {"cacheDisabled": True})
                for _ in range(rounds):
                    driver.get("about:blank")
                    t0 = time.perf_counter()
                    driver.get(url)
                    wait_for(driver, "return document.body.dataset.ready", 60)
                    first_page.append(time.perf_counter() - t0)
                    rows = driver.execute_script(
                        "return document.querySelectorAll('#list tr.row').length"
                    )
                    t0 = time.perf_counter()
                    driver.execute_script(
                        "document.getElementById('filters').elements.seed.value = arguments[0];"
                        "document.getElementById('filters').dispatchEvent(new Event('input'));"
                        "document.querySelector('#list tr.row').click();",
                        str(meta_episodes - 1),
                    )
                    wait_for(
                        driver,
                        f"return document.getElementById('pane-a').dataset.ready === '{last}'",
                        60,
                    )
                    open_last.append(time.perf_counter() - t0)
        finally:
            server.shutdown()
            server.server_close()
    return {
        "meta_episodes": built["meta_episodes"],
        "chunks": built["chunks"],
        "samples_mib": samples_bytes / 2**20,
        "index_mib": index_bytes / 2**20,
        "site_kib": site_bytes / 1024,
        "build_s": build_s,
        "first_page_s": first_page,
        "first_page_median_s": statistics.median(first_page),
        "rows_on_first_page": rows,
        "open_last_s": open_last,
        "open_last_median_s": statistics.median(open_last),
        "rounds": rounds,
        "source_run": run,
    }


def format_view_report(result: dict[str, Any]) -> str:
    return "\n".join([
        f"mage view of {result['meta_episodes']} meta-episodes "
        f"({result['samples_mib']:.1f} MiB of samples, {result['chunks']} chunks; "
        f"index {result['index_mib']:.2f} MiB, figures {result['site_kib']:.0f} KiB)",
        f"  page written in {result['build_s']:.1f} s",
        f"  first page in Chromium: median {result['first_page_median_s']:.3f} s "
        f"(rounds: {', '.join(f'{x:.3f}' for x in result['first_page_s'])}; "
        f"{result['rows_on_first_page']} rows shown)",
        f"  last meta-episode opened: median {result['open_last_median_s']:.3f} s "
        f"(its chunk loaded on demand)",
    ])  # fmt: skip
