"""Debian's headless Chromium driven by selenium, for the browser tests (`make browser`
installs it)."""

from pathlib import Path

from selenium import webdriver
from selenium.webdriver.chrome.service import Service

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


def start_chromium(*arguments: str, prefs: dict | None = None) -> webdriver.Chrome:
    """A headless Chromium, quiet (no background traffic, no first-run pages), with
    `arguments` and profile `prefs` added; the caller quits it."""
    missing = [path for path in (CHROMIUM, CHROMEDRIVER) if not Path(path).exists()]
    assert not missing, f"{missing} not installed: `make browser` installs Debian's chromium"
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--no-first-run",
        "--disable-dev-shm-usage",
        *arguments,
    ):
        options.add_argument(argument)
    if prefs:
        options.add_experimental_option("prefs", prefs)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    return driver
