"""project: an `ngcx.yaml` project vs the same model + code in a hand-written Dockerfile, on the same engine.

Both projects hold the same files: an ONNX MLP of about MODEL_MB MB (model.onnx), a handler
(handler.py) and requirements.txt (`six`), on the catalog release REF (ngcx/onnxruntime:25.08-runtime,
which must be built: `ngcx build onnxruntime:25.08`):
  ngcx   ngcx.yaml in the folder, `ngcx build` (the user's command; what they wait for is the whole process)
  naive  bench/naive/project.Dockerfile copied in as ./Dockerfile, `docker build .` FROM the same image:
         COPY . /app, pip install -r requirements.txt, CMD serve (how a user writes it)
Each repetition starts a fresh pair of folders (a new BuildKit context, a new project name) and times
  cold     a build without the layer cache (--no-cache)
  code     handler.py edited (one comment line)
  model    a new model file (new weights, same shape: a retrained model)
  package  one more pure-Python package in requirements.txt (a different one each repetition)
then the image size and the bytes each image adds on top of the base. Every edit is unique to the
run and the repetition (a random run token in the handler and the model's seed), so no step is served
from an earlier repetition's or run's cache; the two tools alternate which builds first. Once per run,
untimed, both images are started and answer one KServe v2 inference, and the outputs must agree: the
comparison is of two working images. Both build through the same docker CLI and engine (BuildKit).

Everything this suite builds is removed at the end: the images, and the build-cache records only they used.
"""

from __future__ import annotations

import os
import secrets
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core import ROOT, SuiteResult, SuiteSkipped, script
from .build import NAIVE, TAG_PREFIX, Engine, check_disk, open_engine, run_markers
from .project_figures import (
    BASE_TAG,
    CASES,
    TOOLS,
    added_layers,
    engine_seconds,
    figures,
    median_steps,
    ngcx_steps,
    notes,
    plain_steps,
    project_records,
    ratios,
    wheels_step_cached,
)

REF = "onnxruntime:25.08"
MODEL_MB = 100
MODEL_NAME = "mlp"
FEATURES, CLASSES = 32, 10
PACKAGES = ("six",)
# Small pure-Python wheels with no dependencies that the base does not ship: one per repetition, so an
# added package is never the one an earlier repetition installed (its wheels layer would be cached).
ADDED = ("idna", "attrs", "toml", "iniconfig", "pyparsing", "tabulate", "decorator", "pluggy", "more-itertools",
         "certifi")
NAIVE_FILE = NAIVE / "project.Dockerfile"
READY_S = 180


# ----------------------------------------------------------------------------- pure helpers (unit-tested)


def hidden_units(mb: float) -> int:
    """Hidden units that make the MLP about `mb` MB: each holds FEATURES + 1 + CLASSES float32 weights."""
    return max(64, int(mb * 1e6 / (4 * (FEATURES + 1 + CLASSES))))


def project_yaml(name: str) -> str:
    """The ngcx.yaml: the same model, handler and requirements.txt the hand-written Dockerfile uses."""
    return (f"name: {name}\nbase: \"{REF}\"\nrequirements: requirements.txt\n"
            f"model: {{path: model.onnx, name: {MODEL_NAME}}}\nhandler: handler:Handler\n")


def handler_source(token: str) -> str:
    """The handler both images serve; `token` (the run and repetition) makes its bytes unique."""
    return (f"# bench project {token}\nclass Handler:\n    def load(self, context):\n"
            "        self.engine = context.engine\n\n"
            "    def predict(self, inputs):\n        return self.engine.infer(inputs)\n")


