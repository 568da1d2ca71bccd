"""bench/suites/build.py and peers.py: the build suite's logic, without Docker.

Layers mapped from `docker history`, bytes shared between two images, the patch bump, the build-cache
records the suite may remove, hpccm's Dockerfile given the CA secret, and the notes that explain a loss.
"""

from __future__ import annotations

import bench_samples  # noqa: F401  (puts the repo root on sys.path: bench/ is not installed)
import pytest

from bench.core import Measurement, Stats
from bench.suites import build, peers

HISTORY = [("CMD [\"info\"]", 0), ("ENTRYPOINT [\"ngcx-runtime\"]", 0), ("EXPOSE map[8000/tcp:{}]", 0),
           ("WORKDIR /workspace", 0), ("LABEL org.opencontainers.image.title=ngcx/cuda", 0),
           ("ENV NVIDIA_VISIBLE_DEVICES=all", 0), ("ARG NGCX_REVISION=unknown", 0), ("ARG NGCX_CREATED=unknown", 0),
           ("COPY tests/ /opt/ngcx/tests/ # buildkit", 4164), ("RUN |2 APT_MIRROR= /bin/bash -c pip", 72175883),
           ("COPY ngcx-runtime/ /opt/ngcx/src/ngcx-runtime/ # buildkit", 283061),
           ("RUN |2 APT_MIRROR= /bin/bash -c pip install", 1827762632),
           ("RUN |2 /bin/bash -c python3 -m venv", 21624450),
           ("ENV VIRTUAL_ENV=/opt/ngcx/venv", 0), ("RUN |2 /bin/bash -c apt-get", 51867881),
           ("ARG DEBIAN_FRONTEND=noninteractive", 0), ("ARG APT_MIRROR=", 0), ("SHELL [/bin/bash -o pipefail -c]", 0),
           ("", 74821928)]


def _history() -> list[dict]:
    return [{"CreatedBy": c, "Size": s} for c, s in HISTORY]


def test_layer_sizes_map_history_onto_layers_including_an_empty_workdir_layer() -> None:
    sizes = build.layer_sizes(_history(), n_layers=8)
    assert sizes == [74821928, 51867881, 21624450, 1827762632, 283061, 72175883, 4164, 0]
    assert build.layer_sizes(_history(), n_layers=9) is None      # a history that does not map: no guess


def test_shared_bytes_count_only_the_common_bottom_run_of_layers() -> None:
    sizes = [100, 50, 1000, 7]
    assert build.shared_bytes(["a", "b", "c", "d"], sizes, ["a", "b", "x", "d"]) == 150   # "d" sits on "x"
    assert build.shared_bytes(["a", "b"], [100, 50], ["a", "b", "c"]) == 150
    assert build.shared_bytes(["a"], [100], ["z"]) == 0
    assert build.common_layers(["a", "b", "c"], ["a", "b", "x"]) == 2


def test_chain_ids_follow_the_oci_definition() -> None:
    import hashlib

    a, b = "sha256:" + "a" * 64, "sha256:" + "b" * 64
    assert build.chain_ids([a, b]) == [a, "sha256:" + hashlib.sha256(f"{a} {b}".encode()).hexdigest()]


def test_patch_bump_changes_the_pin_everywhere_and_differs_every_round() -> None:
    text = f"RUN pip install {build.PIN} x==1\nRUN printf '{build.PIN}' > constraints.txt\n"
    first, second = build.patch_bump(text, 0), build.patch_bump(text, 1)
    assert build.PIN not in first and first.count(build.PATCHED + " ") == 1 and first.count(build.PATCHED) == 2
    assert second.count(build.PATCHED + ".0") == 2 and second != first  # same requirement to pip, new cache key
    with pytest.raises(ValueError, match="nothing to bump"):
        build.patch_bump("FROM scratch\n", 0)


def test_first_difference_names_where_two_dockerfiles_part() -> None:
    a = "# cuda\nFROM base\nRUN apt-get install \\\n    python3\n"
    b = "# pytorch\nFROM base\nRUN apt-get install \\\n    gcc \\\n    python3\n"
    assert build.first_difference(a, b) == "gcc \\"
    assert build.first_difference(a, a) is None


