"""Headless Chromium for the browser tests (the static board's and ``ale view``'s pages), through
Selenium and the system's chromedriver.

:func:`need_browser` skips with the reason when Chromium, chromedriver or Selenium is missing, or
fails in CI (``ALE_SITE_TOOLS_REQUIRED=1``, set by ``.ci/run``, which installs them);
:func:`driver` starts one with its own profile folder, :func:`quit_driver` stops it and removes it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
import site_fixtures as sf

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = os.environ.get("ALE_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("ALE_CHROMEDRIVER", "/usr/bin/chromedriver")
ARTIFACTS = Path(os.environ.get("ALE_TEST_ARTIFACTS", ROOT / "test-artifacts"))
CHROME_FLAGS = (
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-default-apps", "--disable-extensions", "--hide-scrollbars", "--force-device-scale-factor=1",
)  # fmt: skip


def missing() -> str | None:
    """What the browser tests lack on this machine, or None."""
    try:
        import selenium  # noqa: F401
    except ModuleNotFoundError:
        return "selenium is not installed (pip install selenium)"
    for path, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            return f"{path} is missing (apt-get install {package})"
    return None


def need_browser() -> None:
    """Skip saying what is missing; in CI, fail instead."""
    reason = missing()
    if reason is not None:
        if sf.tools_required():
            pytest.fail(f"browser tests are required (ALE_SITE_TOOLS_REQUIRED=1): {reason}")
        pytest.skip(reason)


def driver(*, javascript: bool = True, performance_log: bool = False, page_load_timeout: float = 30) -> Any:
    """A headless Chromium at 1366x900 with the browser console logged (and the performance log)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in CHROME_FLAGS:
        options.add_argument(flag)
    profile = tempfile.mkdtemp(prefix="ale-chromium-")
    options.add_argument(f"--user-data-dir={profile}")
    options.add_argument("--window-size=1366,900")
    logs = {"browser": "ALL", **({"performance": "ALL"} if performance_log else {})}
    options.set_capability("goog:loggingPrefs", logs)
    if not javascript:
        options.add_experimental_option("prefs", {"profile.managed_default_content_settings.javascript": 2})
    chrome = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    chrome.set_page_load_timeout(page_load_timeout)
    chrome._ale_profile = profile  # removed by quit_driver
    return chrome


def quit_driver(chrome: Any) -> None:
    chrome.quit()
    shutil.rmtree(chrome._ale_profile, ignore_errors=True)