def requirements(round_: int, token: str = "", added: bool = False) -> str:
    """requirements.txt of repetition `round_` (1-based): PACKAGES, plus that repetition's own extra one.

    Why `!=0.0.N` on the added package (N from the run's token): its wheels layer must be new to this run,
    and BuildKit keys that layer on the file's text; a layer from an earlier run (or a test) that added the
    same package on the same base would be reused. Excluding a version never released is the same
    requirement to pip in a line no earlier run wrote."""
    if not added:
        return "".join(f"{p}\n" for p in PACKAGES)
    if not 1 <= round_ <= len(ADDED):
        raise ValueError(f"repetition {round_}: only {len(ADDED)} distinct packages to add (ADDED)")
    return "".join(f"{p}\n" for p in PACKAGES) + f"{ADDED[round_ - 1]}!=0.0.{int(token, 16)}\n"


def round_order(round_: int) -> tuple[str, ...]:
    """Which tool builds first in a repetition: alternating, so neither always meets a warmer engine."""
    return TOOLS if round_ % 2 else TOOLS[::-1]


# ----------------------------------------------------------------------------- the engine


@dataclass
class ProjectEngine(Engine):
    """build.Engine (same CLI, same CA secret, same tag rules) that also removes the contexts and the COPY
    layers under a RUN which a project build leaves in the build cache (see project_records)."""

    min_source_bytes: int = 0

    def prune_records(self) -> None:
        import docker

        client = docker.from_env()
        try:
            targets = set(project_records(client.df().get("BuildCache") or [], self.before, self.markers,
                                          self.min_source_bytes))
        finally:
            client.close()
        self._prune(lambda records: [r["ID"] for r in records
                                     if r["ID"] in targets and not r.get("Shared") and not r.get("InUse")])

    def build_logged(self, folder: Path, tag: str, no_cache: bool) -> tuple[float, str]:
        """`docker build -t TAG .` in `folder` (its ./Dockerfile), as build.Engine.build does it (the CA
        secret, this run's tag and markers, the superseded image removed), keeping BuildKit's plain
        progress: wall seconds and that output."""
        if not tag.startswith(TAG_PREFIX):
            raise ValueError(f"bench images are tagged {TAG_PREFIX}*, not {tag}")
        check_disk(self.root())
        self.markers.update(run_markers((folder / "Dockerfile").read_text()))
        old = self._image_id(tag)
        cmd = [self.cli, "build", "--progress", "plain", "--secret", f"id=ca,src={self.ca}", "-t", tag,
               *(["--no-cache"] if no_cache else []), "."]
        start = time.perf_counter()
        proc = subprocess.run(cmd, cwd=folder, capture_output=True, text=True,
                              env={**os.environ, "DOCKER_BUILDKIT": "1"}, timeout=1800)
        wall = time.perf_counter() - start
        if proc.returncode != 0:
            raise RuntimeError(f"docker build in {folder} failed: {proc.stderr.strip()[-800:]}")
        self.adopt(tag)
        if old and old != self._image_id(tag):
            self._remove_if_untagged(old)
        return wall, proc.stderr

    def adopt(self, image_tag: str) -> None:
        """An image `ngcx build` made: this run removes it like its own."""
        self.tags.add(image_tag)
        self.made.add(self.inspect(image_tag)["Id"])


def _engine() -> ProjectEngine:
    engine = open_engine(ProjectEngine, min_source_bytes=int(MODEL_MB * 1e6 * 0.9))
    cli = engine.cli
    if subprocess.run([cli, "image", "inspect", BASE_TAG], capture_output=True).returncode != 0:
        # As `ngcx build` in a project would do itself; untimed, once, so a fresh machine runs the suite.
        print(f"bench: {BASE_TAG} is not built here: building it first (untimed)", file=sys.stderr, flush=True)
        built = subprocess.run([script("ngcx"), "build", REF, "--base", "offline"], capture_output=True, text=True)
        if built.returncode != 0:
            raise SuiteSkipped(f"could not build the projects' base {REF}: {built.stderr.strip()[-300:]}")
    return engine


# ----------------------------------------------------------------------------- the two projects


