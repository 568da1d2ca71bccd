"""Every dashboard page in a real headless Chromium (Debian's, driven by playwright) logs no console error.

What a user notices (issue 46): the browser's console showed an error on every page, `/favicon.ico` answering
404. The pages here need no deployment (tests/e2e/test_dashboard_browser.py visits those, with the same check
in its `page` fixture): the overview, the catalog, and a local image's page, each loaded and left to run its
script and event stream for a moment (the image page: the offline base, tests/conftest.py base_image); the icon
is served offline from the package's static folder.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from .running import Dashboard

pytestmark = pytest.mark.docker      # the image page asks the engine about the offline base
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
SETTLE_MS = 1500          # the page's script opens its event stream and fetches what it shows


@pytest.fixture(scope="module")
def dash(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dashboard]:
    state = tmp_path_factory.mktemp("console")
    env = {"NGCX_STATE_DIR": str(state / "state"), "AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": "",
           "ALIBABA_CLOUD_ACCESS_KEY_ID": "", "ALIBABA_CLOUD_ACCESS_KEY_SECRET": ""}
    with Dashboard(env) as running:
        yield running


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not Path(CHROMIUM).is_file():
        pytest.skip(f"no chromium at {CHROMIUM} (scripts/setup.sh installs Debian's)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--no-proxy-server"])
        yield chromium
        chromium.close()


def test_no_page_logs_a_console_error(browser: Any, dash: Dashboard, base_image: str) -> None:
    context = browser.new_context()
    tab = context.new_page()
    errors: list[str] = []
    tab.on("console", lambda msg: errors.append(f"{tab.url}: {msg.text}") if msg.type == "error" else None)
    tab.on("pageerror", lambda exc: errors.append(f"{tab.url}: {exc}"))
    try:
        tab.goto(dash.url)                                  # the printed URL: the token becomes a cookie
        tab.wait_for_timeout(SETTLE_MS)
        for path in ("/catalog", f"/images/{quote(base_image, safe='/:')}"):
            response = tab.goto(dash.base + path)
            assert response is not None and response.status == 200, path
            tab.wait_for_timeout(SETTLE_MS)
        assert not errors, errors
        icon = context.request.get(dash.base + "/favicon.ico")       # where a browser looks without the link
        assert icon.status == 200 and icon.headers["content-type"].startswith("image/svg+xml")
    finally:
        context.close()
