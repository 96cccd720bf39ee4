"""A real headless Chromium for the inspector's tests (issue 13 item 2).

``chromium_or_skip()`` finds Debian's ``chromium`` and ``chromium-driver`` (the tests call
it once per session, from a fixture); when they are missing and this process is root
with apt-get, it installs them (saying so); otherwise the test skips with a printed
reason. ``open_browser`` starts one driven by selenium (one per test module: a start
costs about a second). ``artifacts_dir`` is where the
tests keep their screenshots (printed; never committed).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
BINARIES = ("chromium", "chromium-browser", "google-chrome")


def _find() -> tuple[str, str] | None:
    binary = next((found for name in BINARIES if (found := shutil.which(name))), None)
    driver = shutil.which("chromedriver") or (
        "/usr/lib/chromium/chromedriver"
        if Path("/usr/lib/chromium/chromedriver").exists()
        else None
    )
    return (binary, driver) if binary and driver else None


def chromium_or_skip() -> tuple[str, str]:
    """(browser, driver) paths; installs them as root with apt-get, else skips saying why."""
    found = _find()
    if found is not None:
        return found
    if hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("apt-get"):
        print(
            "\ninstalling chromium and chromium-driver: apt-get install -y chromium chromium-driver"
        )
        try:
            done = subprocess.run(
                # Wait for dpkg's lock, do not fail on it: on a fresh machine the other
                # xdist worker is installing the same packages (every browser test of that
                # worker skipped with "Unable to acquire the dpkg frontend lock").
                ["apt-get", "-o", "DPkg::Lock::Timeout=540", "install", "-y",
                 "chromium", "chromium-driver"],
                check=False, capture_output=True, text=True, timeout=600,
                env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
            )  # fmt: skip
            said = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        except subprocess.TimeoutExpired:
            said = "timed out after 600 s"
        found = _find()
        if found is not None:
            return found
        why = f"; apt-get install said: {said}"
    else:
        why = ""
    reason = (
        "Chromium and chromedriver are not installed (apt-get install chromium chromium-driver)"
        + why
    )
    print(f"\nSKIP: {reason}")
    pytest.skip(reason)


def open_browser(paths: tuple[str, str], width: int = 1280, height: int = 900) -> Any:
    """A headless Chromium (``paths``: browser, driver) under selenium; skips (printing
    why) when it cannot start."""
    from selenium import webdriver
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.chrome.service import Service

    binary, driver_path = paths
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in (
        "--headless=new",
        "--no-sandbox",  # root in a container has no user namespace to sandbox with
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--no-first-run",
        "--disable-extensions",
        "--disable-background-networking",
        "--lang=en-US",
        f"--window-size={width},{height}",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    try:
        return webdriver.Chrome(options=options, service=Service(executable_path=driver_path))
    except WebDriverException as exc:
        reason = f"Chromium cannot start here: {exc.msg or exc}".splitlines()[0]
        print(f"\nSKIP: {reason}")
        pytest.skip(reason)


def artifacts_dir() -> Path:
    """``$TREADLE_TEST_ARTIFACTS`` or ``tmp/artifacts/inspector`` under the repository."""
    path = (
        Path(os.environ.get("TREADLE_TEST_ARTIFACTS") or ROOT / "tmp" / "artifacts") / "inspector"
    )
    path.mkdir(parents=True, exist_ok=True)
    return path


def wait_for(driver: Any, condition: Callable[[Any], Any], what: str, timeout: float = 15.0) -> Any:
    """Waits for ``condition(driver)`` to be truthy; on timeout fails naming ``what``
    and showing the browser's console (the page's own errors)."""
    from selenium.common.exceptions import (
        NoAlertPresentException,
        NoSuchElementException,
        StaleElementReferenceException,
        TimeoutException,
    )
    from selenium.webdriver.support.ui import WebDriverWait

    # The page re-renders what changed: an element found a moment ago may be replaced.
    ignored = (StaleElementReferenceException, NoSuchElementException, NoAlertPresentException)
    try:
        return WebDriverWait(driver, timeout, 0.05, ignored).until(condition)
    except TimeoutException:
        console = "\n".join(str(entry.get("message")) for entry in driver.get_log("browser"))
        pytest.fail(f"timed out after {timeout} s waiting for {what}\nconsole:\n{console}")