def write_model(path: Path, seed: int) -> None:
    """An MLP x[N, FEATURES] -> y[N, CLASSES] of about MODEL_MB MB, its weights drawn from `seed`."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng, hidden = np.random.default_rng(seed), hidden_units(MODEL_MB)

    def init(name: str, arr: Any) -> Any:
        return numpy_helper.from_array(arr.astype(np.float32), name)

    inits = [init("w1", rng.standard_normal((FEATURES, hidden), dtype=np.float32) * np.sqrt(2 / FEATURES)),
             init("b1", np.zeros(hidden)),
             init("w2", rng.standard_normal((hidden, CLASSES), dtype=np.float32) * np.sqrt(1 / hidden)),
             init("b2", rng.standard_normal(CLASSES) * 0.1)]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h0"]), helper.make_node("Add", ["h0", "b1"], ["h1"]),
             helper.make_node("Relu", ["h1"], ["h2"]), helper.make_node("MatMul", ["h2", "w2"], ["h3"]),
             helper.make_node("Add", ["h3", "b2"], ["y"])]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", FEATURES])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", CLASSES])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    tmp = path.with_name(f".{path.name}.tmp")
    onnx.save(model, str(tmp))
    os.replace(tmp, path)   # a new file, as an export writes one: never the bytes of the old one changed in place


@dataclass
class Pair:
    """One repetition's two project folders with the same files, and what their builds made."""

    token: str
    round_: int
    work: Path
    name: str = ""
    folders: dict[str, Path] = field(default_factory=dict)
    model_bytes: int = 0

    def __post_init__(self) -> None:
        self.name = f"ngcx-bench-{self.token}-{self.round_}"
        self.folders = {t: self.work / f"r{self.round_}" / t for t in TOOLS}

    @property
    def tags(self) -> dict[str, str]:
        return {"ngcx": f"ngcx-app/{self.name}:latest",
                "naive": f"{TAG_PREFIX}project-naive:{self.token}-{self.round_}"}

    def create(self) -> None:
        model = self.work / f"model-{self.round_}.onnx"
        write_model(model, self.seed(0))
        self.model_bytes = model.stat().st_size
        for folder in self.folders.values():
            folder.mkdir(parents=True)
            shutil.copyfile(model, folder / "model.onnx")
            (folder / "handler.py").write_text(handler_source(f"{self.token}-{self.round_}"))
            (folder / "requirements.txt").write_text(requirements(self.round_))
        (self.folders["ngcx"] / "ngcx.yaml").write_text(project_yaml(self.name))
        shutil.copyfile(NAIVE_FILE, self.folders["naive"] / "Dockerfile")
        model.unlink()

    def seed(self, k: int) -> int:
        return int(self.token, 16) * 1000 + self.round_ * 10 + k

    def edit(self, case: str) -> None:
        """The same edit (code, model or package) in both folders."""
        if case == "model":
            model = self.work / f"model-{self.round_}.onnx"
            write_model(model, self.seed(1))
            for folder in self.folders.values():
                shutil.copyfile(model, folder / ".model.onnx.new")
                os.replace(folder / ".model.onnx.new", folder / "model.onnx")
            model.unlink()
            return
        for folder in self.folders.values():
            if case == "code":
                with (folder / "handler.py").open("a") as f:
                    f.write(f"# edit {self.token}-{self.round_}\n")
            elif case == "package":
                (folder / "requirements.txt").write_text(requirements(self.round_, self.token, added=True))
            else:
                raise ValueError(f"no edit called {case!r}")


def ngcx_build(engine: ProjectEngine, pair: Pair, env: dict[str, str], no_cache: bool) -> tuple[float, str]:
    """Wall seconds of the whole `ngcx build` process in the project folder, and what it printed."""
    check_disk(engine.root())
    cmd = [script("ngcx"), "build", *(["--no-cache"] if no_cache else [])]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=pair.folders["ngcx"], env=env, capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - start
    output = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise RuntimeError(f"ngcx build of {pair.name} failed: {output.strip()[-800:]}")
    engine.adopt(pair.tags["ngcx"])
    dockerfile = Path(env["NGCX_STATE_DIR"]) / "projects" / pair.name / "context" / "Dockerfile"
    if dockerfile.is_file():   # its wheels RUN (not the mkdir every project shares) marks this run's records
        engine.markers.update(m for m in run_markers(dockerfile.read_text()) if not m.startswith("mkdir"))
    return wall, output


