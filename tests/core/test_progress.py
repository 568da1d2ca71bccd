"""The build progress parser (cli/core/progress.py) over BuildKit's plain output as Docker 20.10 prints it."""

from __future__ import annotations

from ngcx.core.progress import ProgressParser

# A 13-step Dockerfile from an ARG base (`FROM ${BASE_IMAGE}`): BuildKit names the stage and pads each step
# number to the width of the total ("[stage-0  4/13]"), as `ngcx build cuda:24.05` shows it on this engine.
PADDED_LOG = """\
#5 [stage-0  1/13] FROM ngcx/base:bookworm
#5 CACHED
#8 [stage-0  4/13] RUN --mount=type=cache,id=ngcx-wheels,target=/root/.cache/ngcx-wheels ...
#8 0.412 ERROR: No matching distribution found for nvidia-cublas-cu12==12.4.5.8
#8 ERROR: executor failed running [/bin/bash -o pipefail -c ...]: exit code: 1
#14 [stage-0 12/13] COPY tests/ /opt/ngcx/tests/
#14 CACHED
"""
TITLES = {1: "base OS (FROM)", 4: "CUDA 12.4 libraries as pinned wheels (RUN)", 12: "app layer (last) (COPY)"}


def test_a_padded_step_number_gets_its_recipe_title_and_counts_as_a_step():
    """Every step of a 13-step build is named by its recipe block, the single-digit ones too: the failed step
    names "CUDA 12.4 libraries" (not a wall of --mount options) and the cached count includes the base."""
    parser = ProgressParser(TITLES)
    for line in PADDED_LOG.splitlines():
        parser.feed(line)
    steps = parser.build_steps()
    assert [s.title for s in steps] == ["[1/13] base OS (FROM)", "[4/13] CUDA 12.4 libraries as pinned wheels (RUN)",
                                        "[12/13] app layer (last) (COPY)"]
    assert [s.status for s in steps] == ["cached", "error", "cached"]
    failed = parser.failed()
    assert failed is not None and failed.title == "[4/13] CUDA 12.4 libraries as pinned wheels (RUN)"
