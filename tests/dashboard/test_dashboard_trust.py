"""The image page's signature, SBOM and provenance, checked against the real loopback registry (issue 48, item 6).

A real `ngcx dashboard` process, real signed pushes (signed.py: ngcx's own signing code, the test state's key),
tampering done through the registry's API. What a user sees: a valid push says so with the key's fingerprint and
shows the SBOM's counts and components and the provenance; an edited attestation marks the image as failing
verification, with no SBOM offered; a registry that refuses is "unreachable", one that hangs never holds the page
up; the SBOM download is the attested CycloneDX document, behind the token like every route.
"""

from __future__ import annotations

import html
import json
import re
import socket
import time
from collections.abc import Iterator
from urllib.parse import quote

import pytest

from .running import Dashboard, until
from .signed import BOM, SLSA, edit_attestation, recorded_push, signed_push

pytestmark = pytest.mark.docker      # the loopback registry


@pytest.fixture
def hung_registry() -> Iterator[str]:
    """A port that accepts connections and never answers (a registry behind a dead proxy)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    yield f"127.0.0.1:{sock.getsockname()[1]}"
    sock.close()


def _closed_port() -> int:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return port


def _page(dash: Dashboard, tag: str) -> str:
    status, _headers, body = dash.call("/images/" + quote(tag, safe="/:"))
    assert status == 200, body[:500]
    return html.unescape(body.decode())


def _verdict_of(page: str, push_id: int) -> str:
    marker = f'data-push="{push_id}" data-verdict="'
    assert marker in page, page[-3000:]
    return page.split(marker, 1)[1].split('"', 1)[0]


def _fingerprint(state) -> str:
    from ngcx.trust.keys import fingerprint

    return fingerprint((state / "signing" / "cosign.pub").read_bytes())


def test_a_signed_push_shows_key_sbom_and_provenance_and_an_edited_one_is_marked(registry, isolated_state):
    good = signed_push(registry, "good")
    bad = signed_push(registry, "bad")
    edit_attestation(bad, SLSA)
    with Dashboard({}) as dash:
        page = _page(dash, good.tag)
        assert _verdict_of(page, good.push_id) == "valid"
        assert "signature valid" in page and _fingerprint(isolated_state["state"])[:23] in page
        assert "fails verification" not in page
        assert "4 components · 2 Debian packages · 1 Python distributions · 1 CUDA libraries" in page
        for component in BOM["components"]:
            assert component["purl"] in page
        assert "https://ngcx.dev/builder/ngcx" in page and "https://ngcx.dev/buildtypes/image/v1" in page
        assert re.search(r"<th>started</th><td>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ</td>", page), "no build start"
        assert f"/api/pushes/{good.push_id}/sbom.cdx.json" in page

        page = _page(dash, bad.tag)
        assert _verdict_of(page, bad.push_id) == "failed"
        assert "fails verification" in page and "attestation edited" in page
        assert "sbom.cdx.json" not in page and "https://ngcx.dev/builder/ngcx" not in page


def test_the_sbom_download_is_the_attested_document_behind_the_token(registry, isolated_state):
    good = signed_push(registry, "download")
    bad = signed_push(registry, "edited")
    edit_attestation(bad, SLSA)
    with Dashboard({}) as dash:
        path = f"/api/pushes/{good.push_id}/sbom.cdx.json"
        status, _h, body = dash.call(path, auth=False)
        assert status == 401 and b"token" in body
        status, headers, body = dash.call(path)
        assert status == 200, body[:300]
        assert headers["content-type"].startswith("application/vnd.cyclonedx+json")
        assert "attachment" in headers["content-disposition"]
        assert json.loads(body) == BOM
        status, _h, body = dash.call(f"/api/pushes/{bad.push_id}/sbom.cdx.json")
        assert status == 409 and b"attestation edited" in body
        status, _h, body = dash.call("/api/pushes/999999/sbom.cdx.json")
        assert status == 404 and b"no push 999999" in body


def test_a_refusing_registry_is_unreachable_and_a_hanging_one_never_holds_the_page(registry, isolated_state,
                                                                                  hung_registry):
    refused = recorded_push("ngcx-dash-trust/refused:v1", f"127.0.0.1:{_closed_port()}/team/x:v1")
    hung = recorded_push("ngcx-dash-trust/hung:v1", f"{hung_registry}/team/y:v1")
    signed_push(registry, "key")        # makes the state's key: a page verifies with it
    with Dashboard({}) as dash:
        page = _page(dash, refused.tag)
        assert _verdict_of(page, refused.push_id) == "unreachable" and "not reachable" in page

        started = time.monotonic()
        page = _page(dash, hung.tag)
        assert time.monotonic() - started < 6.0, "the page waited for a registry that does not answer"
        assert _verdict_of(page, hung.push_id) == "checking"
        status, _h, _b = dash.call("/", timeout=5)       # the rest of the dashboard keeps answering
        assert status == 200
        until(lambda: _verdict_of(_page(dash, hung.tag), hung.push_id) in ("unreachable", "error"), 60,
              every=2, what="the hung registry's check turning unreachable")


def test_a_check_is_reused_while_fresh_and_redone_after_so_a_later_edit_is_marked(registry, isolated_state,
                                                                                monkeypatch):
    from ngcx.dashboard import trust

    signed = signed_push(registry, "later")
    checks = trust.TrustChecks()
    try:
        first = [{"remote_ref": signed.remote_ref, "digest": signed.digest}]
        checks.annotate(first)
        assert first[0]["trust"]["state"] == "valid"
        assert first[0]["trust"]["provenance"]["dependencies"] == []
        edit_attestation(signed, SLSA)

        cached = [dict(first[0])]
        checks.annotate(cached)                         # within FRESH_S: no registry call, the same verdict
        assert cached[0]["trust"]["state"] == "valid"

        monkeypatch.setattr(trust, "FRESH_S", 0.0)
        again = [dict(first[0])]
        checks.annotate(again)
        assert again[0]["trust"]["state"] == "failed" and "attestation edited" in again[0]["trust"]["line"]
        body, why = checks.sbom(signed.remote_ref, signed.digest)
        assert body is None and "attestation edited" in why
    finally:
        checks.close()


def test_components_are_counted_by_kind_from_purl_and_ngcx_package_type():
    from ngcx.dashboard.trust import sbom_summary

    bom = {"bomFormat": "CycloneDX", "specVersion": "1.6", "components": [
        *BOM["components"],
        {"type": "library", "name": "libcudnn.so.9", "version": "9.1.0", "purl": "pkg:generic/nvidia/cudnn@9.1.0"},
        {"type": "machine-learning-model", "name": "model.onnx"},
        {"type": "container", "name": "base", "purl": "pkg:oci/base@sha256%3Aab"}]}
    summary = sbom_summary(bom)
    assert summary["total"] == 7 and summary["format"] == "CycloneDX 1.6"
    assert {c["kind"]: c["count"] for c in summary["counts"]} == {"deb": 2, "pypi": 1, "cuda": 2, "model": 1,
                                                                  "other": 1}