def serve_check(image_tag: str, inputs: dict[str, Any]) -> dict[str, Any]:
    """Start the image as a user would (`docker run -p`), wait until MODEL_NAME is ready, send one KServe v2
    inference, and remove the container: the outputs, or an error naming why the image does not serve."""
    import docker

    from ngcx.project.client import Client, wait_ready

    client = docker.from_env()
    container = client.containers.run(image_tag, detach=True, ports={"8000/tcp": ("127.0.0.1", None)},
                                      labels={"ngcx-bench": "project"})
    try:
        container.reload()
        port = container.attrs["NetworkSettings"]["Ports"]["8000/tcp"][0]["HostPort"]
        api = Client(f"http://127.0.0.1:{port}")

        def died() -> str | None:
            container.reload()
            if container.status not in ("exited", "dead"):
                return None
            return f"{image_tag} exited before it was ready: {container.logs(tail=5).decode(errors='replace')[-400:]}"

        wait_ready(api, MODEL_NAME, READY_S, died)
        out = api.infer(MODEL_NAME, inputs)
        api.close()
        return out
    finally:
        container.remove(force=True, v=True)
        client.close()


# ----------------------------------------------------------------------------- the suite


def run(result: SuiteResult, work: Path, out: Path) -> None:
    """Fill result with the project figures, the ngcx / hand-written ratios, and why ngcx wins or loses each."""
    if result.repeat > len(ADDED):
        raise SuiteSkipped(f"--repeat {result.repeat}: the package edit has only {len(ADDED)} distinct packages")
    engine = _engine()
    check_disk(engine.root())
    engine.snapshot()
    try:
        _measure(result, engine, work)
    finally:
        engine.cleanup()


@dataclass
class Tally:
    """What the repetitions measured: per case and tool the wall seconds and the step seconds, per case
    ngcx's client seconds (its process minus the engine build it reports), per tool the image sizes."""

    times: dict[str, dict[str, list[float]]] = field(default_factory=lambda: {c: {t: [] for t in TOOLS}
                                                                              for c in CASES})
    steps: dict[str, dict[str, list[dict[str, float]]]] = field(default_factory=lambda: {c: {t: [] for t in TOOLS}
                                                                                         for c in CASES})
    client: dict[str, list[float]] = field(default_factory=lambda: {c: [] for c in CASES})
    sizes: dict[str, list[int]] = field(default_factory=lambda: {t: [] for t in TOOLS})
    added: dict[str, list[int]] = field(default_factory=lambda: {t: [] for t in TOOLS})
    reports: list[dict[str, str]] = field(default_factory=list)

    def record(self, case: str, tool: str, wall: float, output: str) -> None:
        self.times[case][tool].append(wall)
        if tool == "naive":
            self.steps[case][tool].append(plain_steps(output))
            return
        self.steps[case][tool].append(ngcx_steps(output))
        reported = engine_seconds(output)
        if reported is not None:
            self.client[case].append(round(wall - reported, 3))
        if not self.reports or case == "cold":
            self.reports.append({})
        self.reports[-1][case] = _report_line(output)
        if case == "package" and wheels_step_cached(output):
            raise RuntimeError("ngcx's wheels step came from the layer cache after a package was added (an earlier "
                               "run's record): run `docker builder prune` and try again")

    def step_medians(self) -> dict[str, dict[str, dict[str, float]]]:
        return {c: {t: median_steps(self.steps[c][t]) for t in TOOLS} for c in CASES}

    def client_medians(self) -> dict[str, float]:
        return {c: round(statistics.median(v), 3) for c, v in self.client.items() if v}


