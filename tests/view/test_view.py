"""``mage view``: the page of a short tiny-model run, built and read in headless Chromium.

The run is the two-call planner example trained two iterations with every training
batch saved (``train.save_samples=1``) and evaluated, so the page holds training
meta-episodes with their credit and evaluated ones beside the untrained model's.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mage_rl.cli import main
from mage_rl.rl.samples import read_samples
from mage_rl.view.browser import chromium, chromium_missing, wait_for
from mage_rl.view.build import build_site

EXAMPLES = Path(__file__).parents[2] / "examples" / "extending"


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("view") / "planner"
    code = main(["train", str(EXAMPLES / "planner_kuhn_tiny.yaml"), "--run-dir", str(folder),
                 "--no-progress", "--set", "train.iterations=2", "--set", "train.save_samples=1",
                 "--set", "eval.tasks=2", "--set", "meta.episodes=2"])  # fmt: skip
    assert code == 0
    return folder


def _samples(run: Path) -> list[dict[str, Any]]:
    return list(read_samples(run))


def test_the_page_holds_every_meta_episode_and_its_credit(run: Path, tmp_path: Path) -> None:
    built = build_site([run], tmp_path / "page", chunk_size=3)
    samples = _samples(run)
    evaluated = sum(1 for f in (run / "eval").glob("*.jsonl") for _ in f.open())
    assert built["meta_episodes"] == len(samples) + evaluated
    assert built["chunks"] == -(-built["meta_episodes"] // 3)
    text = (tmp_path / "page" / "data" / "chunk_00000.js").read_text()
    assert text.startswith("MAGE.chunk(0,")
    first = json.loads(text[len("MAGE.chunk(0,") : -3])
    call = first[0]["calls"][1]
    saved = samples[0]["calls"][1]
    assert (call["node"], call["response"]) == (saved["node"], saved["response"])
    assert call["advantage"] == pytest.approx(saved["advantage"], abs=1e-6)
    assert {"a_episode", "a_step", "ret", "tokens", "logprobs"} <= set(call)
    index = (tmp_path / "page" / "data" / "index.js").read_text()
    assert index.startswith('MAGE.index(["run","source","label"')
    # no asset from the network: every script and stylesheet is a local file
    page = (tmp_path / "page" / "index.html").read_text()
    assert "http" not in page and (tmp_path / "page" / "assets" / "uPlot.iife.min.js").exists()


def test_view_refuses_a_folder_that_is_no_run(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="neither a training run"):
        build_site([tmp_path / "empty"], tmp_path / "page")


@pytest.fixture()
def browser() -> Iterator[Any]:
    problem = chromium_missing()
    if problem:
        pytest.skip(f"the browser test needs Chromium: {problem}")
    with chromium() as driver:
        yield driver


def test_the_page_in_chromium(run: Path, tmp_path: Path, browser: Any) -> None:
    """mage view as a user runs it: the page served on 127.0.0.1, read in Chromium."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    from mage_rl.net import free_port

    port = free_port()
    page = tmp_path / "page"
    server = threading.Thread(target=main, daemon=True,
                              args=(["view", str(run), "--out", str(page), "--port", str(port),
                                     "--no-progress"],))  # fmt: skip
    server.start()
    _wait_for_port(port)
    browser.get(f"http://127.0.0.1:{port}/")
    wait_for(browser, "return document.body.dataset.ready")
    assert not [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    total = len(_samples(run)) + sum(1 for f in (run / "eval").glob("*.jsonl") for _ in f.open())
    assert browser.find_element(By.ID, "count").text == f"{total} of {total} meta-episodes"
    charts = browser.find_elements(By.CSS_SELECTOR, ".uplot")
    assert len(charts) == 2  # the learning curves were drawn

    # A known call of the first training batch: its advantage is shown with its value.
    saved = _samples(run)[0]
    browser.find_element(By.CSS_SELECTOR, '#list tr[data-id="0"]').click()
    wait_for(browser, "return document.getElementById('pane-a').dataset.ready === '0'")
    j = next(i for i, c in enumerate(saved["calls"]) if c["node"] == "act")
    adv = browser.find_element(By.CSS_SELECTOR, f'[data-call="0:{j}"] .adv')
    assert float(adv.get_attribute("data-value")) == pytest.approx(
        saved["calls"][j]["advantage"], abs=1e-5
    )
    assert adv.text.startswith("A ")
    assert f"{saved['calls'][j]['advantage']:+.4f}" in adv.text
    tokens = browser.find_elements(By.CSS_SELECTOR, f'[data-call="0:{j}"] .tok')
    assert len(tokens) == len(saved["calls"][j]["tokens"])  # shaded by log-prob, token by token

    # Filters change the list: the evaluations only, then one opponent.
    Select(browser.find_element(By.NAME, "source")).select_by_value("eval")
    evaluated = total - len(_samples(run))
    assert browser.find_element(By.ID, "count").text == f"{evaluated} of {total} meta-episodes"
    opponent = browser.find_element(By.CSS_SELECTOR, "#list tr.row td:nth-child(4)").text
    Select(browser.find_element(By.NAME, "opponent")).select_by_value(opponent)
    rows = browser.find_elements(By.CSS_SELECTOR, "#list tr.row")
    assert rows and all(r.find_elements(By.TAG_NAME, "td")[3].text == opponent for r in rows)
    browser.save_screenshot(str(tmp_path / "view.png"))
    assert (tmp_path / "view.png").stat().st_size > 10_000

    # The same folder opens from the file, without the server.
    browser.get((page / "index.html").as_uri())
    wait_for(browser, "return document.body.dataset.ready")
    assert browser.find_element(By.ID, "count").text == f"{total} of {total} meta-episodes"


def _wait_for_port(port: int, timeout: float = 60.0) -> None:
    import socket

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise AssertionError(f"mage view did not serve on port {port}")


def test_an_evaluation_folder_shows_its_agents_on_the_same_tasks(tmp_path: Path) -> None:
    out = tmp_path / "eval"
    assert main(["eval", "--agent", "react=tiny", "--agent", "reflexion=tiny", "--n", "2",
                 "--episodes", "2", "--out", str(out), "--no-progress"]) == 0  # fmt: skip
    built = build_site([out], tmp_path / "page")
    assert built["meta_episodes"] == 4
    index = (tmp_path / "page" / "data" / "index.js").read_text()
    columns, rows = json.loads("[" + index[len("MAGE.index(") : -3] + "]")
    label, seed = columns.index("label"), columns.index("seed")
    by_agent = {a: sorted(r[seed] for r in rows if r[label] == a) for a in ("react", "reflexion")}
    assert by_agent["react"] == by_agent["reflexion"] and len(by_agent["react"]) == 2
    site = (tmp_path / "page" / "data" / "site.js").read_text()
    assert '"results":{"react":{"kuhn_poker":' in site
