"""sbom: `ngcx sbom` on the catalog images built here (issue 48: "SBOM time for the pytorch image").

Per image (cuda:24.05 and pytorch:24.11, each only when already built: the suite builds nothing), interleaved:
- `ngcx sbom REF -o FILE`: one container listing dpkg's database, every Python distribution and the CUDA
  libraries ngcx-runtime's probe sees load (their files hashed), then CycloneDX 1.6 validated against its schema;
- `ngcx sbom REF --format spdx -o FILE`: the same collection, written as SPDX 2.3;
- the naive floor: `docker run IMAGE dpkg-query -W` then `docker run IMAGE pip list --format json`, what a user
  types to list the same packages with no CUDA probe, no digests and no document.
The ratio ngcx / naive says what the probe, the hashes and the validated document cost over the bare listing.
Runnable alone too: `.venv/bin/python -m bench.suites.sbom` prints one line per image (build_sbom's own timings).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from ..core import Measurement, SuiteResult, SuiteSkipped, Timed, ratio, time_interleaved

IMAGES = ("cuda:24.05", "pytorch:24.11")


def _built() -> list[tuple[str, str]]:
    """(catalog ref, local tag) of each image of IMAGES built on this machine."""
    from ngcx.core import naming
    from ngcx.core.engine import engine_client, image_or_none

    client = engine_client()
    out = []
    for ref in IMAGES:
        image, tag = ref.split(":")
        local = naming.local_tag(image, tag, "runtime")
        if image_or_none(client, local) is not None:
            out.append((ref, local))
    return out


def run(result: SuiteResult, work: Path, out: Path) -> None:
    docker = shutil.which("docker")
    images = _built() if docker else []
    if not images:
        raise SuiteSkipped(f"none of {', '.join(IMAGES)} is built here (ngcx build REF --base offline)")
    ngcx = [sys.executable, "-m", "ngcx", "sbom"]
    measurements: list[Measurement] = []
    for ref, local in images:
        commands = [
            Timed(f"ngcx sbom {ref}", "ngcx", [*ngcx, ref, "-o", str(work / "sbom.cdx.json")]),
            Timed(f"ngcx sbom {ref} --format spdx", "ngcx", [*ngcx, ref, "--format", "spdx", "-o",
                                                              str(work / "sbom.spdx.json")]),
            Timed(f"naive: dpkg-query -W + pip list ({ref})", "naive",
                  ["sh", "-c", f"{docker} run --rm --network none --entrypoint dpkg-query {local} -W >/dev/null && "
                               f"{docker} run --rm --network none --entrypoint pip {local} list --format json "
                               ">/dev/null"],
                  shown=f"docker run --rm --entrypoint dpkg-query {local} -W; docker run --rm --entrypoint pip "
                        f"{local} list --format json"),
        ]
        timed = time_interleaved(commands, result.repeat)
        measurements += timed
        result.ratios.append(ratio(f"ngcx sbom / naive listing ({ref})", timed[0], timed[2]))
    result.measurements = measurements
    result.notes.append("Each `ngcx sbom` runs one container of the image; pytorch's time is mostly the probe "
                        "importing torch and loading the CUDA libraries, as `ngcx test` does.")


def main() -> None:
    from ngcx.trust.sbom import build_sbom

    for ref, _local in _built():
        r = build_sbom(ref)
        print(f"{ref}: {r.components} components, collect {r.collect_s:.2f} s, total {r.total_s:.2f} s")


if __name__ == "__main__":
    main()