def test_hpccm_dockerfile_gets_the_ca_secret_and_nothing_else() -> None:
    src = "FROM ngcx/base:bookworm\n\nRUN apt-get update -y && \\\n    apt-get install -y python3\n\nENV A=1\n"
    out = peers.adapt_for_build(src)
    assert out.splitlines() == ["FROM ngcx/base:bookworm", "ARG PIP_CERT=/run/secrets/ca", "",
                                "RUN --mount=type=secret,id=ca,required=false apt-get update -y && \\",
                                "    apt-get install -y python3", "", "ENV A=1"]


def test_only_this_runs_unused_cache_records_are_removed() -> None:
    """The bench removes the ~2 GB layers each cold build leaves in the build cache: only records it
    made (new, from its RUN commands or stacked on them), and never one an image or a build uses."""
    dockerfile = "FROM b\nRUN --mount=type=secret,id=ca \\\n    pip install   torch\nCOPY . /app\n"
    markers = build.run_markers(dockerfile)
    assert markers == {"pip install torch"}
    rec = [
        {"ID": "old", "Type": "regular", "Description": "mount / from exec /bin/sh -c pip install torch"},
        {"ID": "run", "Type": "regular", "Description": "mount / from exec /bin/sh -c pip install    torch"},
        {"ID": "copy", "Type": "regular", "Description": "fileop target", "Parent": "run"},
        {"ID": "tagged", "Type": "regular", "Description": "fileop target", "Parent": "copy", "Shared": True},
        {"ID": "building", "Type": "regular", "Description": "mount / from exec /bin/sh -c pip install torch",
         "InUse": True},
        {"ID": "pipcache", "Type": "exec.cachemount", "Description": "cached mount /root/.cache/pip from exec "
                                                                     "/bin/sh -c pip install torch"},
        {"ID": "other", "Type": "regular", "Description": "mount / from exec /bin/sh -c npm ci"},
    ]
    assert build.removable_records(rec, before={"old"}, markers=markers) == ["copy", "run"]


def test_a_cold_build_starts_without_the_wheel_pool_or_pips_cache() -> None:
    """--no-cache keeps cache mounts, so the bench empties the two that hold downloads before a cold
    build: ngcx's wheel pool and pip's cache; apt's lists, a record in use and layers stay."""
    rec = [
        {"ID": "pool", "Type": "exec.cachemount",
         "Description": "cached mount /root/.cache/ngcx-wheels from exec /bin/sh -c pip download x"},
        {"ID": "pip", "Type": "exec.cachemount", "Description": "cached mount /root/.cache/pip from exec pip"},
        {"ID": "busy", "Type": "exec.cachemount", "InUse": True,
         "Description": "cached mount /root/.cache/ngcx-wheels from exec /bin/sh -c pip download y"},
        {"ID": "apt", "Type": "exec.cachemount", "Description": "cached mount /var/lib/apt/lists from exec apt-get"},
        {"ID": "other", "Type": "exec.cachemount", "Description": "cached mount /root/.cache/pipx from exec pipx"},
        {"ID": "layer", "Type": "regular", "Description": "mount / from exec /bin/sh -c pip download z"},
    ]
    assert build.download_cache_records(rec) == ["pip", "pool"]


def test_the_timed_rounds_become_one_figure_per_tool_and_case(tmp_path) -> None:
    """The step after 50 minutes of builds: every timed case (cold, edit, each bump) gives each tool a figure
    named as the report and the ratios read it (a run of 2026-11-27 died here on an unpacking error)."""
    keys = ("cold", "edit", *(b.key for b in build.BUMPS))
    times = {k: {t: [10.0, 12.0, 11.0] for t in build.TOOLS} for k in keys}
    images = {t: {"size": 2e9, "layers": 13} for t in build.TOOLS}
    files = {t: tmp_path / f"{t}.Dockerfile" for t in build.TOOLS}
    ms = build._figures(times, images, {}, files)
    names = {m.name for m in ms}
    for label in ("cold build", "rebuild after editing one app file", *(b.label for b in build.BUMPS)):
        assert {f"{t}: {label}" for t in build.TOOLS} <= names
    bump = next(m for m in ms if m.name == f"ngcx: {build.BUMPS[1].label}")
    assert bump.wall.median == 11.0 and bump.note == f"{build.BUMPS[1].pin} -> {build.BUMPS[1].patched}"
    assert {r.name for r in build._ratios(ms)} >= {f"{build.BUMPS[1].label}: ngcx / hpccm"}


