"""Headless Chromium (Debian's, at /usr/bin/chromium) driven by Playwright, for the console's tests.

Playwright never downloads a browser here: it launches the system Chromium by path, with the
background services off (on a closed network their connection attempts are refused and fail
launches). Without that binary the browser tests are skipped; `make tools` installs it as root.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from playwright.sync_api import Browser, ConsoleMessage, Error, Page, sync_playwright

CHROMIUM = Path("/usr/bin/chromium")
LAUNCH_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
VIEWPORT = {"width": 1280, "height": 800}
ROOT = Path(__file__).resolve().parent.parent.parent
ARTIFACTS = ROOT / "tests" / "artifacts"
DOCS = ROOT / "docs"

MISSING = f"needs Debian's Chromium at {CHROMIUM} (`apt-get install chromium`, or `make tools`)"
# In CI the browser tests must run: a missing Chromium fails them there instead of skipping them.
REQUIRED = bool(os.environ.get("CI"))
needs_chromium = pytest.mark.skipif(not CHROMIUM.exists() and not REQUIRED, reason=MISSING)


@dataclass
class Console:
    """A page of the console with what it reported: console errors and uncaught exceptions."""

    page: Page
    errors: list[str] = field(default_factory=list)

    def unexpected_errors(self, *allowed: str) -> list[str]:
        """The errors, but for failed loads of resources whose URL contains one of `allowed`
        (Chromium logs every 4xx a fetch gets, such as a stream without a snapshot)."""
        return [e for e in self.errors if not any(a in e for a in allowed)]


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """One Chromium for the module (each test gets its own context: storage and cookies apart)."""
    if not CHROMIUM.exists():
        (pytest.fail if REQUIRED else pytest.skip)(MISSING)
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=LAUNCH_ARGS, timeout=30_000)
        yield chromium
        chromium.close()


@pytest.fixture()
def console(browser: Browser) -> Iterator[Console]:
    context = browser.new_context(viewport=VIEWPORT)  # type: ignore[arg-type]
    context.set_default_timeout(10_000)
    page = context.new_page()
    seen = Console(page)

    def on_console(message: ConsoleMessage) -> None:
        if message.type == "error":
            seen.errors.append(f"{message.text} at {message.location.get('url', '')}")

    def on_page_error(error: Error) -> None:
        seen.errors.append(f"uncaught: {error.message}")

    page.on("console", on_console)
    page.on("pageerror", on_page_error)
    yield seen
    context.close()


def save_screenshot(page: Page, name: str) -> Path:
    """Into tests/artifacts/ always, and into docs/ with RILL_UPDATE_DOCS_SCREENSHOTS=1."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / name
    page.screenshot(path=str(path))
    if os.environ.get("RILL_UPDATE_DOCS_SCREENSHOTS") == "1":
        (DOCS / name).write_bytes(path.read_bytes())
    return path
