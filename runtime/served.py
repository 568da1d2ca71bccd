"""The models one server serves: a ServedModel per (name, version), held in a ModelTable.

Why a table: `serve MODEL` is a table of one model fixed on the command line; `serve DIR` is a
Triton-style repository (repository.py) whose models load, reload and unload while the server
runs (the KServe v2 repository extension), each version with its own batcher and counters. A
model version is ready only after its load AND a warm-up inference (which also decides its batch
layout, layout.py). A broken model directory fails its own load with the reason; the models
already served keep serving, and a failed reload keeps the previous versions.

Locking: each model name has its own lock, so loads of different models do not wait for each
other; the hot path (lookup, submit) takes no lock: it reads dicts that loads replace whole.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .batching import Batcher, Stats
from .engine import Engine, TensorSpec
from .errors import RuntimeUserError
from .layout import BatchLayout, prepare, run_warmup, warmup_feeds
from .loading import LOADS
from .metrics import ModelSample
from .protocol import ProtocolError
from .protocol import peer_text as _peer
from .repository import ModelConfig, model_names, model_versions, read_config, valid_name

READY, LOADING, UNAVAILABLE = "READY", "LOADING", "UNAVAILABLE"
DEFAULT_MAX_BATCH = 256          # for engines without a bound of their own (max_batch == 0)
PLATFORMS = {"onnxruntime": "onnxruntime_onnx", "tensorrt": "tensorrt_plan", "pytorch": "pytorch_torchscript",
             "python": "python"}
LOG = Callable[[str], None]


class ServeError(RuntimeUserError):
    """A bad serve configuration (flags that contradict the engine); one line, exit 2."""


class NotFound(RuntimeUserError):
    """A model the repository does not have (404)."""


@dataclass(frozen=True)
class Settings:
    """Batching settings of one model: its config's, else the server's flags."""

    max_batch: int | None = None           # None: the engine's bound, else DEFAULT_MAX_BATCH
    max_queue_delay_ms: float = 1.0
    preferred: tuple[int, ...] = ()
    merge: bool = True                     # False: a config without dynamic_batching
    batched: bool = True                   # False: max_batch_size 0 in the config
    devices: tuple[int | str | None, ...] = (None,)   # one per instance: None (default device), GPU index, "cpu"

    def with_config(self, config: ModelConfig) -> Settings:
        if config.devices is not None:               # instance_group: the config's placement (KIND_AUTO: every GPU)
            from .placement import expand_config, host_visible_gpus

            visible = host_visible_gpus() if None in config.devices or "gpu" in config.devices else None
            self = replace(self, devices=expand_config(config.devices, visible) or config.devices)
        if config.dynamic_batching is None:          # no config file: the server's flags, merging on
            return self
        return replace(
            self, batched=config.max_batch_size != 0, merge=config.dynamic_batching,
            max_batch=config.max_batch_size or self.max_batch, preferred=config.preferred_batch_sizes,
            max_queue_delay_ms=(self.max_queue_delay_ms if config.max_queue_delay_ms is None
                                else config.max_queue_delay_ms))


def resolve_max_batch(engine: Engine, max_batch: int | None) -> int:
    """--max-batch, or the engine's own bound, or DEFAULT_MAX_BATCH; never above the engine's bound."""
    bound = engine.max_batch if engine.max_batch and engine.max_batch > 0 else 0
    if max_batch is None:
        max_batch = bound or DEFAULT_MAX_BATCH
    if bound and max_batch > bound:
        raise ServeError(f"--max-batch {max_batch} exceeds the engine's max batch {bound} (its optimization "
                         f"profile); use --max-batch {bound} or rebuild the plan with a larger profile")
    return max_batch


def _spec_json(s: TensorSpec) -> dict[str, Any]:
    return {"name": s.name, "datatype": s.datatype, "shape": list(s.shape)}


class ServedModel:
    """One model version: its engine (once loaded), batch layout, batcher and counters.

    Until attach() the version is loading (ready 503, inference 503); after fail() it never will
    be (same answers, with the reason); after close() (unload, reload) requests get 503.
    """

    def __init__(self, name: str, version: str, settings: Settings, stats: Stats | None = None,
                 log: LOG | None = None):
        self.name = name
        self.version = version
        self.settings = settings
        self.stats = stats if stats is not None else Stats()
        self.log = log or (lambda line: None)
        self.engine: Engine | None = None
        self.engines: list[Engine] = []           # every instance's engine (engine is the first)
        self.batcher: Batcher | None = None
        self.layout: BatchLayout | None = None
        self.max_batch = settings.max_batch or 0
        self.load_error: str | None = None
        self.closed: str | None = None
        self.loaded = threading.Event()           # set once attach() or fail() ran

    def attach(self, engine: Engine | list[Engine], layout: BatchLayout | None = None, warm: bool = True) -> None:
        """Warm the engine(s) up, decide the batch layout (on the first), start the batcher: serve from now on.

        Several engines are the model's instances (Triton's instance group): each gets one warm-up
        inference, so the first request on any of them is not the slow one."""
        engines = list(engine) if isinstance(engine, list) else [engine]
        first = engines[0]
        max_batch = resolve_max_batch(first, self.settings.max_batch)
        if layout is None:
            layout = prepare(first, max_batch, want_batch=self.settings.batched)
        if warm:
            for other in engines[1:]:
                target, feeds = warmup_feeds(other)
                if target is not None and feeds is not None:
                    run_warmup(target, feeds, other)
        if layout.merge and not self.settings.merge:
            layout = layout.unmerged("the model config has no dynamic_batching")
        self.max_batch = max_batch
        self.layout = layout
        self.batcher = Batcher(engines, max_batch, self.settings.max_queue_delay_ms, self.stats, layout.merge,
                               self.name, output_axes=layout.output_axes, preferred=self.settings.preferred,
                               on_unmerge=self._unmerged)
        self.engines = engines
        self.engine = first
        self.loaded.set()
        where = f"; {len(engines)} instances on {', '.join(sorted({e.device for e in engines}))}" \
            if len(engines) > 1 else ""
        self.log(f"serve: model '{self.name}' version {self.version}: {layout.describe()}{where}")

    def _unmerged(self, why: str) -> None:
        """The batcher found a merged batch that did not split and stopped merging (batching.py)."""
        if self.layout is not None:
            self.layout = self.layout.unmerged(why)
        self.log(f"serve: model '{self.name}' version {self.version}: {why}")

    def fail(self, error: str) -> None:
        """Loading failed: never ready; requests get the reason."""
        self.load_error = error
        self.loaded.set()

    def close(self, reason: str, timeout: float = 30.0) -> None:
        """Stop serving: queued requests still run, later ones get 503 with `reason`."""
        self.closed = reason
        if self.batcher is not None:
            self.batcher.stop(timeout, reason=reason)

    @property
    def ready(self) -> bool:
        return self.engine is not None and self.closed is None

    @property
    def state(self) -> str:
        if self.ready:
            return READY
        return LOADING if not self.loaded.is_set() else UNAVAILABLE

    @property
    def batched(self) -> bool:
        return self.layout is not None and self.layout.batched

    @property
    def pending(self) -> int:
        return self.batcher.pending if self.batcher is not None else 0

    def require_engine(self) -> Engine:
        """The engine, or 503 while it loads (or after it failed to, or was unloaded)."""
        if self.closed is not None:
            raise ProtocolError(self.closed, 503)
        if self.engine is None:
            if self.load_error is not None:
                raise ProtocolError(f"model '{self.name}' failed to load: {self.load_error}", 503)
            raise ProtocolError(f"model '{self.name}' is loading; retry when /v2/health/ready is 200", 503)
        return self.engine

    def metadata(self) -> dict[str, Any]:
        engine = self.require_engine()
        return {
            "name": self.name, "versions": [self.version],
            "platform": PLATFORMS.get(engine.backend, engine.backend),
            "inputs": [_spec_json(s) for s in engine.inputs],
            "outputs": [_spec_json(s) for s in engine.outputs],
            "batching": self.layout.as_json() if self.layout else None,
        }

    def config(self) -> dict[str, Any]:
        """Triton-style model config: dims exclude each tensor's batch axis when max_batch_size > 0."""
        engine = self.require_engine()
        layout = self.layout
        assert layout is not None
        axes = layout.output_axes

        def dims(s: TensorSpec, axis: int | None) -> dict[str, Any]:
            datatype = "STRING" if s.datatype == "BYTES" else s.datatype       # Triton's config spelling
            shape = list(s.shape)
            if axis is not None and axis < len(shape):
                del shape[axis]
            return {"name": s.name, "data_type": f"TYPE_{datatype}", "dims": shape}

        batched = layout.batched
        doc: dict[str, Any] = {
            "name": self.name, "platform": PLATFORMS.get(engine.backend, engine.backend),
            "backend": engine.backend, "max_batch_size": self.max_batch if batched else 0,
            "input": [dims(s, 0 if batched else None) for s in engine.inputs],
            "output": [dims(s, axes.get(s.name, 0) if batched else None) for s in engine.outputs],
            "parameters": {"device": engine.device, "precision": engine.precision},
            "batching": layout.as_json(),
            "instance_group": self.instance_groups(),
        }
        if layout.merge:
            doc["dynamic_batching"] = {"max_queue_delay_microseconds": int(self.settings.max_queue_delay_ms * 1000),
                                       "preferred_batch_size": list(self.settings.preferred)}
        return doc

    def instance_groups(self) -> list[dict[str, Any]]:
        """Triton's instance_group of the loaded engines: one group per kind, with its GPUs."""
        engines = self.engines or ([self.engine] if self.engine is not None else [])
        gpus = [int(e.device.partition(":")[2] or 0) for e in engines if e.device.startswith("cuda")]
        cpus = sum(1 for e in engines if not e.device.startswith("cuda"))
        groups = []
        if gpus:
            groups.append({"name": self.name, "kind": "KIND_GPU", "count": len(gpus) // len(set(gpus)),
                           "gpus": sorted(set(gpus))})
        if cpus:
            groups.append({"name": self.name, "kind": "KIND_CPU", "count": cpus, "gpus": []})
        return groups

    def stats_entry(self) -> dict[str, Any]:
        """Triton's /stats layout (the subset this server measures)."""
        s = self.stats.snapshot()
        return {
            "name": self.name, "version": self.version, "last_inference": s["last_inference_ms"],
            "inference_count": s["inferences"], "execution_count": s["engine_calls"],
            "inference_stats": {
                "success": {"count": s["success"], "ns": s["request_ns"]}, "fail": {"count": s["failed"], "ns": 0},
                "queue": {"count": s["success"], "ns": s["queue_ns"]},
                "compute_input": {"count": s["success"], "ns": s["compute_input_ns"]},
                "compute_infer": {"count": s["success"], "ns": s["compute_infer_ns"]},
                "compute_output": {"count": s["success"], "ns": s["compute_output_ns"]},
            },
            "batch_stats": [{"batch_size": b, "compute_infer": {"count": c, "ns": 0}}
                            for b, c in sorted(s["batch_sizes"].items())],
            "ngcx": s,
        }


