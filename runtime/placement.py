"""Which device each model instance runs on: `serve`'s placement, decided before anything loads.

Why every GPU by default: a host with four GPUs (g5.12xlarge, ecs.gn7i-c32g1.32xlarge) served on the first one
only (issue 50), because instances went to the backend's default device unless --gpus said otherwise, and deploy
never said. Triton's instance_group of kind KIND_GPU places `count` instances on EACH GPU, all GPUs when the group
names none; serve now does the same: --instances-per-gpu N (default 1) on every visible GPU, fed by one batcher
(batching.py hands each batch to the least busy instance).

What "visible" means (visible_gpu_count): CUDA's own view. CUDA_VISIBLE_DEVICES when it is set, read as CUDA reads
it (entries up to the first invalid one: an index out of range, a repeat, a word that is no GPU-/MIG- UUID); else
NVML's count, which inside a container is the container's GPUs (docker --gpus, Kubernetes' device plugin hand NVML
only those); else the /dev/nvidiaN nodes (a container without NVML's library); None when nothing answers, and then
the instances go where they always went: the backend's default device.

Overrides, strongest first: a model config's instance_group (repository.py; KIND_GPU with gpus, KIND_CPU), then
--gpus 0,2 (explicit: a GPU that is not there is one line and exit 2 before listening), then the default spread.

Why the default is soft (Spread): a default must never turn a setup that served into one that does not. An
instance the default put on a GPU loads there when the backend can; when it cannot (a CPU-only onnxruntime or
torch on a host whose driver shows GPUs, the tensorrt backend, which places instances on GPU 0 only), load_instances
falls back (the backend's default device, or the GPUs that did load) and logs one line. An explicit --gpus or
instance_group is never second-guessed: its failure is the load's failure, as before.

MPS / --processes (split_for_processes): N server processes share the host's GPUs; each child gets its own share of
the placement's GPUs (child i of N on GPU i mod G when N >= G, else every N-th GPU), passed as --gpus (or, for the
default spread, as the hidden --spread-gpus that keeps it soft), so two children never pile on one GPU while
another idles.

Unproven here (no machine with more than one GPU was lent while this was written): that N GPUs give N times the
throughput (bench/gpu/multi_gpu.py measures it; tests/gpu/test_multi_gpu_serve.py checks placement and answers on
every GPU where two or more are visible). The logic itself is pure and tested on the CPU:
tests/runtime/test_placement.py.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .errors import RuntimeUserError

Device = int | str | None        # one instance's device: None = the backend's default, an int = that GPU, "cpu"
GPU_ALL = "gpu"                  # an instance_group of KIND_GPU without gpus (repository.py): every visible GPU
MAX_INSTANCES = 64               # repository.py's bound on an instance_group, the same for flags
_UUID = re.compile(r"^(GPU|MIG)-[0-9A-Za-z-]+$")


class PlacementError(RuntimeUserError):
    """A placement the host cannot honour (one line, exit 2, before the server listens)."""


class Spread(int):
    """A GPU index that the DEFAULT placement chose (every visible GPU), not the user: a load that cannot use it
    falls back instead of failing (module docstring). Only load_instances reads the mark: it hands the backends a
    plain int (no __str__/__repr__ of its own either, so "cuda:{d}" spells it as an int wherever it goes)."""


def parse_visible(value: str, nvml_count: int | None) -> int:
    """How many GPUs CUDA_VISIBLE_DEVICES=value leaves visible: its entries up to the first invalid one.
    An index is invalid when negative, repeated, or (NVML's count known) past the host's last GPU; a GPU-/MIG-
    UUID counts as one (NVML would be needed to check it against the host's)."""
    seen: set[str] = set()
    count = 0
    for raw in value.split(","):
        entry = raw.strip()
        if not entry or entry in seen:
            break
        if entry.lstrip("-").isdigit():
            index = int(entry)
            if index < 0 or (nvml_count is not None and index >= nvml_count):
                break
        elif not _UUID.match(entry):
            break
        seen.add(entry)
        count += 1
    return count


def visible_gpu_count(env: Mapping[str, str], nvml_count: int | None, dev_nodes: int | None = None) -> int | None:
    """The GPUs a CUDA program of this process sees (module docstring), or None when nothing tells."""
    value = env.get("CUDA_VISIBLE_DEVICES")
    if value is not None:
        return parse_visible(value, nvml_count)
    if nvml_count is not None:
        return nvml_count
    return dev_nodes if dev_nodes else None


def host_visible_gpus() -> int | None:
    """visible_gpu_count for this process: its environment, NVML's count (probe.Nvml), the /dev/nvidiaN nodes."""
    from .probe import Nvml

    nvml_count: int | None
    try:
        with Nvml() as nvml:
            nvml_count = nvml.count()
    except (OSError, AttributeError):
        nvml_count = None
    nodes = len([p for p in glob.glob("/dev/nvidia*") if re.fullmatch(r"/dev/nvidia\d+", p)])
    return visible_gpu_count(os.environ, nvml_count, nodes)


def parse_gpus(text: str | None, flag: str = "--gpus") -> list[int] | None:
    """--gpus 0,2 as indices; None when not given or `all` (the default spread)."""
    if text is None or text.strip().lower() == "all":
        return None
    try:
        gpus = [int(g) for g in text.split(",")]
    except ValueError:
        gpus = []
    if not gpus or any(g < 0 for g in gpus) or len(set(gpus)) != len(gpus):
        raise PlacementError(f"{flag} {text!r}: give distinct GPU indices separated by commas, e.g. 0,1 (or all)")
    return gpus


def place(per_gpu: int, gpus: Sequence[int] | None, visible: int | None, *, soft_gpus: bool = False
          ) -> tuple[Device, ...]:
    """One device per instance: per_gpu instances on each of `gpus` (explicit), else on each visible GPU
    (Spread: soft), else per_gpu instances on the backend's default device (no GPU visible, or none known).
    soft_gpus: `gpus` came from a supervisor's share of the default spread (--spread-gpus), soft as well."""
    if per_gpu < 1:
        raise PlacementError(f"--instances-per-gpu {per_gpu} must be at least 1")
    if gpus is not None:
        missing = [g for g in gpus if visible is not None and g >= visible]
        if missing:
            seen = f"GPUs 0-{visible - 1}" if visible else "no GPU"
            raise PlacementError(f"--gpus {','.join(map(str, gpus))}: GPU {missing[0]} is not visible here (this "
                                 f"process sees {seen}); drop --gpus to serve on every visible GPU")
        chosen: list[Device] = [Spread(g) if soft_gpus else g for g in gpus]
    elif visible:
        chosen = [Spread(g) for g in range(visible)]
    else:
        chosen = [None]
    devices = tuple(d for d in chosen for _ in range(per_gpu))
    if len(devices) > MAX_INSTANCES:
        raise PlacementError(f"{len(devices)} instances ({per_gpu} on each of {len(chosen)} device(s)); at most "
                             f"{MAX_INSTANCES}: lower --instances-per-gpu or name fewer --gpus")
    return devices


def expand_config(devices: tuple[Device, ...] | None, visible: int | None) -> tuple[Device, ...] | None:
    """A model config's instance_group placement with Triton's meanings: KIND_AUTO (None) on every visible GPU,
    soft; KIND_GPU without gpus ("gpu", repository.py) on every visible GPU, explicit (GPU 0 when the count is
    unknown, so a host without a GPU still refuses it). Listed GPUs and the CPU stay as the config says."""
    if devices is None:
        return None
    out: list[Device] = []
    for d in devices:
        if d is None and visible:
            out += [Spread(g) for g in range(visible)]
        elif d == GPU_ALL:
            out += list(range(visible)) if visible else [0]
        else:
            out.append(d)
    return tuple(out)


def split_for_processes(gpus: Sequence[int], n: int) -> list[list[int]]:
    """Each of n server processes' share of the GPUs: child i on GPU i mod G when n >= G (several children per
    GPU, MPS's case), else every n-th GPU from the i-th (each child several GPUs, none shared)."""
    if n < 1:
        raise PlacementError(f"{n} processes: at least 1")
    gpus = list(gpus)
    if not gpus:
        return [[] for _ in range(n)]
    if n >= len(gpus):
        return [[gpus[i % len(gpus)]] for i in range(n)]
    return [gpus[i::n] for i in range(n)]


def gpus_of(devices: Sequence[Device]) -> list[int]:
    """The distinct GPU indices of a placement, in order."""
    out: list[int] = []
    for d in devices:
        if isinstance(d, int) and int(d) not in out:
            out.append(int(d))
    return out


def is_soft(devices: Sequence[Device]) -> bool:
    return any(isinstance(d, Spread) for d in devices)


def describe(devices: Sequence[Device]) -> str:
    """`4 instances on GPUs 0,1,2,3 (every visible GPU)` and the like, for serve's start-up line."""
    gpus = gpus_of(devices)
    n = len(devices)
    what = f"{n} instance{'s' if n != 1 else ''}"
    if not gpus:
        return f"{what} on the {'CPU' if 'cpu' in devices else 'default device'}"
    how = " (every visible GPU)" if is_soft(devices) else ""
    return f"{what} on GPU{'s' if len(gpus) > 1 else ''} {','.join(map(str, gpus))}{how}"


def load_instances(load: Callable[[Device], Any], devices: Sequence[Device], log: Callable[[str], None]
                   ) -> list[Any]:
    """One engine per device. An explicit placement loads as given (a failure is the load's). A soft one
    (Spread) falls back instead of failing: the first instance on the backend's default device when its GPU
    cannot be used; all instances there when the first came up on the CPU; and a GPU whose instance cannot load
    is left out (one line each), the others serve."""
    if not is_soft(devices):
        return [load(d) for d in devices]
    soft_load = load

    def load(d: Device) -> Any:                 # the backends get plain ints, never the mark
        return soft_load(int(d) if isinstance(d, Spread) else d)

    per_gpu = sum(1 for d in devices if d == devices[0])
    first = devices[0]
    try:
        engine = load(first)
    except RuntimeUserError as exc:
        log(f"serve: cannot place an instance on GPU {int(first)} ({_short(exc)}); serving on the backend's "
            "default device")
        return [load(None) for _ in range(per_gpu)]
    if str(getattr(engine, "device", "")).startswith("cpu"):
        log(f"serve: the engine runs on the CPU here (its backend does not use the GPU): {per_gpu} instance(s) on "
            "the CPU instead of one set per GPU")
        return [engine] + [load(None) for _ in range(per_gpu - 1)]
    engines, skipped = [engine], set()
    for d in devices[1:]:
        if isinstance(d, int) and int(d) in skipped:
            continue
        try:
            engines.append(load(d))
        except RuntimeUserError as exc:
            skipped.add(int(d) if isinstance(d, int) else -1)
            log(f"serve: cannot place an instance on GPU {d if d is None else int(d)} ({_short(exc)}); serving "
                "without it")
            engines = [e for e in engines if getattr(e, "device", None) != f"cuda:{int(d)}"] \
                if isinstance(d, int) else engines
    return engines


def _short(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200]