def _measure(result: SuiteResult, engine: ProjectEngine, work: Path) -> None:
    token = secrets.token_hex(3)
    env = {**os.environ, "NGCX_STATE_DIR": str(work / "state"), "NGCX_BASE": "offline", "NGCX_DOCKER_CLI": engine.cli}
    base = engine.inspect(BASE_TAG)
    tally = Tally()
    layers: dict[str, list[tuple[str, int]]] = {}
    served: dict[str, Any] = {}
    print("bench project: warm-up builds (not timed) ...", file=sys.stderr)
    warm = Pair(token, 0, work)
    warm.create()
    for tool in TOOLS:
        _build(engine, warm, tool, env, no_cache=False)
        engine.discard(warm.tags[tool])
    for round_ in range(1, result.repeat + 1):
        print(f"bench project: round {round_}/{result.repeat}", file=sys.stderr)
        pair = Pair(token, round_, work)
        pair.create()
        for case in CASES:
            if case != "cold":
                pair.edit(case)
            for tool in round_order(round_):
                tally.record(case, tool, *_build(engine, pair, tool, env, no_cache=case == "cold"))
        for tool in TOOLS:
            info = engine.inspect(pair.tags[tool])
            tally.sizes[tool].append(int(info["Size"]))
            tally.added[tool].append(int(info["Size"]) - int(base["Size"]))
            if round_ == 1:
                layers[tool] = added_layers(engine.history(pair.tags[tool]), len(base["RootFS"]["Layers"]),
                                            len(info["RootFS"]["Layers"]))
        if round_ == 1:                                  # untimed: two working images, the same answers
            served = _serve_both(pair)
        for tool in TOOLS:
            engine.discard(pair.tags[tool])
        shutil.rmtree(work / f"r{round_}", ignore_errors=True)
    result.measurements = figures(tally.times, tally.sizes, tally.added)
    result.ratios = ratios(result.measurements)
    steps, client = tally.step_medians(), tally.client_medians()
    result.notes = notes(result.measurements, steps, client, layers, served, warm.model_bytes)
    result.extra.update(
        ref=REF, base=BASE_TAG, base_id=base["Id"], base_size=int(base["Size"]), model_bytes=warm.model_bytes,
        naive_dockerfile=os.path.relpath(NAIVE_FILE, ROOT), packages=list(PACKAGES),
        added_packages=list(ADDED[:result.repeat]), ngcx_reports=tally.reports, layers_added=layers,
        step_seconds_median=steps, ngcx_client_seconds=tally.client, serve_check=served,
        docker_server=subprocess.run([engine.cli, "version", "--format", "{{.Server.Version}}"],
                                     capture_output=True, text=True).stdout.strip())


def _build(engine: ProjectEngine, pair: Pair, tool: str, env: dict[str, str], no_cache: bool) -> tuple[float, str]:
    if tool == "ngcx":
        return ngcx_build(engine, pair, env, no_cache)
    return engine.build_logged(pair.folders["naive"], pair.tags["naive"], no_cache=no_cache)


def _report_line(output: str) -> str:
    return next((ln.strip() for ln in output.splitlines()
                 if ln.startswith(("rebuilding", "building every", "all layers"))), "")


def _serve_both(pair: Pair) -> dict[str, Any]:
    """Both images of one repetition serve the same model: one inference each, the outputs compared."""
    import numpy as np

    inputs = {"x": np.random.default_rng(0).standard_normal((1, FEATURES)).astype(np.float32)}
    outs = {}
    for tool in TOOLS:
        print(f"bench project: serve check of {pair.tags[tool]} ...", file=sys.stderr)
        outs[tool] = np.asarray(serve_check(pair.tags[tool], inputs)["y"])
    diff = float(np.abs(outs["ngcx"] - outs["naive"]).max())
    if outs["ngcx"].shape != (1, CLASSES) or diff > 1e-4 * max(1.0, float(np.abs(outs["ngcx"]).max())):
        raise RuntimeError(f"the two images answer differently: shapes {outs['ngcx'].shape} / {outs['naive'].shape}, "
                           f"max |diff| {diff:g}")
    return {"model": MODEL_NAME, "output_shape": list(outs["ngcx"].shape), "max_abs_diff": diff,
            "images": {t: pair.tags[t] for t in TOOLS}}


