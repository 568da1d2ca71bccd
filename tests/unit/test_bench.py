"""Spec of the bench's own logic (issue 13): the figures it reports and the BENCHMARKS.md it writes.

Why: BENCHMARKS.md is what users read to choose ngcx over hpccm or a hand-written Dockerfile; a
median taken from the wrong values, a ratio turned upside down, or a skipped suite shown as
measured would mislead them silently. No Docker, no peers: the timed commands are tiny Pythons.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # bench/ is a top-level folder of the repo, not an installed package
    sys.path.insert(0, str(ROOT))

from bench import __main__ as entry  # noqa: E402
from bench import peers, project_figures, report  # noqa: E402
from bench.core import (  # noqa: E402
    Measurement,
    Ratio,
    Stats,
    SuiteResult,
    SuiteSkipped,
    Timed,
    ratio,
    time_interleaved,
    time_once,
)
from bench.suites import SUITES, build, project  # noqa: E402

# ----------------------------------------------------------------------------- figures


def test_stats_are_min_median_max_of_every_value() -> None:
    s = Stats.of([0.3, 0.1, 0.2, 0.9])
    assert (s.min, s.median, s.max) == (0.1, 0.25, 0.9)   # even count: the mean of the middle two
    assert s.values == [0.3, 0.1, 0.2, 0.9]                # kept in run order, for the JSON
    assert Stats.of([5.0, 1.0, 2.0]).median == 2.0


def _m(name: str, wall: list[float], cpu: list[float] | None = None, better: str = "lower") -> Measurement:
    return Measurement(name=name, tool="x", unit="s", better=better, wall=Stats.of(wall),
                       cpu=Stats.of(cpu) if cpu else None)


def test_ratio_is_ngcx_over_peer_on_medians() -> None:
    ngcx = _m("ngcx", [0.30, 0.20, 0.90], cpu=[0.1, 0.1, 0.1])
    peer = _m("peer", [0.10, 0.05, 0.11], cpu=[0.05, 0.05, 0.06])
    r = ratio("ngcx / peer", ngcx, peer)
    assert (r.wall, r.cpu) == (3.0, 2.0)                   # 0.30 / 0.10 and 0.1 / 0.05, not min or max
    assert not r.ngcx_wins
    assert ratio("peer / ngcx", peer, ngcx).ngcx_wins
    assert ratio("no cpu", _m("a", [1.0, 1.0, 1.0]), peer).cpu is None


def test_for_throughputs_a_higher_ratio_wins() -> None:
    assert Ratio("int8 / fp32", "int8", "fp32", wall=1.8, better="higher").ngcx_wins
    assert not Ratio("int8 / fp32", "int8", "fp32", wall=0.8, better="higher").ngcx_wins


def test_commands_are_timed_round_robin_after_a_warm_up(tmp_path: Path) -> None:
    """Interleaving is what makes a ratio fair on a loaded machine: a load spike hits both tools."""
    log = tmp_path / "log"

    def cmd(tag: str) -> Timed:
        return Timed(tag, "python", [sys.executable, "-c", f"open({str(log)!r}, 'a').write({tag!r})"])

    ms = time_interleaved([cmd("a"), cmd("b")], repeat=3, warmup=1)
    assert log.read_text() == "ab" + "ab" * 3
    assert [m.name for m in ms] == ["a", "b"]
    assert all(len(m.wall.values) == 3 and len(m.cpu.values) == 3 for m in ms)
    assert all(0 < m.wall.min <= m.wall.median <= m.wall.max for m in ms)


def test_a_failing_command_stops_the_suite_with_its_stderr() -> None:
    with pytest.raises(RuntimeError, match="exited 3: boom"):
        time_once([sys.executable, "-c", "import sys; sys.stderr.write('boom'); sys.exit(3)"])


# ----------------------------------------------------------------------------- suites and the entry point


def test_a_suite_that_does_not_apply_is_a_result_with_its_reason(tmp_path: Path, monkeypatch) -> None:
    def no_engine(result: SuiteResult, work: Path, out: Path) -> None:
        raise SuiteSkipped("needs the Docker engine (scripts/setup.sh)")

    monkeypatch.setattr(entry, "SUITES", {"later": no_engine})
    args = entry.parse(["later", "--out", str(tmp_path)])
    result = entry.run_suite("later", args)
    assert (result.status, result.reason) == ("skipped", "needs the Docker engine (scripts/setup.sh)")
    assert result.measurements == [] and result.ratios == []
    assert result.command == f".venv/bin/python -m bench later --repeat 3 --out {tmp_path}"
    assert result.machine["cores"] >= 1 and len(result.machine["load_average_after"]) == 3


def test_a_crashing_suite_is_recorded_as_skipped_and_the_others_still_run(tmp_path: Path, monkeypatch) -> None:
    def crash(result: SuiteResult, work: Path, out: Path) -> None:
        result.measurements.append(_m("half-done", [1.0, 1.0, 1.0]))
        raise ValueError("disk full")

    def skip(result: SuiteResult, work: Path, out: Path) -> None:
        raise SuiteSkipped("no Docker engine here")

    monkeypatch.setattr(entry, "SUITES", {"crash": crash, "skip": skip})
    assert entry.main(["all", "--out", str(tmp_path)]) == 0
    crashed = json.loads((tmp_path / "crash.json").read_text())
    assert crashed["status"] == "skipped" and crashed["reason"] == "failed: ValueError: disk full"
    assert crashed["measurements"] == []                    # no half-measured figures in the report
    assert json.loads((tmp_path / "skip.json").read_text())["reason"] == "no Docker engine here"
    md = (tmp_path / "BENCHMARKS.md").read_text()
    assert "**Skipped**: failed: ValueError: disk full" in md and "**Skipped**: no Docker engine here" in md
    assert not list(tmp_path.glob("*.png"))


@pytest.mark.parametrize(("argv", "message"), [
    (["cli", "--repeat", "2"], "--repeat must be at least 3"),
    (["cli", "nosuch"], "unknown suite(s) nosuch"),
])
def test_bad_arguments_are_refused(argv: list[str], message: str, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        entry.parse(argv)
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_all_means_every_suite_of_the_issue_once() -> None:
    assert entry.parse(["all"]).suites == list(SUITES)
    assert entry.parse(["cli", "cli", "runtime"]).suites == ["cli", "runtime"]
    assert set(SUITES) >= {"cli", "build", "project", "push", "deploy", "runtime"}


# ----------------------------------------------------------------------------- BENCHMARKS.md


def _doc(suite: str, **kw) -> dict:
    result = SuiteResult(suite=suite, status="ok", command=f".venv/bin/python -m bench {suite} --repeat 3",
                         repeat=3, started="2026-11-22T10:00:00Z", duration_s=12.0,
                         machine={"cores": 2, "load_average_before": [1.0, 1.1, 1.2],
                                  "load_average_after": [1.5, 1.1, 1.2], "git_revision": "abc1234",
                                  "git_dirty": False, "python": "3.11.7"})
    for key, value in kw.items():
        setattr(result, key, value)
    return result.as_dict()


def _write(folder: Path, *docs: dict) -> None:
    for doc in docs:
        (folder / f"{doc['suite']}.json").write_text(json.dumps(doc))


def test_report_shows_ratios_figures_machine_and_command(tmp_path: Path) -> None:
    ngcx = _m("ngcx render", [0.18, 0.17, 0.20], cpu=[0.16, 0.17, 0.18])
    ngcx.command, ngcx.note = ".venv/bin/ngcx render pytorch:24.11", "warm cache"
    peer = _m("hpccm --recipe", [0.07, 0.08, 0.09], cpu=[0.06, 0.07, 0.08])
    peer.command = ".venv/bin/hpccm --recipe r.py"
    fast = _m("ngcx size", [0.5, 0.5, 0.5])
    cli = _doc("cli", measurements=[ngcx, peer], notes=["the gap is start-up"],
               ratios=[ratio("ngcx render / hpccm", ngcx, peer), ratio("size / naive", fast, peer)])
    _write(tmp_path, cli, _doc("build", status="skipped", reason="no Docker engine"))
    (tmp_path / "cli.png").write_bytes(b"\x89PNG")
    out = report.write(tmp_path, tmp_path / "BENCHMARKS.md", ["cli", "build", "push"])
    md = out.read_text()

    assert "| [cli](#cli) | ok | ngcx render / hpccm: 2.25; size / naive: 6.25 | 2026-11-22 |" in md
    assert "| [build](#build) | skipped | no Docker engine | 2026-11-22 |" in md
    assert "| push | not run yet | - | - |" in md
    assert "Command: `.venv/bin/python -m bench cli --repeat 3`" in md
    assert "3 repetitions, 2 cores, load average [1.0, 1.1, 1.2] before, [1.5, 1.1, 1.2] after; git abc1234," in md
    assert "| ngcx render / hpccm | **2.25** | 2.43 | ngcx slower |" in md        # 0.18/0.08, 0.17/0.07
    assert ("| ngcx render | `.venv/bin/ngcx render pytorch:24.11` | 0.170 | **0.180** | 0.200 | 0.170 "
            "| warm cache |") in md
    assert "- the gap is start-up" in md and "![cli](cli.png)" in md
    assert "## build\n\nCommand: `.venv/bin/python -m bench build --repeat 3`\n\n**Skipped**: no Docker engine" in md
    assert md.index("## cli") < md.index("## build") and "## push" not in md


def test_report_says_when_ngcx_wins_and_names_throughputs_as_such(tmp_path: Path) -> None:
    quick, slow = _m("ngcx", [1.0, 1.0, 1.0]), _m("naive", [2.0, 2.0, 2.0])
    hi = Measurement("int8", "ngcx", "inf/s", "higher", Stats.of([3000.0, 3100.0, 3200.0]), command="bench x")
    lo = Measurement("fp32", "ngcx", "inf/s", "higher", Stats.of([1500.0, 1550.0, 1600.0]), command="bench x")
    _write(tmp_path, _doc("build", measurements=[quick, slow], ratios=[ratio("ngcx / naive", quick, slow)]),
           _doc("runtime", measurements=[hi, lo], ratios=[ratio("int8 / fp32", hi, lo)]))
    md = report.write(tmp_path, tmp_path / "B.md", ["build", "runtime"]).read_text()
    assert "| ngcx / naive | **0.50** | - | ngcx as fast or faster |" in md
    assert "| int8 / fp32 | **2.00** | - | throughput ratio |" in md
    assert "Each row from: `bench x`" in md                      # one command measured many ways: said once
    assert "| int8 | 3,000.0 | **3,100.0** | 3,200.0 |  |" in md


# ----------------------------------------------------------------------------- the build suite's logic

# `docker history` of ngcx/cuda:24.05-runtime as the engine (20.10, BuildKit) reported it: newest first.
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


def test_report_mixes_units_in_one_table_and_reads_sizes_and_sharing(tmp_path: Path) -> None:
    def fig(name: str, unit: str, value: float, better: str = "lower") -> Measurement:
        return Measurement(name, name.split(":")[0], unit, better, Stats.of([value]), command="docker build x")

    cold_n, cold_h = fig("ngcx: cold build", "s", 40.0), fig("hpccm: cold build", "s", 38.0)
    size_n, size_v = fig("ngcx: image size", "bytes", 2.05e9), fig("naive: image size", "bytes", 2.48e9)
    share_n, share_v = (fig("ngcx: bytes shared", "bytes", 74.8e6, "higher"),
                        fig("naive: bytes shared", "bytes", 576.7e6, "higher"))
    layers = fig("ngcx: layers", "layers", 8)
    doc = _doc("build", measurements=[cold_n, cold_h, size_n, size_v, share_n, share_v, layers],
               ratios=[ratio("cold", cold_n, cold_h), ratio("size", size_n, size_v), ratio("shared", share_n, share_v)])
    _write(tmp_path, doc)
    md = report.write(tmp_path, tmp_path / "B.md", ["build"]).read_text()
    assert "| cold | **1.05** | - | ngcx slower |" in md
    assert "| size | **0.83** | - | ngcx as small or smaller |" in md
    assert "| shared | **0.13** | - | ngcx shares less |" in md
    assert "| ngcx: cold build | 40.0 s | **40.0 s** | 40.0 s | `docker build x` |" in md
    assert "| naive: image size | 2.48 GB | **2.48 GB** | 2.48 GB |" in md
    assert "| ngcx: bytes shared | 74.8 MB | **74.8 MB** |" in md and "| ngcx: layers | 8 | **8** | 8 |" in md


def test_build_notes_explain_a_loss_with_this_runs_figures() -> None:
    def figs(tool: str, cold: list[float], edit: float, bump: float, size: float, shared: float) -> list[Measurement]:
        rows = [("cold build", "s", cold), ("rebuild after editing one app file", "s", [edit]),
                ("rebuild after a patch bump", "s", [bump]), ("image size", "bytes", [size]),
                (f"bytes shared with its {build.SECOND}", "bytes", [shared]), ("layers", "layers", [8])]
        return [Measurement(f"{tool}: {n}", tool, u, "lower", Stats.of(v)) for n, u, v in rows]

    ms = figs("ngcx", [44, 45, 46], 9, 40, 2.05e9, 74.8e6) + figs("hpccm", [37, 38, 39], 10, 35, 2.05e9, 74.8e6) + \
        figs("naive", [110], 100, 90, 2.48e9, 576.7e6)
    text = "\n".join(build.notes(ms, stack_bytes=1.978e9, common=1, parting="gcc \\"))
    assert "App edit: ngcx 9.0 s, hpccm 10.0 s, naive 100.0 s." in text
    assert "ngcx is slower than hpccm on cold build by 18% (ranges apart); rebuild after a patch bump by 14%" in text
    assert "share their bottom 1 layer(s) only" in text and "`gcc \\`" in text and "(1.98 GB)" in text
    close = figs("ngcx", [38, 39, 40], 9, 30, 2.05e9, 74.8e6) + ms[6:]
    assert "cold build by 3% (ranges overlap)" in "\n".join(build.notes(close, 1.978e9, 1, "x"))
    ahead = figs("ngcx", [30], 9, 30, 2.05e9, 600e6) + ms[6:]
    assert "slower than hpccm" not in (t := "\n".join(build.notes(ahead, 1.978e9, 1, "x"))) and "Shared with" not in t


def test_quick_is_one_repetition_and_says_so(tmp_path: Path, capsys) -> None:
    args = entry.parse(["build", "--quick", "--out", str(tmp_path)])
    assert args.repeat == 1 and entry.command_line("build", args).endswith(f"build --quick --out {tmp_path}")
    with pytest.raises(SystemExit):
        entry.parse(["build", "--quick", "--repeat", "5"])
    assert "--quick means one repetition" in capsys.readouterr().err
    _write(tmp_path, _doc("build", repeat=1, measurements=[_m("x", [1.0])]))
    assert "Quick run: one repetition" in report.write(tmp_path, tmp_path / "B.md", ["build"]).read_text()


# ----------------------------------------------------------------------------- the project suite


def test_project_inputs_are_a_valid_ngcx_yaml_and_a_dockerfile_serving_the_same_model() -> None:
    import yaml

    from ngcx.project.spec import ProjectSpec

    spec = ProjectSpec.model_validate(yaml.safe_load(project.project_yaml("ngcx-bench-abc123-1")))
    assert (spec.name, spec.base, spec.requirements, spec.handler) == \
        ("ngcx-bench-abc123-1", project.REF, "requirements.txt", "handler:Handler")
    assert spec.model is not None and (spec.model.path, spec.model.name) == ("model.onnx", project.MODEL_NAME)
    naive = project.NAIVE_FILE.read_text()
    assert f"FROM {project_figures.BASE_TAG}\n" in naive and "COPY . /app\n" in naive
    assert f'"--name", "{project.MODEL_NAME}"' in naive and '"handler:Handler"' in naive
    assert project.hidden_units(100) * 4 * (project.FEATURES + 1 + project.CLASSES) == pytest.approx(100e6, rel=1e-4)


def test_each_repetition_adds_its_own_package_in_a_line_no_other_run_wrote() -> None:
    from packaging.requirements import Requirement

    assert project.requirements(1) == project.requirements(2) == "six\n"
    a, b = project.requirements(1, "00beef", added=True), project.requirements(2, "00beef", added=True)
    other_run = project.requirements(1, "c0ffee", added=True)
    assert a != b and a != other_run and a.startswith("six\n")
    added = Requirement(a.splitlines()[1])
    assert added.name == project.ADDED[0] and added.specifier.contains("3.10")   # to pip, any release will do
    assert len(set(project.ADDED)) == len(project.ADDED)
    with pytest.raises(ValueError, match="distinct packages"):
        project.requirements(len(project.ADDED) + 1, "00beef", added=True)
    assert [project.round_order(r)[0] for r in (1, 2, 3)] == ["ngcx", "naive", "ngcx"]


NGCX_OUTPUT = """building ngcx-app/p:latest FROM ngcx/onnxruntime:25.08-runtime (sha256:a9242915773d)
rebuilding from layer 'wheels' (the requirements changed)
built ngcx-app/p:latest  sha256:cd1e01d54edc  4.01 GB  in 2.5s (1/7 steps cached)
\u2713        [1/7] base: onnxruntime:25.08 (ngcx/onnxruntime:25.08-runtime) (FROM)
\u2713 cached [2/7] base: onnxruntime:25.08 (ngcx/onnxruntime:25.08-runtime) (RUN)
\u2713        [3/7] wheels: the requirements, into the base's venv under its pins (RUN) 1.7s
\u2713        [4/7] model: model.onnx (its own layer: a code edit never re-sends it) (COPY) 0.1s
\u2713        [5/7] code: handler.py (COPY)
\u2713        [6/7] config (last): ngcx.yaml, environment, labels, ports, command (COPY)
\u2713        [7/7] config (last): ngcx.yaml, environment, labels, ports, command (WORKDIR) 0.2s
"""

PLAIN_OUTPUT = """#1 [internal] load build definition from Dockerfile
#1 DONE 0.0s
#5 [internal] load build context
#5 transferring context: 100.01MB 1.2s done
#5 DONE 1.3s
#4 [1/3] FROM docker.io/ngcx/onnxruntime:25.08-runtime
#6 [2/3] WORKDIR /app
#6 CACHED
#7 [3/3] COPY . /app
#7 DONE 0.2s
#8 [4/4] RUN --mount=type=secret,id=ca PIP_CERT=/run/secrets/ca pip install -r requirements.txt
#8 0.952 Collecting six
#8 DONE 0.9s
#9 exporting to image
#9 exporting layers 0.4s done
#9 DONE 0.5s
"""


def test_build_output_is_read_into_step_times_the_notes_cite() -> None:
    assert project_figures.ngcx_steps(NGCX_OUTPUT) == {
        "base RUN": 0.0, "wheels RUN": 1.7, "model COPY": 0.1, "code COPY": 0.0, "config COPY": 0.0,
        "config WORKDIR": 0.2}
    assert project_figures.engine_seconds(NGCX_OUTPUT) == 2.5 and project_figures.engine_seconds("no") is None
    assert not project_figures.wheels_step_cached(NGCX_OUTPUT)
    assert project_figures.wheels_step_cached(NGCX_OUTPUT.replace("\u2713        [3/7]", "\u2713 cached [3/7]"))
    assert project_figures.plain_steps(PLAIN_OUTPUT) == {"context": 1.3, "COPY": 0.2, "RUN": 0.9, "export": 0.5}
    assert project_figures.median_steps([{"RUN": 1.0, "COPY": 0.2}, {"RUN": 3.0}, {"RUN": 2.0, "COPY": 0.4}]) == \
        {"COPY": 0.2, "RUN": 2.0}                          # a cached (absent) step counts 0


def test_project_cache_records_removed_are_this_runs_own() -> None:
    """A rebuild stacks its new model layer on an older cached wheels record; the hand-written COPY . /app
    sits under its RUN; the contexts that hold the model go too; nothing of another build, no small context."""
    wheels = "mount / from exec /bin/bash -o pipefail -c if [ -s /run/secrets/pip_conf ]; then x"
    rec = [
        {"ID": "oldwheels", "Type": "regular", "Description": wheels},
        {"ID": "model", "Type": "regular", "Description": "fileop target", "Parent": "oldwheels"},
        {"ID": "code", "Type": "regular", "Description": "fileop target", "Parent": "model"},
        {"ID": "workdir", "Type": "regular", "Description": "fileop target", "Parent": "base"},
        {"ID": "copyall", "Type": "regular", "Description": "fileop target", "Parent": "workdir"},
        {"ID": "pip", "Type": "regular", "Parent": "copyall",
         "Description": "mount / from exec /bin/sh -c PIP_CERT=/run/secrets/ca pip install -r requirements.txt"},
        {"ID": "ctx", "Type": "source.local", "Description": "local source for context", "Size": 100_000_300},
        {"ID": "smallctx", "Type": "source.local", "Description": "local source for context", "Size": 2_000},
        {"ID": "other", "Type": "regular", "Description": "fileop target", "Parent": "npm"},
        {"ID": "npm", "Type": "regular", "Description": "mount / from exec /bin/sh -c npm ci"},
        {"ID": "base", "Type": "regular", "Description": "from local"},
    ]
    markers = build.run_markers("RUN --mount=type=cache,target=/root/.cache/pip \\\n    if [ -s /run/secrets/pip_conf "
                                "]; then x\nRUN --mount=type=secret,id=ca PIP_CERT=/run/secrets/ca pip install -r r\n")
    got = project_figures.project_records(rec, before={"oldwheels", "base"}, markers=markers,
                                          min_source_bytes=90_000_000)
    assert set(got) == {"model", "code", "workdir", "copyall", "pip", "ctx"}
    assert got.index("code") < got.index("model") and got.index("pip") < got.index("copyall") < got.index("workdir")


def _project_figures(ngcx: dict[str, float], naive: dict[str, float]) -> list[Measurement]:
    times = {case: {"ngcx": [ngcx[case]] * 3, "naive": [naive[case]] * 3} for case in project_figures.CASES}
    return project_figures.figures(times, {"ngcx": [4_010_000_000], "naive": [4_010_001_000]},
                                   {"ngcx": [100_600_000], "naive": [100_601_000]})


def test_project_notes_say_where_ngcx_wins_and_what_its_losses_are_made_of() -> None:
    ms = _project_figures({"cold": 4.3, "code": 0.55, "model": 1.8, "package": 2.7},
                          {"cold": 2.0, "code": 1.2, "model": 1.9, "package": 1.3})
    ratios = {r.name: r.wall for r in project_figures.ratios(ms)}
    assert ratios["rebuild after a code-only edit: ngcx / hand-written"] == pytest.approx(0.458, abs=1e-3)
    assert list(ratios)[:2] == ["rebuild after a code-only edit: ngcx / hand-written",
                                "rebuild after a model change: ngcx / hand-written"]
    steps = {case: {"ngcx": {"wheels RUN": 1.6 if case in ("cold", "package") else 0.0,
                             "base RUN": 0.5 if case == "cold" else 0.0},
                    "naive": {"RUN": 0.7, "COPY": 0.1, "export": 0.4}} for case in project_figures.CASES}
    layers = {"ngcx": [("RUN pip install …", 610_000), ("COPY model/model.onnx /opt/ngcx/model/model.onnx", 100e6)],
              "naive": [("COPY . /app", 100e6), ("RUN pip install …", 610_000)]}
    served = {"model": "mlp", "output_shape": [1, 10], "max_abs_diff": 0.0}
    text = "\n".join(project_figures.notes(ms, steps, {"cold": 0.46, "package": 0.35}, layers, served, 100_000_000))
    assert "Code-only edit: ngcx 0.55 s, hand-written 1.20 s, ngcx 2.2x as fast (ranges apart)" in text
    assert "re-copies the model (0.10 s), re-runs pip install (0.70 s) and exports that layer again (0.40 s)" in text
    assert "ngcx is slower on cold build by 2.30 s (0.46 s in the client before and after the engine build" in text
    assert "; rebuild after adding a package by 1.40 s (0.35 s in the client" in text
    assert "its wheels RUN 1.60 s against the hand-written pip RUN's 0.70 s" in text
    assert "a RUN mkdir the hand-written file has no need of, 0.50 s" in text
    assert "What would close it" in text and "only because of --no-cache" in text
    assert "both images served model 'mlp'" in text and "`COPY . /app` 100.0 MB" in text
    even = _project_figures({"cold": 2.0, "code": 0.5, "model": 1.8, "package": 1.2},
                            {"cold": 2.0, "code": 1.2, "model": 1.9, "package": 1.3})
    calm = "\n".join(project_figures.notes(even, steps, {}, {}, {}, 100_000_000))
    assert "slower" not in calm and "What would close it" not in calm



# ----------------------------------------------------------------------------- the push suite


def _push_figures(zstd_push: list[float], gzip_push: list[float], ctr: tuple[list[float], list[float]],
                  zstd_fails: bool = True):
    from bench import push_figures as pf

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
    from bench import push_figures as pf

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
    from bench import push_figures as pf

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
    from bench import push_figures as pf

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
    from bench import push_figures as pf

    figs = _push_figures([30.0, 32.0, 31.0], [64.0, 89.0, 70.0], ([40.0, 41.0, 42.0], [33.0, 34.0, 35.0]))
    _write(tmp_path, _doc("push", measurements=figs.measurements(), ratios=pf.ratios(figs)))
    md = report.write(tmp_path, tmp_path / "B.md", ["push"]).read_text()
    assert "| push time: zstd / gzip (ngcx push) | **0.44** | - | zstd as fast or faster |" in md
    assert "| pull time, containerd: zstd / gzip | **1.21** | - | zstd slower |" in md
    assert "| bytes: zstd / gzip (ngcx push) | **0.82** | - | zstd as small or smaller |" in md
    assert "| bytes pushed, zstd | 1.08 GB | **1.08 GB** | 1.08 GB | `manifest` |" in md


def test_docker_save_layers_are_found_in_order_through_its_symlinks() -> None:
    from bench import push_compress as pc

    assert pc.link_target("b/layer.tar", "../a/layer.tar") == "a/layer.tar"
    saved = [{"Config": "c.json", "Layers": ["a/layer.tar", "b/layer.tar", "c/layer.tar"]}]
    assert pc.layer_paths(saved, {"b/layer.tar": "a/layer.tar"}) == ["a/layer.tar", "a/layer.tar", "c/layer.tar"]


def test_a_layer_streams_through_the_compressor_and_a_failing_one_is_an_error() -> None:
    import gzip
    import io

    from bench import push_compress as pc

    data = bytes(range(256)) * 20000
    out = b"".join(pc.compressed(io.BytesIO(data), ["gzip", "-c"]))
    assert gzip.decompress(out) == data and len(out) < len(data)
    with pytest.raises(RuntimeError, match="exited 3"):
        b"".join(pc.compressed(io.BytesIO(data), ["sh", "-c", "cat >/dev/null; exit 3"]))


def test_manifests_use_docker_media_types_for_gzip_and_oci_for_zstd() -> None:
    from bench import push_registry as pr

    gz = pr.image_manifest(b"{}", [("sha256:aa", 10)], zstd=False)
    zs = pr.image_manifest(b"{}", [("sha256:aa", 10)], zstd=True)
    assert (gz["mediaType"], gz["layers"][0]["mediaType"]) == (pr.DOCKER_MANIFEST, pr.DOCKER_GZIP_LAYER)
    assert (zs["mediaType"], zs["layers"][0]["mediaType"]) == (pr.OCI_MANIFEST,
                                                               "application/vnd.oci.image.layer.v1.tar+zstd")
    assert gz["config"]["size"] == 2 and pr.wire_bytes(gz) == 12


def test_a_pull_inside_a_machine_is_timed_and_its_error_line_kept() -> None:
    from bench import push_pull as pp

    out = "ngcx-bench: rc=1 s=100.25 e=102.75\nzstd: Pulling from bench/cuda\nabc: Download complete\n" \
          "failed to register layer: Error processing tar file(exit status 1): archive/tar: invalid tar header\n"
    code, seconds, tail = pp.parse_timed(out)
    assert (code, seconds) == (1, 2.5)
    assert pp.error_line(tail).startswith("failed to register layer")
    with pytest.raises(RuntimeError, match="no timing line"):
        pp.parse_timed("sh: docker: not found")


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


def test_the_deploy_note_says_when_ngcx_local_is_slower_and_whether_that_is_noise() -> None:
    from bench.suites.deploy import local_note

    def by(ours: list[float], theirs: list[float]) -> dict[str, Measurement]:
        return {n: _m(n, v) for n, v in (("ngcx deploy: local (total)", ours),
                                          ("docker run -d -p + poll ready (by hand)", theirs))}

    assert "ranges overlap" in local_note(by([0.95, 1.04, 1.7], [0.99, 1.01, 1.3]))[0]
    assert "ranges apart" in local_note(by([2.0, 2.1, 2.2], [1.0, 1.01, 1.1]))[0]
    assert local_note(by([0.9, 0.95, 1.0], [1.0, 1.01, 1.1])) == [
        "Local: ngcx deploy 0.95 s, docker run by hand 1.01 s: ngcx as fast."]
    assert local_note({}) == []
