"""Headless Chromium through Selenium, for the page's test and ``mage bench view``.

Debian's ``chromium`` and ``chromium-driver`` packages (``scripts/setup.sh dev`` installs
them as root) and the ``selenium`` package (the ``dev`` extra) are needed; without them
:func:`chromium` says what to install. Chromium is started with its background network
traffic off, since a machine without internet refuses those connections.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

FLAGS = (
    "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--window-size=1400,1800",
)  # fmt: skip


def chromium_missing() -> str:
    """What is missing to drive Chromium, in words; '' when nothing is."""
    missing = [name for name in ("chromium", "chromedriver") if not shutil.which(name)]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("the selenium package (pip install selenium, or the dev extra)")
    if not missing:
        return ""
    return (f"{', '.join(missing)} not found: apt-get install chromium chromium-driver "
            "(scripts/setup.sh dev does it as root) and pip install selenium")  # fmt: skip


@contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium WebDriver, quit on leaving.

    Raises:
        RuntimeError: Chromium, its driver or selenium is missing (the message says what
            to install).
    """
    problem = chromium_missing()
    if problem:
        raise RuntimeError(problem)
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = str(shutil.which("chromium"))
    for flag in FLAGS:
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(str(shutil.which("chromedriver"))), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def wait_for(driver: Any, script: str, timeout: float = 10.0) -> Any:
    """Poll ``script`` (JavaScript returning a value) until it is truthy; returns it.

    Raises:
        TimeoutError: Not within ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = driver.execute_script(script)
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"the page did not satisfy {script!r} within {timeout} s")
        time.sleep(0.01)
