"""Headless Chromium for the web pages' tests: Debian's chromium and chromedriver, driven by Selenium.

A browser cannot be downloaded here, so the tests use the distribution's (`.ci/run` installs them). Without
them a test is skipped on a workstation and fails in CI.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
# As the machine's own probe starts it: no first-run, sync or background traffic to a network it cannot reach.
FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-quic",
         "--window-size=1280,900")


@contextlib.contextmanager
def chromium(folder: Path) -> Iterator:
    """A Chrome webdriver with its profile in `folder` and its downloads in `folder`/downloads (`.downloads`)."""
    if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
        if os.environ.get("CI"):
            pytest.fail("Debian's chromium and chromium-driver are not installed; .ci/run installs them")
        pytest.skip("needs Debian's chromium and chromium-driver (apt-get install chromium chromium-driver)")
    os.environ.setdefault("SE_OFFLINE", "true")  # Selenium Manager must not look for a driver online
    from selenium import webdriver

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (*FLAGS, f"--user-data-dir={folder / 'profile'}"):
        options.add_argument(flag)
    options.add_experimental_option("prefs", {"download.default_directory": str(folder / "downloads"),
                                              "download.prompt_for_download": False})
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=str(CHROMEDRIVER)))
    driver.downloads = folder / "downloads"
    try:
        yield driver
    finally:
        driver.quit()


def wait_for(condition, timeout_s: float = 60, what: str = "the page"):
    """`condition()`'s first truthy value, polled every 20 ms."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if found := condition():
            return found
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")
