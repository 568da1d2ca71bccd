"""Helpers for the SBOM tests: the catalog images they read, what the image's own tools report, and CycloneDX 1.6
validation done apart from ngcx's (jsonschema over the schema files cyclonedx-python-lib ships, every format
check jsonschema has included).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from support import run_ngcx


def built(ref: str, timeout: float = 3600) -> str:
    """`ngcx build REF --base offline`, as tests/build and tests/workstation run it: the same command and so the
    same BuildKit cache (a cache hit when one of those ran first, and theirs when this ran first), never a second
    image. Returns the local tag."""
    proc = run_ngcx("build", ref, "--base", "offline", "--progress", "plain", timeout=timeout)
    assert proc.returncode == 0, f"ngcx build {ref}:\n{(proc.stdout + proc.stderr)[-3000:]}"
    tag = next(line.split()[1] for line in proc.stdout.splitlines() if line.startswith("built "))
    return tag


def in_image(client, tag: str, argv: list[str]) -> str:
    """stdout of ARGV run in a throwaway container of `tag` (its own tools, no network)."""
    out = client.containers.run(tag, argv[1:], entrypoint=[argv[0]], remove=True, network_mode="none",
                                stdout=True, stderr=False)
    return out.decode()


def dpkg_rows(client, tag: str) -> set[tuple[str, str]]:
    """(package, version) of every line `dpkg-query -W` prints in the image (its ':arch' suffix dropped)."""
    rows = [line.split("\t") for line in in_image(client, tag, ["dpkg-query", "-W"]).splitlines() if line]
    return {(r[0].split(":")[0], r[1]) for r in rows}


def pip_rows(client, tag: str) -> set[tuple[str, str]]:
    """(normalised name, version) of every distribution `pip list --format json` reports in the image."""
    import re

    rows = json.loads(in_image(client, tag, ["pip", "list", "--format", "json"]).strip().splitlines()[-1])
    return {(re.sub(r"[-_.]+", "-", r["name"]).lower(), r["version"]) for r in rows}


def cyclonedx_errors(doc: dict[str, Any]) -> list[str]:
    """Every violation of the CycloneDX 1.6 JSON schema in `doc`, by jsonschema itself (Draft 7, formats checked)."""
    import cyclonedx.schema._res as res
    from jsonschema import Draft7Validator
    from referencing import Registry, Resource

    folder = Path(res.__file__).parent
    schema = json.loads((folder / "bom-1.6.SNAPSHOT.schema.json").read_text())
    base = schema["$id"].rsplit("/", 1)[0]
    registry = Registry().with_resources(
        (f"{base}/{f.name}", Resource.from_contents(json.loads(f.read_text()))) for f in folder.glob("*.schema.json"))
    validator = Draft7Validator(schema, registry=registry, format_checker=Draft7Validator.FORMAT_CHECKER)
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)]
