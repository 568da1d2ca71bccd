"""build: ngcx's Dockerfile vs hpccm's equivalent vs a naive one, for cuda:24.05, on the same engine.

All three are built the same way (`DOCKER_BUILDKIT=1 docker build`, the CA as a BuildKit secret)
from the same build context (`ngcx render cuda:24.05 --base offline --context`: ngcx-runtime/ and
the image's tests/), FROM the same local base (ngcx/base:bookworm) and the same wheel source:
  ngcx   the Dockerfile `ngcx render` writes (what `ngcx build` builds)
  hpccm  `hpccm --recipe` on bench/suites/peers.py's recipe for the same release, given the CA secret
  naive  bench/naive/cuda.Dockerfile: one stage, the app copied before one big pip install
Figures: cold build (no layer cache), rebuild after editing one app file (a module of
ngcx-runtime), rebuild after a patch change of one pin (nvidia-cuda-runtime-cu12 12.4.127 ->
12.4.99), image size, layer count, and the bytes each tool's cuda:24.05 image shares with its
pytorch:24.11 image (same CUDA stack). Repetitions are interleaved tool by tool.

Everything this suite tags is `ngcx-bench/*`, and it removes only the images it built.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from ..core import ROOT, Measurement, Ratio, Stats, SuiteResult, SuiteSkipped, ensure_package, ratio, script
from .build_cache import download_cache_records, removable_records, run_markers
from .peers import RECIPES, adapt_for_build, write_hpccm_recipe

REF = "cuda:24.05"
SECOND = "pytorch:24.11"          # the framework image on the same CUDA stack (12.4, cuDNN 9.1.0.70, NCCL 2.21.5)
BASE = "ngcx/base:bookworm"
TOOLS = ("ngcx", "hpccm", "naive")
TAG_PREFIX = "ngcx-bench/"
APP_FILE = "ngcx-runtime/ngcx_runtime/info.py"
PIN, PATCHED = "nvidia-cuda-runtime-cu12==12.4.127", "nvidia-cuda-runtime-cu12==12.4.99"


class Bump(NamedTuple):
    """A patch bump timed. The CUDA runtime's is the one every earlier run timed; it is ngcx's last wheel layer
    (registry.yaml lists a stack's pins in layer order). cuBLAS is ngcx's first wheel layer, so its bump is ngcx's
    worst case: every wheel layer rebuilds, each with its own pip start."""

    key: str
    label: str
    pin: str
    patched: str
    where: str        # how the notes name it


BUMPS = (Bump("bump", "rebuild after a patch bump", PIN, PATCHED, "the CUDA runtime's pin (ngcx's last wheel layer)"),
         Bump("bump-first", "rebuild after a patch bump of the first wheel", "nvidia-cublas-cu12==12.4.5.8",
              "nvidia-cublas-cu12==12.4.2.65", "cuBLAS's pin (ngcx's first wheel layer)"))
NAIVE = ROOT / "bench" / "naive"
# ngcx's bottom layers that hold the CUDA stack and nothing image-specific: base, OS packages, venv, one layer per
# CUDA wheel (4) and the stack's pins file (recipes/cuda.j2).
STACK_LAYERS = 8
EMPTY_INSTRUCTIONS = re.compile(
    r"^(/bin/sh -c #\(nop\) )?\s*(ENV|LABEL|ARG|CMD|ENTRYPOINT|EXPOSE|SHELL|USER|VOLUME|STOPSIGNAL|HEALTHCHECK|"
    r"ONBUILD|MAINTAINER)\b")


# ----------------------------------------------------------------------------- pure helpers (unit-tested)


def patch_bump(dockerfile: str, round_: int, pin: str = PIN, patched: str = PATCHED) -> str:
    """The Dockerfile with `pin` changed to `patched`, as a catalog edit would render it.

    Why the `.0` suffixes: a repeated measurement must rebuild each time, but the second build of
    the same text would hit the layer cache. `==12.4.99.0` is the same requirement to pip (PEP 440
    pads release segments with zeros) in a different line, so round k rebuilds exactly what the
    first bump did."""
    if pin not in dockerfile:
        raise ValueError(f"{pin} is not in this Dockerfile: nothing to bump")
    return dockerfile.replace(pin, patched + ".0" * round_)


def fresh_cache(dockerfile: str, nonce: str) -> str:
    """The Dockerfile with `ARG NGCX_BENCH_PAIR=nonce` after each FROM: every RUN after it misses the
    layer cache (an ARG is in every later RUN's environment, so in its cache key) and nothing else changes.

    Why: the bytes two images share depend on which cache records their builds reuse. After the timed
    --no-cache rounds the engine holds several records for the same steps, and BuildKit picks the one
    under the deepest cached chain, which for the second image can be a record from another build than
    the first image's (measured: 1 shared layer where `ngcx build` REF then SECOND shares 4). The same
    nonce in both files of a pair makes it what a user gets from an empty cache: REF, then SECOND."""
    return re.sub(r"(?m)^(FROM .*)$", rf"\1\nARG NGCX_BENCH_PAIR={nonce}", dockerfile)


def layer_sizes(history: list[dict[str, Any]], n_layers: int) -> list[int] | None:
    """Bytes of each layer, bottom first, from the engine's image history (newest entry first).

    Why history: the engine reports a size per history entry and no size per layer. An entry that
    made no layer (ENV, LABEL, ...) has size 0 and an instruction name that says so; the others map
    one to one onto RootFS.Layers. None when the count does not match (a history we cannot map
    is not guessed at)."""
    sizes = []
    for entry in reversed(history):
        created_by = (entry.get("CreatedBy") or "").strip()
        if entry.get("Size", 0) > 0 or not EMPTY_INSTRUCTIONS.match(created_by):
            sizes.append(int(entry.get("Size", 0)))
    return sizes if len(sizes) == n_layers else None


def chain_ids(diff_ids: list[str]) -> list[str]:
    """The engine's id of each layer with everything under it (OCI ChainID), bottom first."""
    import hashlib

    out: list[str] = []
    for diff_id in diff_ids:
        out.append(diff_id if not out else "sha256:" + hashlib.sha256(f"{out[-1]} {diff_id}".encode()).hexdigest())
    return out


def shared_bytes(layers_a: list[str], sizes_a: list[int], layers_b: list[str]) -> int:
    """Bytes of A's layers that B reuses: the common bottom run of layer digests (a layer is only the
    same stored or pulled layer when everything under it is the same too)."""
    shared = 0
    for digest_a, digest_b, size in zip(layers_a, layers_b, sizes_a, strict=False):
        if digest_a != digest_b:
            break
        shared += size
    return shared


def edit_app_file(context: Path, round_: int) -> None:
    """A one-line code edit in the app (a new comment in one ngcx-runtime module)."""
    with (context / APP_FILE).open("a") as f:
        f.write(f"# bench edit {round_}\n")


# ----------------------------------------------------------------------------- the engine


@dataclass
class Engine:
    """The docker CLI that drives BuildKit, the CA secret, and what this run made, so that it can remove
    exactly that: its images (tagged ngcx-bench/*) and the build-cache records only they used.

    Why the records too: with the engine's BuildKit, a layer stays on disk in the build cache after
    its image is removed, and every cold build or pin bump writes ~2 GB of new layers. Nine of each
    would fill this shared disk, so each one is removed as soon as it is measured."""

    cli: str
    ca: str
    before: set[str] = field(default_factory=set)      # build-cache record ids present before this run
    markers: set[str] = field(default_factory=set)     # the RUN commands of the Dockerfiles built
    made: set[str] = field(default_factory=set)
    tags: set[str] = field(default_factory=set)

    def build(self, dockerfile: Path, context: Path, tag: str, no_cache: bool = False) -> float:
        """Build and tag; wall seconds (the work happens in the engine, so there is no client CPU to speak of)."""
        if not tag.startswith(TAG_PREFIX):
            raise ValueError(f"bench images are tagged {TAG_PREFIX}*, not {tag}")
        check_disk(self.root())
        self.markers.update(run_markers(dockerfile.read_text()))
        old = self._image_id(tag)
        cmd = [self.cli, "build", "--progress", "plain", "--secret", f"id=ca,src={self.ca}",
               "-f", str(dockerfile), "-t", tag, *(["--no-cache"] if no_cache else []), str(context)]
        start = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "DOCKER_BUILDKIT": "1"},
                              timeout=3600)
        wall = time.perf_counter() - start
        if proc.returncode != 0:
            raise RuntimeError(f"build of {dockerfile.name} failed: {proc.stderr.strip()[-800:]}")
        self.tags.add(tag)
        self.made.add(self.inspect(tag)["Id"])
        if old and old != self._image_id(tag):
            self._remove_if_untagged(old)
        return wall

    def discard(self, tag: str) -> None:
        """Remove one of this run's images and the build-cache records nothing else uses any more."""
        image = self._image_id(tag)
        subprocess.run([self.cli, "rmi", tag], capture_output=True)
        self.tags.discard(tag)
        if image:
            self._remove_if_untagged(image)
        self.prune_records()

    def cleanup(self) -> None:
        """Remove this run's tags, the images it made that no tag names any more (never -f, never an
        image another helper or test tagged), then the cache records only they used."""
        for image_tag in sorted(self.tags):
            subprocess.run([self.cli, "rmi", image_tag], capture_output=True)
        self.tags.clear()
        for image in sorted(self.made):
            self._remove_if_untagged(image)
        self.prune_records()

    def prune_records(self) -> None:
        self._prune(lambda records: removable_records(records, self.before, self.markers))

    def empty_download_caches(self) -> None:
        """A cold build downloads every wheel: no pool, no pip cache (download_cache_records says why)."""
        self._prune(download_cache_records)

    def _prune(self, removable: Callable[[list[dict[str, Any]]], list[str]]) -> None:
        """Remove the build-cache records `removable` picks from the engine's list, leaf first: a record's
        parent is only free once its children are gone, so the list is read again after each pass."""
        import docker

        client = docker.from_env()
        try:
            for _ in range(12):
                ids = removable(client.df().get("BuildCache") or [])
                if not ids:
                    return
                for record in ids:
                    client.api.prune_builds(filters={"id": [record]})
        finally:
            client.close()

    def snapshot(self) -> None:
        import docker

        client = docker.from_env()
        try:
            self.before = {r["ID"] for r in client.df().get("BuildCache") or []}
        finally:
            client.close()

    def root(self) -> str:
        return subprocess.run([self.cli, "info", "--format", "{{.DockerRootDir}}"], capture_output=True,
                              text=True).stdout.strip() or "/var/lib/docker"

    def _image_id(self, ref: str) -> str | None:
        proc = subprocess.run([self.cli, "image", "inspect", "--format", "{{.Id}}", ref], capture_output=True,
                              text=True)
        return proc.stdout.strip() if proc.returncode == 0 else None

    def _remove_if_untagged(self, image: str) -> None:
        if image not in self.made:
            return
        proc = subprocess.run([self.cli, "image", "inspect", "--format", "{{len .RepoTags}}", image],
                              capture_output=True, text=True)
        if proc.returncode == 0 and proc.stdout.strip() == "0":
            subprocess.run([self.cli, "rmi", image], capture_output=True)

    def inspect(self, tag: str) -> dict[str, Any]:
        import json

        out = subprocess.run([self.cli, "image", "inspect", tag], capture_output=True, text=True, check=True).stdout
        return json.loads(out)[0]

    def history(self, tag: str) -> list[dict[str, Any]]:
        import docker

        client = docker.from_env()
        try:
            return client.api.history(tag)
        finally:
            client.close()

    def layerdb_sizes(self, info: dict[str, Any]) -> list[int] | None:
        """Per-layer sizes from the engine's own layer store, where this process can read it (a local
        engine, as root): the fallback when the history does not map onto the layers."""
        store = Path(self.root()) / "image" / info["GraphDriver"]["Name"] / "layerdb" / "sha256"
        try:
            return [int((store / c.removeprefix("sha256:") / "size").read_text())
                    for c in chain_ids(info["RootFS"]["Layers"])]
        except (OSError, ValueError):
            return None


