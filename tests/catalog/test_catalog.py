"""Spec of the catalog and `ngcx catalog ls | show | check`.

Every bad catalog here is the shipped registry.yaml with ONE thing changed (as a maintainer
bumping a pin would change it), written to tmp_path and checked by the real `ngcx` command in a
subprocess: exit code 2, the exact violation line(s) on stdout, a count on stderr, and never a
traceback. Rule cases are data edits (load YAML, change one value, dump); syntax cases (malformed
YAML, duplicate keys, unquoted tags) are text edits, because a YAML dump could not produce them.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from ngcx.catalog import load_catalog
from ngcx.catalog.model import Catalog, problems_of
from ngcx.core import paths

SHIPPED = paths.registry_file()


# ----------------------------------------------------------------------------- helpers


@pytest.fixture(autouse=True)
def _own_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`catalog show` reads the build records; keep the user's state and config out of the tests."""
    monkeypatch.setenv("NGCX_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("NGCX_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.delenv("NGCX_DATA_DIR", raising=False)


def ngcx(*args: str) -> subprocess.CompletedProcess[str]:
    """Run the real CLI; whatever it is asked, it must never show a traceback."""
    proc = subprocess.run([sys.executable, "-m", "ngcx", *args], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ))
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def shipped_text() -> str:
    return SHIPPED.read_text(encoding="utf-8")


def shipped_data() -> dict:
    return yaml.safe_load(shipped_text())


def release(data: dict, image: str, tag: str) -> dict:
    return data["images"][image]["releases"][tag]


def edit(text: str, old: str, new: str) -> str:
    """Replace one unique passage; fails loudly if the catalog no longer has it."""
    assert text.count(old) == 1, f"expected exactly one {old!r} in registry.yaml"
    return text.replace(old, new)


def line_of(text: str, passage: str) -> int:
    """1-based line where a unique passage starts."""
    assert text.count(passage) == 1, passage
    return text[: text.index(passage)].count("\n") + 1


def write(tmp_path: Path, text: str) -> Path:
    file = tmp_path / "registry.yaml"
    file.write_text(text, encoding="utf-8")
    return file


def stack_cuda(data: dict, image: str, tag: str) -> str:
    return data["stacks"][release(data, image, tag)["stack"]]["cuda"]


def one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    """A user error: exit 2, exactly one `ngcx: error:` line on stderr."""
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("ngcx: error: ")
    return lines[0]


# ----------------------------------------------------------------------------- the shipped catalog


def test_shipped_catalog_passes_check() -> None:
    proc = ngcx("catalog", "check")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = shipped_data()
    n_releases = sum(len(img["releases"]) for img in data["images"].values())
    assert proc.stdout.strip() == (
        f"{SHIPPED}: ok — {len(data['images'])} images, {n_releases} releases, "
        "all compatibility rules hold")


def test_yaml_dump_of_shipped_catalog_is_still_valid() -> None:
    """The rule cases below dump edited data; unedited, the dump must be clean, so each
    reported problem is caused by the one edit and nothing else."""
    _, problems = problems_of(yaml.safe_dump(shipped_data(), sort_keys=False), "dump.yaml")
    assert problems == []


# ----------------------------------------------------------------------------- one edit, one rule


@dataclass(frozen=True)
class Bad:
    """One bad catalog: how to make it from the shipped text, and the lines check must print."""

    id: str
    make: Callable[[str], str]            # shipped text -> bad text
    expect: Callable[[str], list[str]]    # file path -> expected stdout lines (order-free)


def data_edit(change: Callable[[dict], None]) -> Callable[[str], str]:
    def make(text: str) -> str:
        data = copy.deepcopy(yaml.safe_load(text))
        change(data)
        return yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
    return make


D = shipped_data()

CC_2405 = 'compute_capabilities: ["5.0", "6.0", "6.1", "7.0", "7.5", "8.0", "8.6", "8.9", "9.0"]'
PT_2508 = ('"25.08":\n        base: debian-bookworm\n        python: "3.11"\n'
           '        stack: cu12.8-cudnn9.10\n        framework: torch')
