"""The dashboard's image and catalog pages' data: the real catalog, a temporary state store, real images.

The engine tests build two tiny images FROM the offline base (one LABEL layer, one RUN layer each), so
they share exactly the base's layer: the detail of one must name the other on that layer and no other.
"""

from __future__ import annotations

import io
import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ngcx.core.errors import UserError
from ngcx.dashboard import images
from ngcx.state import db as state

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _own_state(isolated_state):
    """Every test gets an empty state dir (never the user's)."""


# ----------------------------------------------------------------------------- catalog


def test_catalog_matrix_has_every_release_with_its_stack_and_driver_floor_per_architecture():
    from ngcx.catalog import load_catalog

    matrix = images.catalog_matrix()
    assert len(matrix["rows"]) == len(load_catalog().all_releases())
    keys = [c["key"] for c in matrix["columns"]]
    assert {"image", "release", "cuda", "cudnn", "nccl", "tensorrt", "framework", "python"} <= set(keys)
    rows = {r["ref"]: r for r in matrix["rows"]}

    cuda = rows["cuda:24.05"]
    assert (cuda["cuda"], cuda["cudnn"], cuda["nccl"], cuda["python"]) == ("12.4", "9.1.0.70", "2.21.5", "3.11")
    assert cuda["drivers"]["Ampere (sm_80)"] == "≥ 525.60.13"
    assert "Blackwell (sm_120)" not in cuda["drivers"]  # 24.05 is not built for Blackwell

    torch = rows["pytorch:25.08"]
    assert (torch["framework"], torch["framework_version"], torch["cuda"]) == ("torch", "2.8.0", "12.8")
    assert torch["drivers"]["Blackwell (sm_120)"] == "≥ 570.26"  # registry.yaml's arch_min_driver rule
    assert torch["drivers"]["Hopper (sm_90)"] == "≥ 525.60.13"
    assert rows["tensorrt:25.08"]["tensorrt"] == "10.16.1.11" and rows["cuda:24.05"]["tensorrt"] is None
    assert rows["cuda:26.03"]["drivers"]["Turing (sm_75)"] == "≥ 580.65.06"

    every_arch = {arch for row in matrix["rows"] for arch in row["drivers"]}
    assert set(matrix["architectures"]) == every_arch
    assert matrix["architectures"][0] == "Maxwell (sm_50)"  # sorted by compute capability, not by text
    releases = [r["release"] for r in matrix["rows"] if r["image"] == "cuda"]
    assert releases == sorted(releases)


def test_a_catalog_that_breaks_a_rule_raises_the_catalogs_error(tmp_path):
    from ngcx.catalog.model import CatalogInvalid

    text = (REPO / "registry.yaml").read_text(encoding="utf-8")
    broken = tmp_path / "registry.yaml"
    broken.write_text(text.replace('framework: torch==2.5.1', 'framework: torch==2.8.0'), encoding="utf-8")
    with pytest.raises(CatalogInvalid):
        images.catalog_matrix(broken)


# ----------------------------------------------------------------------------- lists


def _build(tag: str, built_at: float, image_id: str) -> None:
    image, _, rest = tag.removeprefix("ngcx/").partition(":")
    release, _, variant = rest.partition("-")
    state.record_build(image=image, release=release, variant=variant, tag=tag, image_id=image_id,
                       built_at=built_at, size_bytes=1000 + int(built_at), duration_s=2.0)


def test_image_rows_are_the_newest_build_of_each_tag_newest_first_and_builds_the_last_ones():
    _build("ngcx/cuda:24.05-runtime", 10.0, "sha256:r1")
    _build("ngcx/cuda:24.05-devel", 20.0, "sha256:d1")
    _build("ngcx/cuda:24.05-runtime", 30.0, "sha256:r2")
    _build("ngcx/pytorch:24.11-runtime", 25.0, "sha256:p1")

    rows = images.image_rows()
    assert [(r["tag"], r["image_id"]) for r in rows] == [
        ("ngcx/cuda:24.05-runtime", "sha256:r2"), ("ngcx/pytorch:24.11-runtime", "sha256:p1"),
        ("ngcx/cuda:24.05-devel", "sha256:d1")]
    assert rows[0] == {"tag": "ngcx/cuda:24.05-runtime", "image": "cuda", "release": "24.05", "variant": "runtime",
                       "image_id": "sha256:r2", "digest": None, "size_bytes": 1030, "built_at": 30.0,
                       "duration_s": 2.0}
    assert [r["tag"] for r in images.image_rows(limit=2)] == ["ngcx/cuda:24.05-runtime", "ngcx/pytorch:24.11-runtime"]

    last = images.builds(limit=3)
    assert [b["image_id"] for b in last] == ["sha256:r2", "sha256:p1", "sha256:d1"]
    assert {"id", "tag", "base", "dockerfile_sha", "built_at"} <= set(last[0])
    assert len(images.builds()) == 4


def test_image_rows_stay_fast_with_500_builds():
    for n in range(500):
        _build(f"ngcx/cuda:{n % 50}.01-runtime", float(n), f"sha256:{n}")
    start = time.perf_counter()
    rows = images.image_rows()
    elapsed = time.perf_counter() - start
    assert len(rows) == 50 and rows[0]["built_at"] == 499.0
    assert elapsed < 0.5, elapsed


# ----------------------------------------------------------------------------- one image, engine down