def test_build_notes_explain_a_loss_with_this_runs_figures() -> None:
    def figs(tool: str, cold: list[float], edit: float, bump: float, size: float, shared: float) -> list[Measurement]:
        rows = [("cold build", "s", cold), ("rebuild after editing one app file", "s", [edit]),
                ("rebuild after a patch bump", "s", [bump]),
                ("rebuild after a patch bump of the first wheel", "s", [bump]),
                ("image size", "bytes", [size]),
                (f"bytes shared with its {build.SECOND}", "bytes", [shared]), ("layers", "layers", [8])]
        return [Measurement(f"{tool}: {n}", tool, u, "lower", Stats.of(v)) for n, u, v in rows]

    ms = figs("ngcx", [44, 45, 46], 9, 40, 2.05e9, 74.8e6) + figs("hpccm", [37, 38, 39], 10, 35, 2.05e9, 74.8e6) + \
        figs("naive", [110], 100, 90, 2.48e9, 576.7e6)
    text = "\n".join(build.notes(ms, stack_bytes=1.978e9, common=1, parting="gcc \\"))
    assert "App edit: ngcx 9.0 s, hpccm 10.0 s, naive 100.0 s." in text
    assert "ngcx is slower than hpccm on cold build by 18% (ranges apart); rebuild after a patch bump by 14%" in text
    assert "share their bottom 1 layer(s) only" in text and "`gcc \\`" in text and "(1.98 GB)" in text
    close = figs("ngcx", [38, 39, 40], 9, 30, 2.05e9, 74.8e6) + ms[7:]
    assert "cold build by 3% (ranges overlap)" in "\n".join(build.notes(close, 1.978e9, 1, "x"))
    ahead = figs("ngcx", [30], 9, 30, 2.05e9, 600e6) + ms[7:]
    assert "slower than hpccm" not in (t := "\n".join(build.notes(ahead, 1.978e9, 1, "x"))) and "Shared with" not in t


def test_a_pair_built_for_shared_bytes_misses_the_cache_after_every_from_and_changes_nothing_else() -> None:
    """build.fresh_cache: the shared-bytes pair is built as from an empty layer cache (an ARG after each
    FROM is in every later RUN's cache key); the steps themselves must stay exactly the tool's own."""
    text = ("# header\nARG BASE_IMAGE=ngcx/base:bookworm\nFROM ${BASE_IMAGE}\nRUN apt-get update\n"
            "FROM x AS y\nCOPY a b\n")
    out = build.fresh_cache(text, "n1")
    assert out.splitlines() == ["# header", "ARG BASE_IMAGE=ngcx/base:bookworm", "FROM ${BASE_IMAGE}",
                                "ARG NGCX_BENCH_PAIR=n1", "RUN apt-get update", "FROM x AS y",
                                "ARG NGCX_BENCH_PAIR=n1", "COPY a b"]
    assert build.fresh_cache(text, "n2") != out


def test_every_timed_bump_names_a_pin_each_tool_installs() -> None:
    """A bump whose pin a tool's Dockerfile lacks would time a build of nothing changed; the ngcx bumps hit
    its last and its first CUDA wheel layer, as their labels say."""
    from ngcx.catalog import load_catalog
    from ngcx.render.dockerfile import render_dockerfile

    rel = load_catalog().resolve(build.REF)
    texts = {"ngcx": render_dockerfile(rel), "hpccm": peers.hpccm_recipe(build.REF),
             "naive": (build.NAIVE / "cuda.Dockerfile").read_text()}
    for bump in build.BUMPS:
        for tool, text in texts.items():
            assert bump.pin in text, f"{tool} does not install {bump.pin}"
        assert bump.pin.split("==")[0] == bump.patched.split("==")[0] and bump.pin != bump.patched
    assert [b.pin for b in build.BUMPS] == [rel.pins[-1].requirement, rel.pins[0].requirement]


def test_a_naive_dockerfile_mirrors_each_release_the_suite_builds() -> None:
    """The suite builds REF and SECOND with every tool: a missing naive file fails the run after its timings."""
    for ref in (build.REF, build.SECOND):
        naive = build.NAIVE / f"{ref.split(':')[0]}.Dockerfile"
        assert naive.read_text().startswith(f"# ngcx-release: {ref} "), naive
