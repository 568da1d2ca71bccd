"""The SBOM of a catalog image lists what the image's own tools report, and validates (issue 48, item 2).

For cuda:24.05 (tests/build's image) and pytorch:24.11 (tests/workstation's CI matrix, slow): every package
`dpkg-query -W` and `pip list` print inside the image is in the CycloneDX SBOM and nothing else is; the
CUDA libraries are the files `ngcx-runtime info --json` (the probe `ngcx test` reads) saw load; the image and
its base are named by digest; the document validates against the CycloneDX 1.6 schema by jsonschema itself,
and the SPDX 2.3 form parses and validates with spdx-tools. Each SBOM's time is printed (`-s` shows it).
"""

from __future__ import annotations

import json
import re
import time

import pytest
from sbom_checks import cyclonedx_errors, dpkg_rows, in_image, pip_rows

from support import missing, run_ngcx

pytestmark = pytest.mark.docker


def _sbom(tag: str, *args: str) -> dict:
    started = time.monotonic()
    proc = run_ngcx("sbom", tag, *args)
    assert proc.returncode == 0, proc.stderr
    print(f"sbom {tag} {' '.join(args) or '--format cyclonedx'}: {time.monotonic() - started:.2f} s "
          f"({proc.stderr.strip()})")
    return json.loads(proc.stdout)


def _purls(doc: dict, kind: str) -> list[dict]:
    return [c for c in doc["components"] if c.get("purl", "").startswith(f"pkg:{kind}/")]


def _lists_what_the_image_reports(client, tag: str) -> dict:
    doc = _sbom(tag)
    assert doc["specVersion"] == "1.6" and cyclonedx_errors(doc) == []
    debs = _purls(doc, "deb")
    assert {(c["name"], c["version"]) for c in debs} == dpkg_rows(client, tag)
    assert all(re.match(r"pkg:deb/debian/[^@]+@[^?]+\?arch=(amd64|all|arm64)&distro=bookworm$", c["purl"])
               for c in debs), debs[:3]
    dists = _purls(doc, "pypi")
    assert {(c["purl"].split("/")[1].split("@")[0], c["version"]) for c in dists} == pip_rows(client, tag)
    return doc


def _wheel_hashes_as_locked(doc: dict) -> None:
    """A pinned wheel the catalog's lock lists one file for carries that file's sha256; one with several files
    (x86_64, aarch64) names them all as the set it is one of; the CUDA wheels are all in the lock."""
    from pathlib import Path

    import yaml

    lock = yaml.safe_load((Path(__file__).parents[2] / "registry.lock.yaml").read_text())["hashes"]
    dists = _purls(doc, "pypi")
    for c in dists:
        accepted = lock.get(f"{c['purl'].split('/')[1].split('@')[0]}=={c['version']}", [])
        props = {p["name"]: p["value"] for p in c["properties"]}
        if len(accepted) == 1:
            assert c["hashes"] == [{"alg": "SHA-256", "content": accepted[0]}], c
        elif accepted:
            assert "hashes" not in c and props["ngcx:wheel-sha256-one-of"].split() == accepted, c
    assert all(c.get("hashes") or "ngcx:wheel-sha256-one-of" in {p["name"] for p in c["properties"]}
               for c in dists if c["name"].startswith("nvidia-")), "every CUDA wheel is hashed by the lock"


def _cuda_as_probed(client, tag: str, doc: dict) -> None:
    """Each library the probe reports loaded is a pkg:generic component with the same file, version and bytes
    (sha256sum in the image)."""
    probe = json.loads(in_image(client, tag, ["ngcx-runtime", "info", "--json"]))
    seen = {(p["value"], c["version"]) for c in _purls(doc, "generic") for p in c["properties"]
            if p["name"] == "ngcx:cuda.path"}
    loaded = {(lib["path"], lib["version"]) for lib in probe["libraries"].values() if "version" in lib}
    assert loaded and loaded <= seen, (loaded, seen)
    paths = {path for path, _v in seen}
    sums = dict(reversed(line.split(None, 1)) for line in in_image(client, tag, ["sha256sum", *sorted(paths)])
                .splitlines())
    assert {p["value"]: c["hashes"][0]["content"] for c in _purls(doc, "generic") for p in c["properties"]
            if p["name"] == "ngcx:cuda.path"} == sums
    labels = client.images.get(tag).labels
    for c in _purls(doc, "generic"):
        props = {p["name"]: p["value"] for p in c["properties"]}
        component = c["purl"].split("/")[2].split("@")[0]
        assert props.get("ngcx:cuda.pin") == labels.get(f"ai.ngcx.pin.{component}")


def _digests(client, tag: str, doc: dict, base_tag: str) -> None:
    image = doc["metadata"]["component"]
    assert image["type"] == "container" and image["version"] == client.images.get(tag).id
    assert image["hashes"] == [{"alg": "SHA-256", "content": image["version"].split(":")[1]}]
    base = [c for c in doc["components"] if c.get("bom-ref", "").startswith("base:")]
    assert [b["version"] for b in base] == [client.images.get(base_tag).id]
    assert {"name": "ngcx:base.verified", "value": "true"} in base[0]["properties"]


def _spdx_validates(tag: str, cdx: dict) -> None:
    try:
        from spdx_tools.spdx.parser.parse_anything import parse_file
        from spdx_tools.spdx.validation.document_validator import validate_full_spdx_document
    except ImportError:
        missing("spdx-tools is not installed (the test extra): SPDX output cannot be checked")
    import tempfile

    doc = _sbom(tag, "--format", "spdx")
    with tempfile.NamedTemporaryFile("w", suffix=".spdx.json") as f:
        json.dump(doc, f)
        f.flush()
        parsed = parse_file(f.name)
    assert [m.validation_message for m in validate_full_spdx_document(parsed)] == []
    purls = {r.locator for p in parsed.packages for r in p.external_references if r.reference_type == "purl"}
    assert {c["purl"] for c in cdx["components"] if "purl" in c} <= purls


def test_cuda_image_sbom_lists_every_package_and_validates(docker_client, cuda_image):
    doc = _lists_what_the_image_reports(docker_client, cuda_image)
    _wheel_hashes_as_locked(doc)
    _cuda_as_probed(docker_client, cuda_image, doc)
    _digests(docker_client, cuda_image, doc, "ngcx/base:bookworm")
    names = {c["name"] for c in _purls(doc, "pypi")}
    assert {"nvidia-cudnn-cu12", "nvidia-nccl-cu12", "ngcx-runtime"} <= names
    _spdx_validates(cuda_image, doc)


@pytest.mark.slow
def test_pytorch_image_sbom_lists_every_package_and_validates(docker_client, pytorch_image):
    doc = _lists_what_the_image_reports(docker_client, pytorch_image)
    _wheel_hashes_as_locked(doc)
    _cuda_as_probed(docker_client, pytorch_image, doc)
    _digests(docker_client, pytorch_image, doc, "ngcx/base:bookworm")
    assert "torch" in {c["name"] for c in _purls(doc, "pypi")}
    _spdx_validates(pytorch_image, doc)