PT_2603 = ('"26.03":\n        base: debian-bookworm\n        python: "3.11"\n'
           '        stack: cu13.0-cudnn9.19\n        framework: torch')
CUDA_2405 = '"24.05":\n        base: debian-bookworm'


def _malformed(text: str) -> str:
    return edit(text, CC_2405, CC_2405 + "]")


def _malformed_expect(file: str) -> list[str]:
    text = shipped_text()
    line = line_of(text, CC_2405)
    col = text.splitlines()[line - 1].index(CC_2405) + len(CC_2405) + 1
    return [f"{file}:{line}:{col}: malformed YAML: expected <block end>, but found ']' "
            "(fix the YAML syntax at that line)"]


def _duplicate(text: str) -> str:
    return edit(text, PT_2603, PT_2508.split("\n")[0] + PT_2603[len('"26.03":'):])


def _duplicate_expect(file: str) -> list[str]:
    text = shipped_text()
    first, second = line_of(text, PT_2508), line_of(text, PT_2603)
    return [f"{file}:{second}:7: malformed YAML: duplicate key '25.08' (first at line {first}); "
            "each image and release may appear once (fix the YAML syntax at that line)"]


def _rename_release(image: str, old: str, new: str) -> Callable[[dict], None]:
    def change(data: dict) -> None:
        rels = data["images"][image]["releases"]
        rels[new] = rels.pop(old)
    return change


def _tf_on_cuda13(data: dict) -> None:
    rel = release(data, "tensorflow", "25.03")
    rel["stack"] = "cu13.0-cudnn9.19"
    rel["compute_capabilities"] = ["7.5", "8.0", "8.6", "8.9", "9.0"]


def _tf_on_cuda13_expect(file: str) -> list[str]:
    cu13 = {c: t.split("==")[1] for c, t in D["stacks"]["cu13.0-cudnn9.19"]["pins"].items()}
    want = D["rules"]["frameworks"]["tensorflow"]["2.18.1"]["requires"]
    labels = {"cudart": "CUDA runtime", "cublas": "cuBLAS", "cudnn": "cuDNN", "nccl": "NCCL"}
    return ["tensorflow:25.03: tensorflow 2.18.1 has no CUDA 13 build (its wheel is built for CUDA 12.5)",
            *(f"tensorflow:25.03: {labels[c]} pin {cu13[c]} differs from tensorflow 2.18.1's own "
              f"Requires-Dist =={want[c]}; pip would replace it" for c in labels)]