class ModelEntry:
    """One model name: the versions served now (replaced whole by a load), its state and counters."""

    def __init__(self, name: str):
        self.name = name
        self.versions: dict[str, ServedModel] = {}
        self.state = UNAVAILABLE
        self.reason = "not loaded"
        self.lock = threading.Lock()
        self.stats: dict[str, Stats] = {}          # by version; kept across reloads so counters only grow

    def default(self) -> ServedModel | None:
        """The newest version served (Triton picks the highest when the URL names none)."""
        if not self.versions:
            return None
        return self.versions[max(self.versions, key=int)]


class ModelTable:
    """The models of one server: one fixed model (single()), or a repository's."""

    def __init__(self, defaults: Settings, log: LOG | None = None, root: Path | None = None,
                 backend: str | None = None):
        self.defaults = defaults
        self.log = log or (lambda line: None)
        self.root = root
        self.backend = backend
        self.entries: dict[str, ModelEntry] = {}
        self.single: ServedModel | None = None
        self.startup_done = threading.Event()
        self.startup_errors: dict[str, str] = {}

    @classmethod
    def for_one(cls, model: ServedModel, log: LOG | None = None) -> ModelTable:
        """`serve MODEL`: a table of one model that load/unload cannot change."""
        table = cls(model.settings, log)
        table.single = model
        entry = ModelEntry(model.name)
        entry.versions = {model.version: model}
        entry.stats[model.version] = model.stats
        table.entries[model.name] = entry
        table.startup_done.set()
        return table

    # -- lookups (hot path: no locks) --
    def lookup(self, name: str, version: str | None) -> ServedModel:
        """The model version a URL names; 404 when unknown, 503 while it is not loaded."""
        if self.single is not None:
            model = self.single
            if name != model.name:
                raise ProtocolError(f"unknown model '{_peer(name)}'; this server serves '{model.name}'", 404)
            if version is not None and version != model.version:
                raise ProtocolError(f"model '{model.name}' has no version '{_peer(version)}'; "
                                    f"available: {model.version}", 404)
            return model
        entry = self.entries.get(name)
        if entry is None:
            raise ProtocolError(f"unknown model '{_peer(name)}'; the repository has: {self._names_text()}", 404)
        versions = entry.versions
        if not versions:
            if entry.state == LOADING:
                raise ProtocolError(f"model '{name}' is loading; retry when /v2/models/{name}/ready is 200", 503)
            raise ProtocolError(f"model '{name}' is not loaded ({entry.reason}); load it with "
                                f"POST /v2/repository/models/{name}/load", 503)
        if version is None:
            model = entry.default()
            assert model is not None
            return model
        if version not in versions:
            raise ProtocolError(f"model '{name}' has no version '{_peer(version)}'; available: "
                                f"{', '.join(sorted(versions, key=int))}", 404)
        return versions[version]

    def versions_of(self, name: str) -> list[str]:
        entry = self.entries.get(name)
        return sorted(entry.versions, key=int) if entry else []

    def served(self) -> list[ServedModel]:
        return [m for e in list(self.entries.values()) for m in list(e.versions.values())]

    def samples(self) -> list[ModelSample]:
        """Every version ever served, for /metrics (counters survive unload and reload)."""
        out = []
        for entry in list(self.entries.values()):
            for version, stats in sorted(entry.stats.items()):
                model = entry.versions.get(version)
                batcher = model.batcher if model else None
                out.append(ModelSample(entry.name, version, stats.snapshot(), model.pending if model else 0,
                                       batcher.busy() if batcher is not None else {}))
        return out

    def _names_text(self) -> str:
        names = sorted(self.entries)
        text = ", ".join(names[:20]) + (f" and {len(names) - 20} more" if len(names) > 20 else "")
        return text or "(no models)"

    def index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        """The repository index: every model on disk (or the one served) with its state (Triton's form)."""
        if self.root is not None:
            self._rescan()
        rows: list[dict[str, Any]] = []
        for name in sorted(self.entries):
            entry = self.entries[name]
            served = list(entry.versions.values())
            if self.single is not None:
                rows += [{"name": m.name, "version": m.version, "state": m.state} for m in served]
            elif served:
                rows += [{"name": name, "version": m.version, "state": m.state} for m in served]
            elif not ready_only:
                row: dict[str, Any] = {"name": name, "state": entry.state}
                if entry.state == UNAVAILABLE:
                    row["reason"] = entry.reason
                rows.append(row)
        return [r for r in rows if r["state"] == READY] if ready_only else rows

    def _rescan(self) -> None:
        """New model folders on disk become entries (not loaded); removed ones stay until unloaded."""
        assert self.root is not None
        for name in model_names(self.root):
            self.entries.setdefault(name, ModelEntry(name))

    # -- repository control --
    def _entry(self, name: str) -> ModelEntry:
        if self.single is not None:
            raise ServeError(f"this server serves the one model given on its command line ('{self.single.name}'); "
                             "loading and unloading need a model repository: ngcx-runtime serve DIR")
        if not valid_name(name):
            raise ServeError(f"model name '{_peer(name)}' is not a plain folder name of the repository")
        assert self.root is not None
        if name not in self.entries:
            if not (self.root / name).is_dir():
                raise NotFound(f"no model '{_peer(name)}' in the repository {self.root}; it has: "
                               f"{', '.join(model_names(self.root)[:20]) or '(no models)'}")
            self.entries.setdefault(name, ModelEntry(name))
        return self.entries[name]

    def load(self, name: str, override: ModelConfig | None = None) -> list[ServedModel]:
        """(Re)load a model from the repository: every version its policy selects, each warmed up.
        Raises RuntimeUserError (NotFound for an unknown model) with the reason; a failed reload
        keeps the versions served before. Runs on a load thread (loading.py says why)."""
        return LOADS.run(self._load, name, override)

    def _load(self, name: str, override: ModelConfig | None) -> list[ServedModel]:
        entry = self._entry(name)
        with entry.lock:
            if not entry.versions:
                entry.state, entry.reason = LOADING, ""
            try:
                fresh = self._load_versions(entry, override)
            except Exception as exc:  # noqa: BLE001 - any failure is this model's, the server keeps serving
                text = str(exc) if isinstance(exc, RuntimeUserError) else f"{type(exc).__name__}: {exc}"
                text = " ".join(text.split())[:600]
                entry.reason = f"failed to load: {text}"
                entry.state = READY if entry.versions else UNAVAILABLE
                self.log(f"serve: model '{name}' failed to load: {text}")
                raise RuntimeUserError(f"failed to load '{name}': {text}") from None
            old, entry.versions = entry.versions, fresh
            entry.state, entry.reason = READY, ""
        for model in old.values():
            model.close(f"model '{name}' version {model.version} was reloaded; retry the request")
        return list(fresh.values())

    def _load_versions(self, entry: ModelEntry, override: ModelConfig | None) -> dict[str, ServedModel]:
        from .placement import load_instances
        from .plan import load

        assert self.root is not None
        model_dir = self.root / entry.name
        config = override if override is not None else read_config(model_dir)
        settings = self.defaults.with_config(config)
        fresh: dict[str, ServedModel] = {}
        try:
            for version, path in model_versions(model_dir, config).items():
                stats = entry.stats.get(version) or Stats()
                model = ServedModel(entry.name, version, settings, stats, self.log)
                backend = config.backend or self.backend
                model.attach(load_instances(lambda d, p=path, b=backend: load(p, backend=b, device=d),
                                            settings.devices, self.log))
                fresh[version] = model
                entry.stats[version] = stats
        except BaseException:
            for model in fresh.values():
                model.close("load failed", timeout=1.0)
            raise
        return fresh

    def unload(self, name: str) -> None:
        """Stop serving every version of a model (queued requests still run)."""
        entry = self._entry(name)
        with entry.lock:
            old, entry.versions = entry.versions, {}
            entry.state, entry.reason = UNAVAILABLE, "unloaded"
        for model in old.values():
            model.close(f"model '{name}' was unloaded; load it with POST /v2/repository/models/{name}/load")
        if old:
            self.log(f"serve: model '{name}' unloaded")

    def load_startup(self, names: list[str] | None = None) -> None:
        """Load the repository's models (or `names`) one after another; failures are recorded and
        logged, the others load on. Sets startup_done when finished."""
        try:
            assert self.root is not None
            self._rescan()
            for name in names if names is not None else model_names(self.root):
                try:
                    self.load(name)
                except RuntimeUserError as exc:
                    self.startup_errors[name] = str(exc)
        finally:
            self.startup_done.set()

    def flush(self) -> None:
        for model in self.served():
            if model.batcher is not None:
                model.batcher.flush()

    def stop(self, timeout: float) -> None:
        for model in self.served():
            if model.batcher is not None:
                model.batcher.stop(timeout)