MIN_FREE_GB = 12


def check_disk(root: str) -> None:
    """Refuse to build with less than MIN_FREE_GB free where the engine keeps its layers: the disk is
    shared with other work, and a pytorch image is ~6 GB."""
    try:
        free = shutil.disk_usage(root).free
    except OSError:
        return  # a remote engine: its disk is not ours to see
    if free < MIN_FREE_GB * 1e9:
        raise SuiteSkipped(f"only {free / 1e9:.0f} GB free under {root}: the build suite needs {MIN_FREE_GB} GB")


def open_engine(cls: type[Engine] = Engine, **fields: Any) -> Engine:
    """The docker CLI able to build with BuildKit and this machine's CA bundle, as every build suite needs
    (build, project), or SuiteSkipped with the reason."""
    from ngcx.build.image import CA_ENV_VARS
    from ngcx.core.engine import docker_cli

    cli = docker_cli()
    if cli is None:
        raise SuiteSkipped("no docker CLI able to build with BuildKit (see `ngcx doctor`)")
    info = subprocess.run([cli, "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True)
    if info.returncode != 0:
        raise SuiteSkipped(f"no Docker engine: {info.stderr.strip()[-200:]}")
    ca = next((os.environ[v] for v in CA_ENV_VARS if os.environ.get(v) and Path(os.environ[v]).is_file()),
              "/etc/ssl/certs/ca-certificates.crt")
    return cls(cli=cli, ca=ca, **fields)


def _engine() -> Engine:
    engine = open_engine()
    if subprocess.run([engine.cli, "image", "inspect", BASE], capture_output=True).returncode != 0:
        raise SuiteSkipped(f"base image {BASE} is not here: run `ngcx base bootstrap` (README set-up)")
    return engine


# ----------------------------------------------------------------------------- inputs


def prepare(ref: str, work: Path, out: Path) -> tuple[Path, dict[str, Path]]:
    """The shared build context and each tool's Dockerfile for `ref` (Dockerfiles kept outside the
    context, so the naive `COPY .` never sees another tool's file change)."""
    name = ref.replace(":", "-")
    context, files = work / f"{name}-context", work / f"{name}-dockerfiles"
    files.mkdir(parents=True)
    subprocess.run([script("ngcx"), "render", ref, "--base", "offline", "--context", str(context)],
                   check=True, capture_output=True, text=True)
    ngcx_file = files / "ngcx.Dockerfile"
    shutil.move(context / "Dockerfile", ngcx_file)
    recipe = write_hpccm_recipe(ref, base="offline")
    rendered = subprocess.run([script("hpccm"), "--recipe", str(recipe)], capture_output=True, text=True, check=True)
    (files / "hpccm.Dockerfile").write_text(adapt_for_build(rendered.stdout))
    naive = NAIVE / f"{ref.split(':')[0]}.Dockerfile"
    if not naive.read_text().startswith(f"# ngcx-release: {ref} "):
        raise SuiteSkipped(f"{naive.relative_to(ROOT)} does not mirror {ref}")
    shutil.copy(naive, files / "naive.Dockerfile")
    return context, {tool: files / f"{tool}.Dockerfile" for tool in TOOLS}


def tag(tool: str, ref: str, what: str = "") -> str:
    return f"{TAG_PREFIX}{tool}-{ref.split(':')[0]}:{ref.split(':')[1]}{'-' + what if what else ''}"


# ----------------------------------------------------------------------------- the suite


def run(result: SuiteResult, work: Path, out: Path) -> None:
    """Fill result with the build figures, the ngcx / hpccm and ngcx / naive ratios, and why ngcx loses where
    it does."""
    ensure_package("hpccm", "hpccm")
    engine = _engine()
    check_disk(engine.root())
    engine.snapshot()
    try:
        _measure(result, engine, work, out)
    finally:
        engine.cleanup()


def _measure(result: SuiteResult, engine: Engine, work: Path, out: Path) -> None:
    context, files = prepare(REF, work, out)
    print(f"bench build: warm-up builds of {REF} ...", file=sys.stderr)
    for tool in TOOLS:                                   # fills the layer cache the rebuilds start from
        engine.build(files[tool], context, tag(tool, REF))
    times: dict[str, dict[str, list[float]]] = {k: {t: [] for t in TOOLS}
                                                for k in ("cold", "edit", *(b.key for b in BUMPS))}
    for round_ in range(1, result.repeat + 1):
        print(f"bench build: round {round_}/{result.repeat}", file=sys.stderr)
        engine.empty_download_caches()  # once: only ngcx's steps read them, and its cold build refills them
        for tool in TOOLS:
            times["cold"][tool].append(engine.build(files[tool], context, tag(tool, REF, "cold"), no_cache=True))
            engine.discard(tag(tool, REF, "cold"))
        edit_app_file(context, round_)
        for tool in TOOLS:
            times["edit"][tool].append(engine.build(files[tool], context, tag(tool, REF)))
        for key, _, pin, patched, _ in BUMPS:
            for tool in TOOLS:
                bumped = files[tool].with_name(f"{tool}-{key}{round_}.Dockerfile")
                bumped.write_text(patch_bump(files[tool].read_text(), round_ - 1, pin, patched))
                times[key][tool].append(engine.build(bumped, context, tag(tool, REF, key)))
                engine.discard(tag(tool, REF, key))
    images = {tool: _image(engine, tag(tool, REF)) for tool in TOOLS}
    print(f"bench build: {SECOND} with each tool (shared bytes) ...", file=sys.stderr)
    context2, files2 = prepare(SECOND, work, out)
    seconds: dict[str, dict[str, Any]] = {}
    missing = ""
    try:
        nonce = secrets.token_hex(4)
        for tool in TOOLS:  # one at a time: a pytorch image is ~6 GB
            # The pair is built as a user with an empty layer cache builds it: REF, then SECOND (fresh_cache).
            first, second = (f.with_name(f"{tool}-pair-{n}.Dockerfile")
                             for n, f in enumerate((files[tool], files2[tool])))
            first.write_text(fresh_cache(files[tool].read_text(), nonce))
            second.write_text(fresh_cache(files2[tool].read_text(), nonce))
            pair = _image(engine, tag(tool, REF, "pair"), build=(first, context))
            seconds[tool] = {**_image(engine, tag(tool, SECOND), build=(second, context2)), "pair": pair}
            engine.discard(tag(tool, SECOND))
            engine.discard(tag(tool, REF, "pair"))
    except (SuiteSkipped, RuntimeError) as exc:  # the timings above stand without this figure
        seconds, missing = {}, f"Bytes shared with {SECOND} not measured in this run: {exc}"
    result.measurements = _figures(times, images, seconds, files)
    result.ratios = _ratios(result.measurements)
    stack = sum((images["ngcx"]["layer_sizes"] or [])[:STACK_LAYERS])
    common = common_layers(seconds["ngcx"]["pair"]["diff_ids"], seconds["ngcx"]["diff_ids"]) if seconds else None
    parting = first_difference(files["ngcx"].read_text(), files2["ngcx"].read_text())
    result.notes = notes(result.measurements, stack, common, parting) + ([missing] if missing else [])
    result.extra.update(
        ref=REF, second=SECOND, base=BASE, app_file=APP_FILE, bumps={b.key: f"{b.pin} -> {b.patched}" for b in BUMPS},
        ngcx_stack_bytes=stack, ngcx_common_layers=common, ngcx_parting_line=parting,
        hpccm_recipe=os.path.relpath(RECIPES / f"hpccm-{REF.replace(':', '-')}-offline.py", ROOT),
        naive_dockerfile=os.path.relpath(NAIVE / f"{REF.split(':')[0]}.Dockerfile", ROOT),
        images={tool: {k: v for k, v in images[tool].items() if k != "diff_ids"} for tool in TOOLS},
        second_images={tool: {k: v for k, v in d.items() if k not in ("diff_ids", "pair")}
                       for tool, d in seconds.items()},
        docker_server=subprocess.run([engine.cli, "version", "--format", "{{.Server.Version}}"],
                                     capture_output=True, text=True).stdout.strip())


def _image(engine: Engine, image_tag: str, build: tuple[Path, Path] | None = None) -> dict[str, Any]:
    """Size, layers and per-layer sizes of an image (built first when `build` = (Dockerfile, context))."""
    if build:
        engine.build(build[0], build[1], image_tag)
    info = engine.inspect(image_tag)
    diff_ids = info["RootFS"]["Layers"]
    sizes = layer_sizes(engine.history(image_tag), len(diff_ids)) or engine.layerdb_sizes(info)
    return {"tag": image_tag, "size": info["Size"], "layers": len(diff_ids), "diff_ids": diff_ids,
            "layer_sizes": sizes}


def _figures(times: dict[str, dict[str, list[float]]], images: dict[str, dict[str, Any]],
             seconds: dict[str, dict[str, Any]], files: dict[str, Path]) -> list[Measurement]:
    what = {"cold": ("cold build", "no layer cache (--no-cache)"),
            "edit": ("rebuild after editing one app file", f"one comment line added to {APP_FILE}"),
            **{b.key: (b.label, f"{b.pin} -> {b.patched}") for b in BUMPS}}
    ms = []
    for key, (label, note) in what.items():
        for tool in TOOLS:
            ms.append(Measurement(name=f"{tool}: {label}", tool=tool, unit="s", better="lower",
                                  wall=Stats.of(times[key][tool]), command=_shown(files[tool]), note=note))
    for tool in TOOLS:
        ms.append(Measurement(name=f"{tool}: image size", tool=tool, unit="bytes", better="lower",
                              wall=Stats.of([images[tool]["size"]]), command=_shown(files[tool]),
                              note="docker image inspect .Size (uncompressed)"))
    for tool in TOOLS:
        ms.append(Measurement(name=f"{tool}: layers", tool=tool, unit="layers", better="lower",
                              wall=Stats.of([images[tool]["layers"]]), command=_shown(files[tool])))
    for tool in TOOLS if seconds else ():
        pair = seconds[tool].get("pair", images[tool])
        sizes = pair["layer_sizes"]
        if sizes is None:
            continue  # history that does not map onto layers: no figure rather than a guess
        shared = shared_bytes(pair["diff_ids"], sizes, seconds[tool]["diff_ids"])
        ms.append(Measurement(name=f"{tool}: bytes shared with its {SECOND}", tool=tool, unit="bytes",
                              better="higher", wall=Stats.of([shared]), command=_shown(files[tool]),
                              note=f"common bottom layers of {REF} and {SECOND} built one after the other "
                                   f"from an empty layer cache ({seconds[tool]['size'] / 1e9:.2f} GB)"))
    return ms


def _shown(dockerfile: Path) -> str:
    return f"docker build -f {dockerfile.name} CONTEXT"


def _ratios(ms: list[Measurement]) -> list[Ratio]:
    by = {m.name: m for m in ms}
    out = []
    for label in ("rebuild after editing one app file", "cold build", *(b.label for b in BUMPS), "image size",
                  f"bytes shared with its {SECOND}"):
        for peer in ("hpccm", "naive"):
            num, den = by.get(f"ngcx: {label}"), by.get(f"{peer}: {label}")
            if num and den and den.wall.median:
                out.append(ratio(f"{label}: ngcx / {peer}", num, den))
    return out


def first_difference(a: str, b: str) -> str | None:
    """The first instruction line of Dockerfile `b` that differs from `a` (comments skipped), or None."""
    def lines(text: str) -> list[str]:
        return [ln.rstrip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]

    for line_a, line_b in zip(lines(a), lines(b), strict=False):
        if line_a != line_b:
            return line_b.strip()
    return None


def sharing_notes(shared: dict[str, float], stack_bytes: float, common: int | None, parting: str | None) -> list[str]:
    """What REF and SECOND share with each tool, and why, from this run's figures: a note when ngcx shares
    its whole CUDA stack (at least STACK_LAYERS bottom layers) or when it shares less than a peer."""
    figures = (f"Shared with {SECOND}: ngcx {shared['ngcx'] / 1e6:,.0f} MB, hpccm {shared['hpccm'] / 1e6:,.0f} MB, "
               f"naive {shared['naive'] / 1e6:,.0f} MB.")
    peers = ("hpccm's recipe (bench/suites/peers.py, as a user of its apt_get building block writes it) installs the "
             "framework's OS packages in its one apt layer before the CUDA wheels, so its two images part there "
             "and share the base only; naive installs one apt set for every image, then copies each image's own "
             "app before its one pip install, so it shares base and apt layer and stores the CUDA stack twice.")
    if common is not None and common >= STACK_LAYERS:
        from ngcx.render.recipe import image_packages, load_recipe

        own = ", ".join(image_packages(load_recipe(SECOND.split(":")[0]))) or "none"
        return [f"{figures} ngcx's two images share their bottom {common} layers: the base, OS packages, venv and "
                f"CUDA wheels of {REF} ({stack_bytes / 1e9:.2f} GB), stored and pulled once for every image on the "
                f"stack, since an image's own OS packages ({SECOND}'s: {own}) get a layer of their own after the "
                f"CUDA wheels (recipes/packages.j2). {peers}"]
    if shared["ngcx"] < max(shared["hpccm"], shared["naive"]):
        return [f"{figures} ngcx's two images share their bottom {common} layer(s) only, not the {STACK_LAYERS} "
                f"that hold the CUDA stack: the first line where ngcx's {SECOND} Dockerfile differs from its {REF} "
                f"one is `{(parting or '?')[:90]}`. ngcx's recipes install an image's own OS packages after the "
                "CUDA wheels (tests/unit/test_render.py checks every stack in the catalog), so an image-specific line "
                f"before the CUDA layer is a regression there; fixed, the base, apt, venv and CUDA layers of {REF} "
                f"({stack_bytes / 1e9:.2f} GB) are shared by every image on the stack. {peers}"]
    return []


def common_layers(a: list[str], b: list[str]) -> int:
    """How many bottom layers two images share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def notes(ms: list[Measurement], stack_bytes: float, common: int | None, parting: str | None) -> list[str]:
    """Why ngcx wins or loses each figure, from this run's numbers, and what would fix a loss.

    `stack_bytes`: the bytes of ngcx's base, apt, venv and CUDA layers of REF; `common`: how many bottom
    layers ngcx's REF and SECOND images share; `parting`: the first line where their Dockerfiles differ."""
    by = {m.name: m for m in ms}
    med = {name: m.wall.median for name, m in by.items()}
    layers = {t: int(med.get(f"{t}: layers", 0)) for t in TOOLS}
    same = "the same steps in the same order" if layers["ngcx"] == layers["hpccm"] else "see bench/suites/peers.py"
    out = [f"Same context, base ({BASE}), wheel source (PyPI through this machine's proxy, CA as a BuildKit "
           f"secret) and engine for all three; a figure is the median of the rounds, tools interleaved. Layers: "
           f"ngcx {layers['ngcx']}, hpccm {layers['hpccm']} ({same}), naive {layers['naive']}."]
    edit = {t: med[f"{t}: rebuild after editing one app file"] for t in TOOLS}
    out.append(f"App edit: ngcx {edit['ngcx']:.1f} s, hpccm {edit['hpccm']:.1f} s, naive {edit['naive']:.1f} s. "
               "ngcx and hpccm copy the app after the heavy wheels, so only the ngcx-runtime install and the "
               "layers after it rebuild; the naive file copies the app before its one pip install, so every "
               "edit reinstalls the whole CUDA stack.")
    losses = []
    for label in ("cold build", "rebuild after editing one app file", *(b.label for b in BUMPS)):
        ours, peer = by[f"ngcx: {label}"], by[f"hpccm: {label}"]
        if ours.wall.median > peer.wall.median:
            spread = "ranges overlap" if ours.wall.overlaps(peer.wall) else "ranges apart"
            losses.append(f"{label} by {ours.wall.median / peer.wall.median - 1:.0%} ({spread})")
    if losses:
        out.append("ngcx is slower than hpccm on " + "; ".join(losses) + ". What ngcx's steps do on top of "
                   "hpccm's: one pip start per CUDA wheel layer (4 against hpccm's one install: the price of a "
                   "bump that rebuilds one wheel), each a `pip download` into the wheel pool then an install from "
                   "it (a cold build starts with the pool emptied, so it downloads every wheel as hpccm does); "
                   "and the pins check (python-version check, pins file, pip check, stripping the wheels' "
                   "headers and static libraries, ldconfig). Where the ranges overlap it is within this machine's "
                   "noise.")
    timed = "; ".join(f"{b.where} ngcx {med[f'ngcx: {b.label}']:.1f} s, hpccm {med[f'hpccm: {b.label}']:.1f} s, "
                      f"naive {med[f'naive: {b.label}']:.1f} s" for b in BUMPS)
    out.append(f"Patch bumps: {timed}. hpccm and naive install the whole stack in one pip step, so any bump "
               "reinstalls all of it; ngcx installs one wheel per layer in the catalog's order (recipes/cuda.j2; "
               "registry.yaml lists a wheel after those it requires, then the largest first), so a bump reinstalls "
               "the bumped wheel and those after it: the runtime's 1 MB wheel alone, or for cuBLAS every wheel, each "
               "with its own pip start; only the bumped wheel is downloaded, the others come from the wheel pool "
               "(a BuildKit cache mount: recipes/macros.j2 `pool_install`), where hpccm's `pip --no-cache-dir` "
               "downloads the whole stack again.")
    key = f"bytes shared with its {SECOND}"
    if all(f"{t}: {key}" in med for t in TOOLS):
        out += sharing_notes({t: med[f"{t}: {key}"] for t in TOOLS}, stack_bytes, common, parting)
    size = {t: med[f"{t}: image size"] for t in TOOLS}
    out.append(f"Size: ngcx {size['ngcx'] / 1e9:.3f} GB, hpccm {size['hpccm'] / 1e9:.3f} GB, naive "
               f"{size['naive'] / 1e9:.3f} GB. ngcx and hpccm both install into a venv with apt's recommends off "
               "and no pip cache in a layer; ngcx also strips the wheels' headers and static libraries, which "
               "saves only a few MB on this CUDA stack. The naive file's apt with recommends and pip cache are "
               "the difference.")
    return out