BAD = [
    Bad("malformed-yaml", _malformed, _malformed_expect),
    Bad("duplicate-release-key", _duplicate, _duplicate_expect),
    Bad("unquoted-release-tag",
        lambda t: edit(t, CUDA_2405, CUDA_2405.replace('"24.05":', "24.10:")),
        lambda f: [f'{f}: images.cuda.releases.24.1: release tag 24.1 is a number, not a string; '
                   f'quote it (e.g. "25.10", "3.10") - YAML reads 25.10 as 25.1']),
    Bad("unknown-key",
        data_edit(lambda d: release(d, "cuda", "25.08").update(cuda_version="12.8")),
        lambda f: [f"{f}: images.cuda.releases.25.08.cuda_version: unknown key "
                   "(remove it or check its spelling)"]),
    Bad("missing-required-key",
        data_edit(lambda d: release(d, "cuda", "25.08").pop("stack")),
        lambda f: [f"{f}: images.cuda.releases.25.08.stack: required key is missing"]),
    Bad("cu13-wheel-in-cu12-release",
        data_edit(lambda d: release(d, "tensorflow", "25.03").update(
            pins={"cudnn": "nvidia-cudnn-cu13==9.3.0.75"})),
        lambda f: [f"tensorflow:25.03: cuDNN nvidia-cudnn-cu13 is a CUDA-13 wheel but the release pins "
                   f"CUDA {stack_cuda(D, 'tensorflow', '25.03')}"]),
    Bad("tensorflow-on-cuda13", data_edit(_tf_on_cuda13), _tf_on_cuda13_expect),
    Bad("cudnn-9.19-on-old-gpus",
        data_edit(lambda d: release(d, "cuda", "24.05").update(
            pins={"cudnn": "nvidia-cudnn-cu12==9.19.0.56"})),
        lambda f: ["cuda:24.05: cuDNN 9.19.0.56 needs compute capability >= 7.5 but the release "
                   "lists 5.0, 6.0, 6.1, 7.0"]),
    Bad("min-driver-below-cuda-floor",
        data_edit(lambda d: release(d, "cuda", "26.03").update(min_driver="570.26")),
        lambda f: [f"cuda:26.03: min_driver 570.26 is below the CUDA floor "
                   f"{D['rules']['cuda_majors']['13']['min_driver']}; remove it or raise it"]),
    Bad("gpu-newer-than-cuda-minor",
        data_edit(lambda d: release(d, "cuda", "24.05")["compute_capabilities"].append("10.0")),
        lambda f: ["cuda:24.05: compute capability 10.0 is newer than CUDA 12.4 supports (up to 9.0)"]),
    Bad("pin-differs-from-requires-dist",
        data_edit(lambda d: release(d, "pytorch", "25.08").update(
            pins={"cudnn": "nvidia-cudnn-cu12==9.10.1.4"})),
        lambda f: ["pytorch:25.08: cuDNN pin 9.10.1.4 differs from torch 2.8.0's own Requires-Dist "
                   f"=={D['rules']['frameworks']['torch']['2.8.0']['requires']['cudnn']}; "
                   "pip would replace it"]),
    Bad("unknown-framework-version",
        data_edit(lambda d: release(d, "pytorch", "25.08").update(framework="torch==2.8.1")),
        lambda f: ["pytorch:25.08: framework torch 2.8.1 is not in rules.frameworks.torch (known versions: "
                   f"{', '.join(D['rules']['frameworks']['torch'])}); "
                   "add its CUDA and Requires-Dist pins there"]),
    Bad("python-differs-from-base",
        data_edit(lambda d: release(d, "pytorch", "25.08").update(python="3.12")),
        lambda f: ["pytorch:25.08: python 3.12 but base debian-bookworm ships python 3.11; "
                   "pin python 3.11 or pick a base that ships 3.12"]),
    Bad("unknown-stack",
        data_edit(lambda d: release(d, "pytorch", "25.08").update(stack="cu12.8-cudnn9.9")),
        lambda f: ["pytorch:25.08: stack 'cu12.8-cudnn9.9' is not defined under 'stacks' "
                   f"(known: {', '.join(D['stacks'])})"]),
    Bad("unknown-base",
        data_edit(lambda d: release(d, "pytorch", "25.08").update(base="debian-trixie")),
        lambda f: ["pytorch:25.08: base 'debian-trixie' is not defined under 'bases' "
                   f"(known: {', '.join(D['bases'])})"]),
    Bad("release-tag-not-yy-mm",
        data_edit(_rename_release("cuda", "25.08", "2025.08")),
        lambda f: ["cuda:2025.08: release tag '2025.08' is not YY.MM (e.g. 25.08)"]),
    Bad("release-tag-month-13",
        data_edit(_rename_release("cuda", "25.08", "25.13")),
        lambda f: ["cuda:25.13: release tag '25.13' is not YY.MM (e.g. 25.08)"]),
    Bad("cudart-minor-differs-from-stack",
        data_edit(lambda d: release(d, "cuda", "25.08").update(
            pins={"cudart": "nvidia-cuda-runtime-cu12==12.9.79"})),
        lambda f: ["cuda:25.08: CUDA runtime 12.9.79 is CUDA 12.9 but the release pins CUDA 12.8"]),
    Bad("tensorrt-bare-wheel",
        data_edit(lambda d: release(d, "tensorrt", "25.08").update(framework="tensorrt==10.16.1.11")),
        lambda f: ["tensorrt:25.08: TensorRT wheel tensorrt does not match CUDA 12 (use tensorrt-cu12; "
                   "the bare 'tensorrt' package changes CUDA major between releases)"]),
    Bad("tensorrt-wrong-cuda-major",
        data_edit(lambda d: release(d, "tensorrt", "25.08").update(framework="tensorrt-cu13==10.16.1.11")),
        lambda f: ["tensorrt:25.08: TensorRT wheel tensorrt-cu13 does not match CUDA 12 (use tensorrt-cu12; "
                   "the bare 'tensorrt' package changes CUDA major between releases)"]),
    Bad("nccl-without-cuda13-build",
        data_edit(lambda d: release(d, "cuda", "26.03").update(pins={"nccl": "nvidia-nccl-cu13==2.21.5"})),
        lambda f: ["cuda:26.03: NCCL 2.21.5 has no CUDA-13 build (builds for CUDA 11, 12)"]),
]


