"""bench/suites/push.py and its push_*.py helpers: ratios, notes, manifests and pull timing, without Docker."""

from __future__ import annotations

from pathlib import Path

import pytest
from bench_samples import suite_doc, write_docs

from bench import report
from bench.core import Stats


def _push_figures(zstd_push: list[float], gzip_push: list[float], ctr: tuple[list[float], list[float]],
                  zstd_fails: bool = True):
    from bench.suites import push_figures as pf

    figs = pf.Figures()
    for value in gzip_push:
        figs.add(pf.push_name("gzip"), value, "s", "ngcx", "ngcx push")
    for value in zstd_push:
        figs.add(pf.push_name("zstd"), value, "s", "zstd", "docker save | zstd")
    for codec, mb in (("gzip", 1312.5), ("pigz", 1302.6), ("zstd", 1079.2)):
        figs.add(pf.pushed_name(codec), mb, "MB", pf.TOOL[codec], "manifest")
    for value in (120.0, 117.0, 125.0):
        figs.add(pf.push_name("pigz"), value, "s", "pigz", "docker save | pigz")
    for value in (34.7, 35.0, 36.1):
        figs.add(pf.pull_name("gzip"), value, "s", "ngcx", "docker pull")
    for z, g in zip(*ctr, strict=True):
        figs.add(pf.pull_name("zstd", pf.CONTAINERD), z, "s", "zstd", "ctr")
        figs.add(pf.pull_name("gzip", pf.CONTAINERD), g, "s", "ngcx", "ctr")
    if zstd_fails:
        figs.failed(pf.pull_name("zstd"), {"error": "failed to register layer: archive/tar: invalid tar header",
                                          "seconds": 2.5, "relay_bytes": 80e6})
    figs.facts.update(export={"zstd": [20.0, 21.0, 22.0]}, versions={"dockerd": "20.10.24", "containerd": "1.6.20"})
    return figs


def test_push_ratios_are_alternative_over_ngcx_push_and_skip_what_could_not_be_measured() -> None:
    from bench.suites import push_figures as pf

    figs = _push_figures([30.0, 32.0, 31.0], [64.0, 89.0, 70.0], ([14.0, 15.0, 16.0], [33.0, 34.0, 35.0]))
    got = {r.name: r for r in pf.ratios(figs)}
    assert got["push time: zstd / gzip (ngcx push)"].wall == round(31.0 / 70.0, 3)
    assert got["bytes: zstd / gzip (ngcx push)"].unit == "MB"
    assert got["pull time, containerd: zstd / gzip"].wall == round(15.0 / 34.0, 3)
    assert "pull time, dockerd: zstd / gzip" not in got            # dockerd 20.10 failed: no ratio, no zero
    assert got["push time: zstd / gzip (ngcx push)"].cpu is None   # no CPU figure measured: none invented
    for name, cpu in ((pf.push_name("zstd"), [9.0, 10.0, 11.0]), (pf.push_name("gzip"), [60.0, 80.0, None])):
        figs.cpu[name] = cpu
    assert {r.name: r for r in pf.ratios(figs)}["push time: zstd / gzip (ngcx push)"].cpu is None  # one round lacks it
    figs.cpu[pf.push_name("gzip")] = [60.0, 80.0, 70.0]
    assert {r.name: r for r in pf.ratios(figs)}["push time: zstd / gzip (ngcx push)"].cpu == round(10 / 70, 3)
    assert [r.name for r in pf.ratios(figs)][:2] == [pf.RATIOS[0][0], pf.RATIOS[1][0]]   # the headline pair
    names = [m.name for m in figs.measurements()]
    assert names[:3] == [pf.push_name(c) for c in ("gzip", "pigz", "zstd")]        # not the order they came in
    assert names.index(pf.pull_name("gzip")) < names.index(pf.pull_name("zstd", pf.CONTAINERD))


def test_push_notes_claim_a_win_only_when_the_figures_show_one() -> None:
    from bench.suites import push_figures as pf

    wins = "\n".join(pf.notes(_push_figures([30.0, 32.0, 31.0], [64.0, 89.0, 70.0], ([14.0, 15.0, 16.0],
                                                                                   [33.0, 34.0, 35.0])),
                              {"size": 2.07e9, "layers": 9}))
    assert "zstd wins the push clearly: 0.44x the time of ngcx push (56% less), 18% less bytes." in wins
    assert "`failed to register layer: archive/tar: invalid tar header` after 2.5 s (80 MB fetched)" in wins
    assert "Docker Engine 23.0" in wins and "What zstd would take in ngcx" in wins
    assert "gzip by pigz does not win the push clearly here" in wins and "first byte came 21.0 s after the call" in wins
    overlap = "\n".join(pf.notes(_push_figures([50.0, 60.0, 90.0], [64.0, 89.0, 70.0], ([30.0, 33.0, 36.0],
                                                                                      [33.0, 34.0, 35.0]),
                                               zstd_fails=False), {"size": 2.07e9, "layers": 9}))
    assert "zstd does not win the push clearly" in overlap and "What zstd would take" not in overlap
    assert "cannot pull zstd" not in overlap


def test_push_helpers() -> None:
    from bench.suites import push_figures as pf

    assert pf.clearly_lower(Stats.of([1, 2, 3]), Stats.of([5, 6, 7]))
    assert not pf.clearly_lower(Stats.of([1, 2, 6]), Stats.of([5, 6, 7]))      # ranges overlap
    assert not pf.clearly_lower(Stats.of([5.0]), Stats.of([6.0]))              # within 20 %
    assert pf.percent_less(30, 40) == "25% less" and pf.percent_less(50, 40) == "25% more"
    assert [pf.rotated(("a", "b", "c"), r) for r in range(4)] == [("a", "b", "c"), ("b", "c", "a"),
                                                                  ("c", "a", "b"), ("a", "b", "c")]
    first = {"layers": [{"digest": "a", "size": 100}, {"digest": "b", "size": 50}], "config": {"size": 3}}
    second = {"layers": [{"digest": "a", "size": 100}, {"digest": "b", "size": 50}, {"digest": "c", "size": 8}],
              "config": {"size": 4}}
    assert pf.new_blob_bytes(first, second) == 12


