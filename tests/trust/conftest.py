"""Fixtures of the trust tests: the catalog images the SBOM tests read (helpers: sbom_checks.py).

No image is built here that the suite does not build anyway: cuda:24.05 is tests/build's image and pytorch:24.11
is in tests/workstation's CI matrix (marked slow there and in test_sbom_image.py); `sbom_checks.built` runs the
same `ngcx build --base offline`, so whichever runs first builds and the other is a cache hit.
"""

from __future__ import annotations

import pytest
from sbom_checks import built


@pytest.fixture(scope="session")
def cuda_image(docker_client, base_image) -> str:
    return built("cuda:24.05")


@pytest.fixture(scope="session")
def pytorch_image(docker_client, base_image) -> str:
    return built("pytorch:24.11")