@pytest.mark.parametrize("bad", BAD, ids=[b.id for b in BAD])
def test_check_reports_the_violation(bad: Bad, tmp_path: Path) -> None:
    file = write(tmp_path, bad.make(shipped_text()))
    proc = ngcx("catalog", "check", str(file))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    expected = bad.expect(str(file))
    assert sorted(proc.stdout.splitlines()) == sorted(expected)
    assert proc.stderr == f"{len(expected)} problem(s) in {file}\n"


def test_at_least_twelve_distinct_bad_catalogs() -> None:
    assert len({b.id for b in BAD}) == len(BAD) >= 12
    made = {b.make(shipped_text()) for b in BAD}
    assert len(made) == len(BAD), "two cases produce the same catalog"


def test_all_violations_reported_at_once(tmp_path: Path) -> None:
    picks = [b for b in BAD if b.id in (
        "cu13-wheel-in-cu12-release", "min-driver-below-cuda-floor", "python-differs-from-base",
        "tensorrt-bare-wheel")]
    text = shipped_text()
    for bad in picks:
        text = bad.make(text)
    file = write(tmp_path, text)
    proc = ngcx("catalog", "check", str(file))
    assert proc.returncode == 2
    expected = [line for bad in picks for line in bad.expect(str(file))]
    assert len(expected) == 4
    assert sorted(proc.stdout.splitlines()) == sorted(expected)
    assert proc.stderr == f"4 problem(s) in {file}\n"


# ----------------------------------------------------------------------------- more rules (library)


def _problems(change: Callable[[dict], None]) -> list[str]:
    """The rendered lines of every problem (typed Problems, cli/problems.py)."""
    _, problems = problems_of(data_edit(change)(shipped_text()), "cat.yaml")
    return [p.line() for p in problems]


def test_onnxruntime_needs_cudnn9() -> None:
    assert "onnxruntime:25.08: onnxruntime-gpu 1.22.0 needs cuDNN 9.x, the release pins 8.9.7.29" in \
        _problems(lambda d: release(d, "onnxruntime", "25.08").update(
            pins={"cudnn": "nvidia-cudnn-cu12==8.9.7.29"}))


def test_extras_must_be_exact_pins() -> None:
    assert _problems(lambda d: release(d, "pytorch", "25.08").update(extras=["torchvision>=0.23"])) == [
        "pytorch:25.08: extras: 'torchvision>=0.23' is not an exact pin NAME==VERSION"]


def test_unbuildable_image_needs_a_reason() -> None:
    assert _problems(lambda d: d["images"]["tensorrt"].pop("not_buildable_reason")) == [
        "tensorrt: buildable: false needs not_buildable_reason (shown to users at build time)"]


def test_tensorrt_gpu_floor() -> None:
    assert _problems(lambda d: release(d, "tensorrt", "25.08")["compute_capabilities"].insert(0, "7.0")) == [
        "tensorrt:25.08: TensorRT 10.16.1.11 needs compute capability >= 7.5 but the release lists 7.0"]


def test_framework_without_kernels_for_a_gpu() -> None:
    assert _problems(lambda d: release(d, "pytorch", "24.11")["compute_capabilities"].append("10.0")) == [
        "pytorch:24.11: compute capability 10.0 is newer than CUDA 12.4 supports (up to 9.0)",
        "pytorch:24.11: torch 2.5.1 has no kernels for compute capability 10.0 (newest: 9.0)"]