def test_push_report_names_the_alternative_that_wins_not_ngcx(tmp_path: Path) -> None:
    from bench.suites import push_figures as pf

    figs = _push_figures([30.0, 32.0, 31.0], [64.0, 89.0, 70.0], ([40.0, 41.0, 42.0], [33.0, 34.0, 35.0]))
    write_docs(tmp_path, suite_doc("push", measurements=figs.measurements(), ratios=pf.ratios(figs)))
    md = report.write(tmp_path, tmp_path / "B.md", ["push"]).read_text()
    assert "| push time: zstd / gzip (ngcx push) | **0.44** | - | zstd as fast or faster |" in md
    assert "| pull time, containerd: zstd / gzip | **1.21** | - | zstd slower |" in md
    assert "| bytes: zstd / gzip (ngcx push) | **0.82** | - | zstd as small or smaller |" in md
    assert "| bytes pushed, zstd | 1.08 GB | **1.08 GB** | 1.08 GB | `manifest` |" in md


def test_docker_save_layers_are_found_in_order_through_its_symlinks() -> None:
    from bench.suites import push_compress as pc

    assert pc.link_target("b/layer.tar", "../a/layer.tar") == "a/layer.tar"
    saved = [{"Config": "c.json", "Layers": ["a/layer.tar", "b/layer.tar", "c/layer.tar"]}]
    assert pc.layer_paths(saved, {"b/layer.tar": "a/layer.tar"}) == ["a/layer.tar", "a/layer.tar", "c/layer.tar"]


def test_a_layer_streams_through_the_compressor_and_a_failing_one_is_an_error() -> None:
    import gzip
    import io

    from bench.suites import push_compress as pc

    data = bytes(range(256)) * 20000
    out = b"".join(pc.compressed(io.BytesIO(data), ["gzip", "-c"]))
    assert gzip.decompress(out) == data and len(out) < len(data)
    with pytest.raises(RuntimeError, match="exited 3"):
        b"".join(pc.compressed(io.BytesIO(data), ["sh", "-c", "cat >/dev/null; exit 3"]))


def test_manifests_use_docker_media_types_for_gzip_and_oci_for_zstd_and_plain_tar() -> None:
    from bench.suites import push_registry as pr

    gz = pr.image_manifest(b"{}", [("sha256:aa", 10)], "gzip")
    zs = pr.image_manifest(b"{}", [("sha256:aa", 10)], "zstd")
    raw = pr.image_manifest(b"{}", [("sha256:aa", 10)], "none")
    assert (raw["mediaType"], raw["layers"][0]["mediaType"]) == (pr.OCI_MANIFEST,
                                                                 "application/vnd.oci.image.layer.v1.tar")
    assert (gz["mediaType"], gz["layers"][0]["mediaType"]) == (pr.DOCKER_MANIFEST, pr.DOCKER_GZIP_LAYER)
    assert (zs["mediaType"], zs["layers"][0]["mediaType"]) == (pr.OCI_MANIFEST,
                                                               "application/vnd.oci.image.layer.v1.tar+zstd")
    assert gz["config"]["size"] == 2 and pr.wire_bytes(gz) == 12


def test_a_pull_inside_a_machine_is_timed_and_its_error_line_kept() -> None:
    from bench.suites import push_pull as pp

    out = "ngcx-bench: rc=1 s=100.25 e=102.75\nzstd: Pulling from bench/cuda\nabc: Download complete\n" \
          "failed to register layer: Error processing tar file(exit status 1): archive/tar: invalid tar header\n"
    code, seconds, tail = pp.parse_timed(out)
    assert (code, seconds) == (1, 2.5)
    assert pp.error_line(tail).startswith("failed to register layer")
    with pytest.raises(RuntimeError, match="no timing line"):
        pp.parse_timed("sh: docker: not found")


def test_the_uncompressed_pull_note_follows_this_runs_figures() -> None:
    """Uncompressed layers: the note says whether they won the pull, and at what cost in bytes, from the figures."""
    from bench.suites import push_figures as pf

    def with_raw(pulls: list[float]) -> str:
        figs = _push_figures([30.0, 32.0, 31.0], [64.0, 89.0, 70.0], ([14.0, 15.0, 16.0], [33.0, 34.0, 35.0]))
        figs.add(pf.pushed_name("none"), 2083.4, "MB", "uncompressed", "manifest")
        for value in pulls:
            figs.add(pf.pull_name("none"), value, "s", "uncompressed", "docker pull")
        return "\n".join(pf.notes(figs, {"size": 2.07e9, "layers": 9}))

    fast = with_raw([17.0, 18.0, 19.5])
    assert "pull into an empty dockerd in 18.0 s against 35.0 s for ngcx push's gzip (0.51x)" in fast
    assert "carrying 2,083 MB instead of 1,312 MB (59% more): uncompressed wins the pull clearly" in fast
    assert "uncompressed does not win the pull clearly" in with_raw([30.0, 34.0, 40.0])
    ratio = {r.name: r for r in pf.ratios(_push_figures([30.0], [64.0], ([14.0], [33.0])))}
    assert "pull time, dockerd: uncompressed / gzip (ngcx push)" not in ratio   # not measured: no ratio
