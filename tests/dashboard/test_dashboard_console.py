"""Every dashboard page in a real headless Chromium (Debian's, driven by playwright) logs no console error.

What a user notices (issue 46): the browser's console showed an error on every page, `/favicon.ico` answering
404. The pages here need no deployment (tests/e2e/test_dashboard_browser.py visits those, with the same check
in its `page` fixture): the overview, the catalog, and a local image's page, each loaded and left to run its
script and event stream for a moment (the image page: the offline base, tests/conftest.py base_image); the icon
is served offline from the package's static folder. The page of an image with a signed push (signed.py: real
signature and attestations in the loopback registry) shows its verified signature, SBOM and provenance, and the
page of one whose provenance was edited marks it failed, both without a console error.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from .running import Dashboard
from .signed import SLSA, Signed, edit_attestation, signed_push

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
def pushes(dash: Dashboard, registry: str) -> tuple[Signed, Signed]:
    """(a signed push, one whose provenance was edited after signing), recorded in the dashboard's state."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("NGCX_STATE_DIR", dash.env["NGCX_STATE_DIR"])
        good, bad = signed_push(registry, "console"), signed_push(registry, "console-edited")
    edit_attestation(bad, SLSA)
    return good, bad


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not Path(CHROMIUM).is_file():
        pytest.skip(f"no chromium at {CHROMIUM} (scripts/setup.sh installs Debian's)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--no-proxy-server"])
        yield chromium
        chromium.close()


def test_no_page_logs_a_console_error(browser: Any, dash: Dashboard, base_image: str,
                                      pushes: tuple[Signed, Signed]) -> None:
    good, bad = pushes
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
        tab.goto(dash.base + f"/images/{quote(good.tag, safe='/:')}")
        tab.wait_for_timeout(SETTLE_MS)
        assert tab.locator('[data-verdict="valid"]').count() == 1, tab.content()[-3000:]
        tab.locator("details summary").first.click()          # the components table opens
        assert tab.get_by_text("pkg:pypi/numpy@2.1.3").is_visible()
        sbom = context.request.get(dash.base + tab.locator("a.download").get_attribute("href"))
        assert sbom.status == 200 and sbom.json()["bomFormat"] == "CycloneDX"
        tab.goto(dash.base + f"/images/{quote(bad.tag, safe='/:')}")
        tab.wait_for_timeout(SETTLE_MS)
        assert tab.locator('[data-verdict="failed"]').count() == 1 and tab.locator("#verify-mark").is_visible()
        assert not errors, errors
        icon = context.request.get(dash.base + "/favicon.ico")       # where a browser looks without the link
        assert icon.status == 200 and icon.headers["content-type"].startswith("image/svg+xml")
    finally:
        context.close()