def test_compute_capability_format_and_presence() -> None:
    assert _problems(lambda d: release(d, "cuda", "25.08")["compute_capabilities"].append("sm_86")) == [
        "cuda:25.08: compute capability 'sm_86' is not MAJOR.MINOR (e.g. 8.6)"]
    assert _problems(lambda d: release(d, "cuda", "25.08").update(compute_capabilities=[])) == [
        "cuda:25.08: compute_capabilities: list at least one GPU architecture"]


def test_cuda13_drops_old_gpus() -> None:
    assert _problems(lambda d: release(d, "cuda", "26.03")["compute_capabilities"].insert(0, "7.0")) == [
        "cuda:26.03: cuDNN 9.19.0.56 needs compute capability >= 7.5 but the release lists 7.0",
        "cuda:26.03: compute capability 7.0 is below CUDA 13's lowest (7.5)"]


def test_unquoted_python_in_base_is_explained() -> None:
    assert _problems(lambda d: d["bases"]["debian-bookworm"].update(python=3.10)) == [
        'cat.yaml: bases.debian-bookworm.python: value 3.1 is a number, not a string; quote it '
        '(e.g. "25.10", "3.10") - YAML reads 25.10 as 25.1']


# ----------------------------------------------------------------------------- --json, show, ls


def test_check_json_shape(tmp_path: Path) -> None:
    good = json.loads(ngcx("catalog", "check", "--json").stdout)
    assert good == {"file": str(SHIPPED), "ok": True, "problems": []}
    bad_case = next(b for b in BAD if b.id == "cu13-wheel-in-cu12-release")
    file = write(tmp_path, bad_case.make(shipped_text()))
    proc = ngcx("catalog", "check", str(file), "--json")
    assert proc.returncode == 2
    doc = json.loads(proc.stdout)
    assert (doc["file"], doc["ok"]) == (str(file), False)
    assert [p["line"] for p in doc["problems"]] == bad_case.expect(str(file))
    assert all(p["rule"].startswith(("schema.", "catalog.", "parse.")) for p in doc["problems"]), doc
    malformed = write(tmp_path, _malformed(shipped_text()))
    doc = json.loads(ngcx("catalog", "check", str(malformed), "--json").stdout)
    assert doc["ok"] is False and [p["line"] for p in doc["problems"]] == _malformed_expect(str(malformed))


def _expected_pins(data: dict, image: str, tag: str) -> dict[str, dict[str, str]]:
    rel = release(data, image, tag)
    pins = {**data["stacks"][rel["stack"]]["pins"], **rel.get("pins", {})}
    return {c: dict(zip(("wheel", "version"), t.split("=="), strict=True)) for c, t in pins.items()}