def test_engine_down_gives_what_the_state_knows_with_one_line(monkeypatch):
    _build("ngcx/cuda:24.05-runtime", 10.0, "sha256:" + "a" * 64)
    state.record_test(tag="ngcx/cuda:24.05-runtime", image_id="sha256:" + "a" * 64,
                      results=[{"name": "cudnn", "status": "passed", "expected": "9", "found": "9", "note": ""}])
    push_id = state.record_push(tag="ngcx/cuda:24.05-runtime", remote_ref="127.0.0.1:5000/cuda:24.05-runtime",
                                digest="sha256:d", pushed_at=5.0)
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")

    detail = images.image_detail("ngcx/cuda:24.05-runtime")
    assert detail["engine_error"].startswith("Docker Engine not reachable") and "\n" not in detail["engine_error"]
    assert detail["present"] is False and detail["layers"] == [] and detail["image_id"] == "sha256:" + "a" * 64
    assert detail["build"]["tag"] == "ngcx/cuda:24.05-runtime" and detail["tests"]["passed"] == 1
    assert detail["pushes"] == [{"id": push_id, "tag": "ngcx/cuda:24.05-runtime",
                                 "remote_ref": "127.0.0.1:5000/cuda:24.05-runtime", "digest": "sha256:d",
                                 "pushed_at": 5.0}]
    with pytest.raises(UserError, match="'ngcx/never:1'.*not reachable"):
        images.image_detail("ngcx/never:1")


@pytest.mark.parametrize("ref", ["../containers/x", "a/../b", "Bad Ref!", "", "ngcx/a:b/json"])
def test_a_ref_outside_dockers_grammar_never_reaches_the_engine(ref, monkeypatch):
    """The ref goes into the engine's URL: '../containers/x' would read another endpoint as an image."""
    from ngcx.core import engine

    monkeypatch.setattr(engine, "engine_client", lambda timeout=600: pytest.fail("the engine was asked"))
    with pytest.raises(UserError, match="is not an image reference or image id"):
        images.image_detail(ref)


# ----------------------------------------------------------------------------- one image, real engine


@pytest.fixture(scope="module")
def two_images(docker_client, base_image) -> Iterator[dict]:
    """Two tiny images FROM the base, labelled like ngcx images; removed afterwards."""
    token = secrets.token_hex(4)
    made = {}
    for name in ("a", "b"):
        dockerfile = (f"FROM {base_image}\n"
                      f"LABEL ai.ngcx.cuda=12.4 ai.ngcx.pin.cudnn=9.1.0.70 org.example.side={name}\n"
                      f"RUN echo {name}-{token} > /marker\n")
        tag = f"ngcx-test/dashboard-{name}:{token}"
        image, _ = docker_client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=tag, rm=True, pull=False)
        made[name] = {"tag": tag, "id": image.id}
    made["base_layer"] = docker_client.images.get(base_image).attrs["RootFS"]["Layers"][0]
    yield made
    for name in ("a", "b"):
        docker_client.images.remove(made[name]["tag"], force=True)


@pytest.mark.docker
def test_image_detail_splits_pins_lists_layers_and_names_the_image_sharing_the_base_layer(two_images):
    a, b = two_images["a"], two_images["b"]
    state.record_build(image="dashboard-a", release="1", variant="runtime", tag=a["tag"], image_id=a["id"])
    state.record_test(tag=a["tag"], image_id=a["id"],
                      results=[{"name": "cudnn", "status": "failed", "expected": "9", "found": "8", "note": ""}])
    state.record_push(tag=a["tag"], remote_ref="127.0.0.1:5000/dashboard-a:1", digest="sha256:e")

    detail = images.image_detail(a["tag"])
    assert detail["engine_error"] is None and detail["present"] is True
    assert (detail["tag"], detail["image_id"], detail["tags"]) == (a["tag"], a["id"], [a["tag"]])
    assert detail["pins"] == {"cuda": "12.4", "cudnn": "9.1.0.70"}
    assert detail["labels"]["org.example.side"] == "a"
    assert not any(k.startswith("ai.ngcx.pin.") or k == "ai.ngcx.cuda" for k in detail["labels"])
    assert detail["size_bytes"] > 0

    layers = detail["layers"]
    assert len(layers) == 2 and layers[0]["diff_id"] == two_images["base_layer"]
    assert b["tag"] in layers[0]["shared_with"] and a["tag"] not in layers[0]["shared_with"]
    assert b["tag"] not in layers[1]["shared_with"]  # the RUN layer is a's own
    assert "echo a-" in layers[1]["created_by"] and layers[1]["size_bytes"] > 0
    assert layers[0]["size_bytes"] > 1_000_000  # the base's root filesystem

    assert detail["tests"]["failed"] == 1 and detail["tests"]["results"][0]["found"] == "8"
    assert [p["remote_ref"] for p in detail["pushes"]] == ["127.0.0.1:5000/dashboard-a:1"]
    assert detail["build"]["image_id"] == a["id"]


@pytest.mark.docker
def test_image_detail_by_image_id_and_without_a_build_record(two_images):
    b = two_images["b"]
    detail = images.image_detail(b["id"])
    assert detail["tag"] == b["tag"] and detail["build"] is None and detail["tests"] is None
    assert detail["pushes"] == [] and detail["pins"]["cudnn"] == "9.1.0.70"
    assert images.image_detail(b["id"].removeprefix("sha256:")[:12])["image_id"] == b["id"]


@pytest.mark.docker
def test_an_unknown_ref_is_one_user_error_naming_it(docker_client):
    with pytest.raises(UserError, match="no local image 'ngcx-test/never-built:0'") as info:
        images.image_detail("ngcx-test/never-built:0")
    assert "\n" not in info.value.line() and "ngcx build" in info.value.line()