@pytest.mark.parametrize("ref", [f"{i}:{t}" for i, img in D["images"].items() for t in img["releases"]])
def test_show_json_matches_catalog(ref: str) -> None:
    image, tag = ref.split(":")
    proc = ngcx("catalog", "show", ref, "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    rel = release(D, image, tag)
    cuda = stack_cuda(D, image, tag)
    assert doc["ref"] == ref and doc["cuda"] == cuda
    assert doc["pins"] == _expected_pins(D, image, tag)
    assert doc["min_driver"] == D["rules"]["cuda_majors"][cuda.split(".")[0]]["min_driver"]
    assert sorted(doc["compute_capabilities"]) == sorted(rel["compute_capabilities"])
    blackwell = {cc: drv for cc, drv in D["rules"]["arch_min_driver"].items()
                 if cc in rel["compute_capabilities"] and cuda.startswith("12.")}
    assert doc["min_driver_by_gpu"] == blackwell
    first, *groups = doc["nvidia_require_cuda"].split(" ")
    assert first == f"cuda>={cuda}"
    floor_branch = int(doc["min_driver"].split(".")[0])
    assert all(int(g.split("driver>=")[1].split(",")[0]) >= floor_branch for g in groups), \
        "NVIDIA_REQUIRE_CUDA lists a driver branch below the CUDA floor"


def test_show_known_driver_floors() -> None:
    """Real-world floors (compat-matrix §5.1): CUDA 12 -> 525.60.13, Blackwell -> 570.26, CUDA 13 -> 580."""
    pt = json.loads(ngcx("catalog", "show", "pytorch:25.08", "--json").stdout)
    assert pt["min_driver"] == "525.60.13"
    assert pt["min_driver_by_gpu"] == {"10.0": "570.26", "12.0": "570.26"}
    newest = json.loads(ngcx("catalog", "show", "pytorch", "--json").stdout)
    tags = D["images"]["pytorch"]["releases"]
    assert newest["release"] == max(tags, key=lambda t: tuple(map(int, t.split("."))))
    assert newest["min_driver"] == "580.65.06"


def test_release_min_driver_raises_the_floor(tmp_path: Path) -> None:
    file = write(tmp_path, data_edit(lambda d: release(d, "pytorch", "25.08").update(min_driver="570.26"))(
        shipped_text()))
    doc = json.loads(ngcx("catalog", "show", "pytorch:25.08", "--json", "--catalog", str(file)).stdout)
    assert doc["min_driver"] == "570.26"
    assert doc["min_driver_by_gpu"] == {}  # Blackwell's 570.26 is no longer above the floor


def test_show_text_lists_pins_and_driver() -> None:
    proc = ngcx("catalog", "show", "cuda:24.05")
    assert proc.returncode == 0
    assert "cudnn     nvidia-cudnn-cu12==9.1.0.70" in proc.stdout
    assert "driver    >= 525.60.13" in proc.stdout


def test_ls_json_lists_every_release_once_with_one_newest_per_image() -> None:
    rows = json.loads(ngcx("catalog", "ls", "--json").stdout)
    refs = [r["ref"] for r in rows]
    assert sorted(refs) == sorted(f"{i}:{t}" for i, img in D["images"].items() for t in img["releases"])
    newest = sorted(r["ref"].split(":")[0] for r in rows if r["newest"])
    assert newest == sorted(D["images"])
    assert [r["buildable_here"] for r in rows if r["ref"].startswith("tensorrt:")] == [False, False]


# ----------------------------------------------------------------------------- user errors


def test_unknown_image_names_the_closest() -> None:
    line = one_error_line(ngcx("catalog", "show", "pytorc"))
    assert line.startswith("ngcx: error: unknown image 'pytorc'")
    assert "did you mean pytorch" in line


def test_unknown_release_names_the_closest() -> None:
    line = one_error_line(ngcx("catalog", "show", "pytorch:25.09"))
    assert line.startswith("ngcx: error: unknown release '25.09' of image 'pytorch'")
    assert "closest: pytorch:25.08" in line
    assert "releases of pytorch: " + ", ".join(sorted(D["images"]["pytorch"]["releases"])) in line


@pytest.mark.parametrize("args", [
    ("catalog", "check", "{missing}"),
    ("catalog", "show", "cuda", "--catalog", "{missing}"),
    ("catalog", "ls", "--catalog", "{missing}"),
    ("render", "cuda", "--catalog", "{missing}"),
], ids=["check", "show", "ls", "render"])
def test_missing_catalog_file_is_one_line(args: tuple[str, ...], tmp_path: Path) -> None:
    missing = tmp_path / "nope" / "registry.yaml"
    line = one_error_line(ngcx(*(a.format(missing=missing) for a in args)))
    assert str(missing) in line


@pytest.mark.parametrize("content", ["", "- just\n- a list\n"], ids=["empty", "list"])
def test_catalog_that_is_not_a_mapping(content: str, tmp_path: Path) -> None:
    file = write(tmp_path, content)
    proc = ngcx("catalog", "show", "cuda", "--catalog", str(file))
    line = one_error_line(proc)
    assert line == f"ngcx: error: {file}: the catalog must be a mapping with 'images' and 'rules'"


def test_invalid_catalog_stops_show_and_render_with_one_line(tmp_path: Path) -> None:
    picks = [b for b in BAD if b.id in ("cu13-wheel-in-cu12-release", "min-driver-below-cuda-floor")]
    text = shipped_text()
    for bad in picks:
        text = bad.make(text)
    file = write(tmp_path, text)
    out = tmp_path / "Dockerfile"
    for args in (("catalog", "show", "cuda:24.05"), ("render", "cuda:24.05", "-o", str(out))):
        line = one_error_line(ngcx(*args, "--catalog", str(file)))
        assert line.startswith(f"ngcx: error: catalog {file} is invalid: ")
        assert line.endswith(f"(+1 more: run `ngcx catalog check {file}`)")
    assert not out.exists(), "render wrote a Dockerfile from an invalid catalog"


def test_malformed_catalog_via_load_is_one_line_with_position(tmp_path: Path) -> None:
    file = write(tmp_path, _malformed(shipped_text()))
    line = one_error_line(ngcx("catalog", "ls", "--catalog", str(file)))
    assert line == "ngcx: error: " + _malformed_expect(str(file))[0]


def test_load_catalog_completes_every_release() -> None:
    cat: Catalog = load_catalog()
    assert {r.ref for r in cat.all_releases()} == {
        f"{i}:{t}" for i, img in D["images"].items() for t in img["releases"]}
    rel = cat.resolve("cuda:24.05")
    assert rel.pin("cudnn").requirement == D["stacks"]["cu12.4-cudnn9.1"]["pins"]["cudnn"]
    assert cat.resolve("tensorflow").tag == "25.03"
    assert rel.install == ()
    assert cat.resolve("tensorflow:25.03").install == ("tensorflow[and-cuda]==2.18.1",)


# ----------------------------------------------------------------------------- hostile YAML (issue 8)


@pytest.mark.parametrize(("text", "problem"), [
    ("a: " + "[" * 100_000, "nesting deeper than 64 levels"),
    ("a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{n}: &{n} [{', '.join([f'*{p}'] * 9)}]\n" for p, n in zip("abcdefg", "bcdefgh", strict=True)),
     "aliases expand to more than 100000 values"),
    ("a: " + "1" * 5000 + "\n", "too many digits"),
    ("a: 2001-13-45\n", "month must be in 1..12"),
    ("? [a, b]\n: 1\n", "a list or mapping cannot be a key"),
], ids=["deep-nesting", "alias-bomb", "huge-int", "bad-timestamp", "list-key"])
def test_hostile_yaml_is_one_problem_line_not_a_traceback(text: str, problem: str, tmp_path: Path) -> None:
    """Was a RecursionError / ValueError traceback; now the usual malformed-YAML report, exit 2."""
    file = write(tmp_path, text)
    proc = ngcx("catalog", "check", str(file))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{file}:") and problem in lines[0], proc.stdout
    assert proc.stderr == f"1 problem(s) in {file}\n"
    line = one_error_line(ngcx("catalog", "ls", "--catalog", str(file)))
    assert line == f"ngcx: error: {lines[0]}"


def test_python_tags_are_refused_never_run(tmp_path: Path) -> None:
    marker = tmp_path / "PWNED"
    file = write(tmp_path, f"a: !!python/object/apply:os.system ['touch {marker}']\n")
    line = one_error_line(ngcx("catalog", "ls", "--catalog", str(file)))
    assert "could not determine a constructor for the tag" in line and "python/object/apply:os.system" in line
    assert not marker.exists()


def test_catalog_that_is_not_utf8_is_one_line(tmp_path: Path) -> None:
    file = tmp_path / "registry.yaml"
    file.write_bytes(b"images: \xff\xfe\n")
    for args in (("catalog", "check", str(file)), ("catalog", "ls", "--catalog", str(file))):
        line = one_error_line(ngcx(*args))
        assert line == f"ngcx: error: catalog {file} is not UTF-8 text (byte 8) (save it as UTF-8, or check " \
                       "that this is the right file)"
