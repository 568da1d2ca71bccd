"""`ngcx-runtime serve`: one model, or a repository of models, over the KServe v2 / Triton HTTP protocol.

This module is the command: its arguments, the checks that need no engine (a typo exits 2
before the server listens), load_engine, and the run loop. The server it runs is cut by job:
routes.py (the v2 protocol over the served models, and what it serves), transport.py (the
HTTP/1.1 transport; why it stays the default over uvicorn, measured, is in its docstring),
server.py (start_server / start_loading / start_repository and the ServerHandle they return),
access.py (who may call which route, for HTTP and gRPC alike: bearer keys, model control; its
flags and their environment defaults are access_flags.py's; TLS is tls.py's).

Start-up (the CLI): listen first (/v2/health/live 200 at once), then load: a MODEL given
--precision / --batch-profile / --calibration-data is optimized through the plan cache
($NGCX_RUNTIME_CACHE; built once, a cache hit on every later start), a --handler module:Class
wraps it (handler.py); one warm-up inference runs; only then are /v2/health/ready and
/v2/models/NAME/ready 200. A failed load is one line and exit 2 (for a repository: when no
model loaded; otherwise one line per failed model, and the rest serve). Every load, at start-up or
asked later, runs on threads that live as long as the process (loading.py says why). SIGTERM / SIGINT: stop
accepting, finish in-flight requests (queued ones run at once), exit 0.

Other transports and processes: `--grpc-port` serves the KServe v2 gRPC service on the same
models (grpc_service.py); `--transport uvicorn` the same HTTP routes through uvicorn (asgi.py);
placement.py puts --instances-per-gpu N engines (default 1) on EVERY visible GPU by default, as
Triton's KIND_GPU instance_group does, behind one batcher (--gpus 0,2 or a config's instance_group
say otherwise); `--processes N` / `--mps N` run N server processes behind this port (mps.py), each
on its share of the GPUs; CUDA shared memory (cuda_shm.py) next to the system one where a GPU is.

Python API (used by bench and tests), importable from here as ever: start_server(engine, ...),
start_loading(loader, ...) and start_repository(root, ...) -> ServerHandle (server.py), each with
access=AccessConfig(...) for keys, model control and TLS; load_engine(...) builds what the CLI serves.
"""

from __future__ import annotations

import argparse
import faulthandler
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import access_flags
from .access import SHARED_MEMORY_POLICIES as POLICIES
from .access import AccessConfig
from .codings import decompress as _decompress
from .engine import Engine
from .routes import DEFAULT_MAX_CONNECTIONS, SERVER_NAME
from .served import DEFAULT_MAX_BATCH, PLATFORMS, ServeError
from .server import (
    MODEL_VERSION,
    TRANSPORTS,
    ServerHandle,
    check_limits,
    start_loading,
    start_repository,
    start_server,
)

__all__ = ["DEFAULT_MAX_BATCH", "DEFAULT_MAX_CONNECTIONS", "MODEL_VERSION", "PLATFORMS", "SERVER_NAME", "AccessConfig",
           "ServeError", "ServerHandle", "_decompress", "add_parser", "check_limits", "load_engine", "main", "run",
           "start_loading", "start_repository", "start_server"]


# -- command line --

def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register `serve` on the ngcx-runtime argparse subparsers; sets func(args) -> int."""
    p = subparsers.add_parser("serve", help="serve a model over the KServe v2 / Triton HTTP protocol",
                              description=__doc__.split("\n\n")[0])
    _add_arguments(p)
    p.set_defaults(func=run, parser=p)
    return p


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="PLAN_DIR|MODEL|REPOSITORY", nargs="?", default=None,
                   help="a plan directory from `optimize`, a model (.onnx / .pt2), or a model repository "
                        "(DIR/<model>/<version>/model.onnx, optional DIR/<model>/config.json); optional with "
                        "--handler")
    p.add_argument("--port", type=int, default=8000, help="TCP port (default 8000; 0 = any free port)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; 0.0.0.0 for all)")
    p.add_argument("--name", default=None, help="model name in the URL (default: the engine's name)")
    p.add_argument("--max-batch", type=int, default=None,
                   help="largest merged batch and largest accepted request batch (default: the engine's, "
                        f"or {DEFAULT_MAX_BATCH})")
    p.add_argument("--max-queue-delay-ms", type=float, default=1.0,
                   help="how long the oldest queued request waits for others to merge with (default 1.0)")
    p.add_argument("--max-body-mb", type=float, default=256.0, help="largest request body (default 256 MB)")
    p.add_argument("--max-connections", type=int, default=DEFAULT_MAX_CONNECTIONS,
                   help=f"open connections served at once (one thread each); more get a 503 "
                        f"(default {DEFAULT_MAX_CONNECTIONS})")
    p.add_argument("--backend", default=None, choices=["tensorrt", "onnxruntime", "pytorch"],
                   help="engine backend (default: chosen automatically)")
    p.add_argument("--metrics-port", type=int, default=None, metavar="PORT",
                   help="also serve Prometheus metrics on this port (Triton uses 8002; default: only /metrics "
                        "of --port)")
    p.add_argument("--load-model", action="append", default=None, metavar="NAME",
                   help="a repository: load only these models at start (repeatable; default: all); the others "
                        "load through POST /v2/repository/models/NAME/load")
    p.add_argument("--shared-memory", default="local", choices=POLICIES,
                   help="Triton's system shared memory extension: local = clients on this host (loopback) only "
                        "(default), any = every peer (e.g. a container sharing /dev/shm), off = disabled")
    p.add_argument("--grpc-port", type=int, default=None, metavar="PORT",
                   help="also serve the KServe v2 gRPC service on this port (Triton uses 8001; tritonclient.grpc)")
    p.add_argument("--instances-per-gpu", type=int, default=None, metavar="N",
                   help="engine instances of each model on EACH GPU it serves on (Triton's instance_group count), "
                        "all fed by one dynamic batcher; on a host without a GPU, N instances on the CPU; a "
                        "repository model's config.json instance_group overrides it (default 1)")
    p.add_argument("--instances", type=int, default=None, metavar="N", help="the same as --instances-per-gpu N")
    p.add_argument("--gpus", default=None, metavar="0,1|all",
                   help="serve on these GPUs only (default: all, every GPU this process sees: CUDA_VISIBLE_DEVICES, "
                        "else NVML's count)")
    p.add_argument("--spread-gpus", default=None, help=argparse.SUPPRESS)   # an --mps child's share of the default
    p.add_argument("--mps", type=int, default=None, metavar="N",
                   help="N server processes sharing the GPU through NVIDIA MPS behind this one port (starts the "
                        "MPS control daemon when none runs; refused where MPS is unavailable; default "
                        "$NGCX_RUNTIME_MPS, which `ngcx run --mps N` sets)")
    p.add_argument("--transport", default=None, choices=TRANSPORTS,
                   help="HTTP transport: stdlib (default; see the module docstring for the measurement) or uvicorn "
                        "(needs uvicorn + httptools); default $NGCX_RUNTIME_TRANSPORT or stdlib")
    p.add_argument("--processes", type=int, default=None, metavar="N",
                   help="N server processes behind this one port (SO_REUSEPORT), e.g. to use more CPU cores than "
                        "one Python process can; --mps does the same with the GPU shared through MPS")
    p.add_argument("--reuse-port", action="store_true", help=argparse.SUPPRESS)   # one of --mps's processes
    access_flags.add_arguments(p)
    p.add_argument("--verbose", action="store_true", help="log every request to stderr")
    p.add_argument("--handler", default=None, metavar="MODULE:CLASS",
                   help="serve a Python handler class (load(context), predict(inputs)) from --app-dir")
    p.add_argument("--app-dir", default=None, metavar="DIR",
                   help="folder the handler module is imported from (default /opt/ngcx/app when it exists, "
                        "else the current directory)")
    p.add_argument("--precision", default=None, choices=["fp32", "fp16", "int8"],
                   help="optimize MODEL at this precision on first start, into the plan cache "
                        "($NGCX_RUNTIME_CACHE); later starts load the cached plan")
    p.add_argument("--batch-profile", default=None, metavar="1,8,32",
                   help="batch sizes to optimize MODEL for (the largest is the max batch); implies optimizing")
    p.add_argument("--calibration-data", default=None, metavar="FILE.npz",
                   help="int8 calibration inputs, one array per model input keyed by its name")
    p.add_argument("--model-key", default=None, metavar="PEM",
                   help="verify MODEL's OpenSSF Model Signing signature (MODEL.sig) with this public key before "
                        "loading; the signature must then be there (default: MODEL.pub, when MODEL.sig exists)")


def _env_int(name: str) -> int | None:
    """An integer default from the environment (None when unset; a junk value is left for the check to name)."""
    import os

    value = os.environ.get(name, "").strip()
    if not value:
        return None
    try:
        return int(value)
    except ValueError:
        raise ServeError(f"${name}={value!r} is not a whole number of processes") from None


def load_engine(model: str | Path | None, *, handler: str | None = None, app_dir: str | Path | None = None,
                backend: str | None = None, precision: str | None = None, batch_profile: list[int] | None = None,
                calibration: str | Path | None = None, name: str | None = None,
                log: Callable[[str], None] | None = None, device: int | str | None = None) -> Engine:
    """The engine `serve` runs: the model (optimized through the plan cache when a precision, batch
    profile or calibration file is given), wrapped in the handler when there is one."""
    from .plan import load

    engine: Engine | None = None
    if model is not None:
        path = Path(model)
        wants_plan = precision is not None or batch_profile is not None or calibration is not None
        if wants_plan and path.is_file():
            path = _cached_plan(path, backend, precision or "fp32", batch_profile, calibration, name, log or print)
        engine = load(path, backend=backend, device=device)
    if handler is not None:
        from .handler import load_handler

        engine = load_handler(handler, Path(app_dir) if app_dir else None, engine=engine,
                              model_path=Path(model).resolve() if model is not None else None, name=name)
    if engine is None:
        raise ServeError("nothing to serve: give a MODEL (or PLAN_DIR), a --handler module:Class, or both")
    return engine


def _cached_plan(model: Path, backend: str | None, precision: str, batch_profile: list[int] | None,
                 calibration: str | Path | None, name: str | None, log: Callable[[str], None]) -> Path:
    """Optimize through optimize.py's cache (keyed by model hash, backend version, GPU, precision,
    batch profile, calibration): the first start builds, every later one is a cache hit."""
    from .manifest import OptimizeOptions, model_name
    from .optimize import load_calibration, optimize

    calib = sha = None
    if calibration is not None:
        calib, sha = load_calibration(Path(calibration))
    opts = OptimizeOptions(precision=precision, calibration=calib, calibration_sha256=sha,
                           name=name or model_name(model))
    if batch_profile is not None:
        opts.batch_profile = list(batch_profile)
    res = optimize(model, None, opts, backend=backend,
                   calibration_path=Path(calibration).resolve() if calibration is not None else None)
    m = res.manifest
    what = (f"{m['backend']} {m['precision']}, batch {','.join(map(str, m.get('batch_profile') or []))}, "
            f"{res.plan_dir}")
    if res.cache_hit:
        log(f"plan: cache hit ({what}) in {res.seconds:.2f} s")
    else:
        log(f"plan: built in {res.seconds:.1f} s (cache miss; {what})")
    return res.plan_dir


def _check_args(args: argparse.Namespace) -> list[int] | None:
    """Everything checkable without loading, so a typo exits 2 before the server listens."""
    from .errors import RuntimeUserError

    check_limits(args.max_batch, args.name, args.max_queue_delay_ms, args.max_body_mb, args.max_connections,
                 args.metrics_port, args.grpc_port)
    args.access = access_flags.config_from_args(args, log=_log)
    args.devices = _placement(args)
    if args.mps is None and not args.reuse_port:
        args.mps = _env_int("NGCX_RUNTIME_MPS")
    for flag, value in (("--mps", args.mps), ("--processes", args.processes)):
        if value is not None and value < 1:
            raise ServeError(f"{flag} {value} must be at least 1 (the number of server processes)")
    if args.mps is not None and args.processes is not None:
        raise ServeError("give --mps N or --processes N, not both (--mps N is --processes N with MPS)")
    if _repository_root(args) is not None:
        _check_repository_args(args)
        return None
    if args.load_model:
        raise ServeError("--load-model names models of a repository; give a repository folder "
                         "(DIR/<model>/<version>/model.onnx) instead of one model")
    if args.model is None and args.handler is None:
        raise ServeError("nothing to serve: give a MODEL (or PLAN_DIR), a --handler module:Class, or both")
    if args.model is not None and not Path(args.model).exists():
        raise RuntimeUserError(f"{args.model}: no such model or plan directory")
    _check_signature(args)
    if args.handler is not None:
        from .handler import parse_spec

        parse_spec(args.handler)
        if args.app_dir is not None and not Path(args.app_dir).is_dir():
            raise ServeError(f"--app-dir {args.app_dir}: no such directory; point it at the folder with the handler")
    if args.calibration_data is not None and not Path(args.calibration_data).is_file():
        raise ServeError(f"--calibration-data {args.calibration_data}: no such file; save one with "
                         "numpy.savez(path, input_name=array, ...)")
    if args.precision == "int8" and args.calibration_data is None and args.model and Path(args.model).is_file():
        raise ServeError("--precision int8 needs --calibration-data FILE.npz (one array per model input, keyed "
                         "by input name, samples along axis 0)")
    if args.model is not None and Path(args.model).is_dir() and (args.precision or args.batch_profile
                                                                 or args.calibration_data):
        raise ServeError(f"{args.model} is an optimized plan already; --precision, --batch-profile and "
                         "--calibration-data apply to a MODEL file (or rebuild it with ngcx-runtime optimize)")
    if args.batch_profile is None:
        return None
    from .optimize import parse_batches

    try:
        return parse_batches(args.batch_profile)
    except RuntimeUserError:
        raise ServeError(f"--batch-profile {args.batch_profile!r}: give positive batch sizes separated by "
                         "commas, e.g. 1,8,32") from None


def _check_signature(args: argparse.Namespace) -> None:
    """A signed model (MODEL.sig, or --model-key given) is verified before the server listens: a byte changed
    after `ngcx build` signed it is one line and exit 2, nothing started (issue 48; modelsig.py)."""
    from .modelsig import check_model

    if args.model is None:
        if args.model_key is not None:
            raise ServeError("--model-key verifies a MODEL's signature; give the MODEL too")
        return
    if args.reuse_port:                 # one of --mps/--processes' servers: their supervisor verified it already
        return
    done = check_model(Path(args.model), Path(args.model_key) if args.model_key is not None else None)
    if done is not None:
        print(f"model: signature verified ({len(done.files)} file(s), OpenSSF Model Signing, key sha256 "
              f"{done.key_sha256[:16]}…)", flush=True)


def _placement(args: argparse.Namespace) -> tuple[int | str | None, ...]:
    """One device per instance (placement.py): --instances-per-gpu N on each of --gpus, else on every visible GPU."""
    from .placement import host_visible_gpus, parse_gpus, place

    if args.instances is not None and args.instances_per_gpu is not None:
        raise ServeError("give --instances-per-gpu N or --instances N, not both (they are the same)")
    flag, per_gpu = ("--instances", args.instances) if args.instances is not None \
        else ("--instances-per-gpu", args.instances_per_gpu if args.instances_per_gpu is not None else 1)
    if per_gpu < 1:
        raise ServeError(f"{flag} {per_gpu} must be at least 1")
    gpus = parse_gpus(args.gpus)
    spread = parse_gpus(args.spread_gpus, "--spread-gpus") if gpus is None else None
    return place(per_gpu, gpus if gpus is not None else spread, host_visible_gpus(), soft_gpus=spread is not None)


def _repository_root(args: argparse.Namespace) -> Path | None:
    """MODEL is a repository when it is a folder without a plan manifest (repository.is_repository)."""
    from .repository import is_repository

    if args.model is None:
        return None
    path = Path(args.model)
    return path if is_repository(path) else None


def _check_repository_args(args: argparse.Namespace) -> None:
    """Per-model flags belong in DIR/<model>/config.json; a repository must hold at least one model."""
    from .repository import model_names, valid_name

    root = Path(args.model)
    per_model = [flag for flag, value in (("--handler", args.handler), ("--name", args.name),
                                          ("--precision", args.precision), ("--batch-profile", args.batch_profile),
                                          ("--calibration-data", args.calibration_data),
                                          ("--model-key", args.model_key)) if value is not None]
    if per_model:
        raise ServeError(f"{', '.join(per_model)} apply to one model; {root} is a model repository (it has no "
                         "manifest.json): put batching settings in DIR/<model>/config.json, or serve one model")
    names = model_names(root)
    if not names:
        raise ServeError(f"{root}: neither a plan directory (no manifest.json) nor a model repository (no "
                         f"{root}/<model>/<version>/model.onnx); give a model file, a plan or a repository")
    for name in args.load_model or []:
        if not valid_name(name) or name not in names:
            raise ServeError(f"--load-model {name!r}: no such model in {root}; it has: {', '.join(names[:20])}")


def _default_name(args: argparse.Namespace) -> str:
    """The URL name before the engine exists: --name, the plan's, the model file's, or the handler module's."""
    from .manifest import model_name
    from .plan import read_manifest

    if args.name:
        return args.name
    if args.model is not None:
        path = Path(args.model)
        if path.is_dir():
            name = read_manifest(path).get("name")
            return name if isinstance(name, str) and name and "/" not in name else model_name(path)
        return model_name(path)
    return args.handler.partition(":")[0].rsplit(".", 1)[-1]


def run(args: argparse.Namespace) -> int:
    """Listen at once, load (optimize on a cache miss), warm up, turn ready; serve until
    SIGTERM/SIGINT, drain in-flight requests, exit 0. A load failure: one line, exit 2.

    faulthandler first, in every server process (MPS children come through here too): a crash in native code
    (CUDA, torch.compile's kernels, ONNX Runtime) then leaves every thread's Python stack on stderr, which the
    container log or the bench's run log keeps (issue 24: ResNet-18 servers died with SIGSEGV, nothing logged)."""
    faulthandler.enable(all_threads=True)
    batch_profile = _check_args(args)
    if (args.mps is not None or args.processes is not None) and not args.reuse_port:
        from . import mps

        return mps.supervise(args)
    stop = threading.Event()

    def _on_signal(signum: int, _frame: Any) -> None:
        stop.set()

    root = _repository_root(args)
    if root is not None:
        signal.signal(signal.SIGTERM, _on_signal)
        signal.signal(signal.SIGINT, _on_signal)
        return _run_repository(args, root, stop)
    name = _default_name(args)

    def loader(device: int | str | None = None) -> Engine:
        return load_engine(args.model, handler=args.handler, app_dir=args.app_dir, backend=args.backend,
                           precision=args.precision, batch_profile=batch_profile,
                           calibration=args.calibration_data, name=name, log=lambda line: print(line, flush=True),
                           device=device)

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    handle = start_loading(loader, args.host, args.port, name=name, max_batch=args.max_batch,
                           max_queue_delay_ms=args.max_queue_delay_ms, max_body_mb=args.max_body_mb,
                           verbose=args.verbose, max_connections=args.max_connections,
                           metrics_port=args.metrics_port, log=_log, shared_memory=args.shared_memory,
                           devices=args.devices, grpc_port=args.grpc_port, reuse_port=args.reuse_port,
                           transport=args.transport, access=args.access)
    _mark_shared(handle, args)
    print(f"serve: listening at {handle.url} (live; ready once '{name}' is loaded and warmed up)"
          f"{_metrics_note(handle)}", flush=True)
    _access_note(handle, args)
    while handle.loading and not stop.is_set():
        handle.wait_loaded(0.2)
    engine = handle._app.engine
    if engine is None:                  # the load failed (one line, exit 2), or a signal came first
        handle.stop(drain=False, timeout=1.0)
        if handle.load_exception is not None:
            raise handle.load_exception
        return 0
    print(f"serving model '{handle.name}' ({engine.backend}, {engine.device}, {engine.precision}) at "
          f"{handle.url}/v2/models/{handle.name} (max batch {handle.max_batch}, queue delay "
          f"{args.max_queue_delay_ms:g} ms; {_instances_note(handle._app.table.single)})", flush=True)
    while not stop.wait(0.5):
        pass
    print("serve: signal received; draining in-flight requests", flush=True)
    handle.stop(drain=True)
    print(f"serve: stopped ({handle.stats()['requests']} inference requests served)", flush=True)
    return 0


def _instances_note(model: Any) -> str:
    """`4 instances on cuda:0, cuda:1, cuda:2, cuda:3 (4 GPUs)`: where the loaded engines run, as they report it."""
    engines = list(getattr(model, "engines", None) or [])
    if not engines:
        return "1 instance"
    devices = sorted({str(e.device) for e in engines})
    gpus = [d for d in devices if d.startswith("cuda")]
    tail = f" ({len(gpus)} GPU{'s' if len(gpus) != 1 else ''})" if gpus else ""
    return f"{len(engines)} instance{'s' if len(engines) != 1 else ''} on {', '.join(devices)}{tail}"


def _log(line: str) -> None:
    print(line, flush=True)


def _metrics_note(handle: ServerHandle) -> str:
    grpc = f"; gRPC at {handle.grpc_target}" if handle.grpc_target else ""
    return grpc + (f"; metrics at {handle.metrics_url}" if handle.metrics_url else "")


def _access_note(handle: ServerHandle, args: argparse.Namespace, repository: bool = False) -> None:
    for line in access_flags.start_lines(handle._app.policy, args.host, handle.url, repository):
        print(line, flush=True)


def _mark_shared(handle: ServerHandle, args: argparse.Namespace) -> None:
    """One of serve --mps's processes: a load or unload would reach only the process a client happens to hit."""
    if args.reuse_port:
        handle._app.policy.control_refusal = ("this server is one of several processes sharing the port (serve --mps); "
                                       "loading and unloading models would change only one of them: restart the "
                                       "server with the models to serve (--load-model)")


def _run_repository(args: argparse.Namespace, root: Path, stop: threading.Event) -> int:
    """`serve DIR`: load the repository's models (each warmed up), serve those that loaded; exit 2 when
    none did. Failures are one line each; the repository extension can load them again later."""
    handle = start_repository(root, args.host, args.port, models=args.load_model, backend=args.backend,
                              max_batch=args.max_batch, max_queue_delay_ms=args.max_queue_delay_ms,
                              max_body_mb=args.max_body_mb, verbose=args.verbose,
                              max_connections=args.max_connections, metrics_port=args.metrics_port, log=_log,
                              shared_memory=args.shared_memory, devices=args.devices, grpc_port=args.grpc_port,
                              reuse_port=args.reuse_port, transport=args.transport, access=args.access)
    _mark_shared(handle, args)
    print(f"serve: listening at {handle.url} (live; ready once the models of {root} are loaded and warmed up)"
          f"{_metrics_note(handle)}", flush=True)
    _access_note(handle, args, repository=True)
    while handle.loading and not stop.is_set():
        handle.wait_loaded(0.2)
    ready = sorted({m.name for m in handle._app.table.served() if m.ready})
    errors = handle._app.table.startup_errors
    if stop.is_set() and handle.loading:
        handle.stop(drain=False, timeout=1.0)
        return 0
    if not ready and errors:
        handle.stop(drain=False, timeout=1.0)
        raise ServeError(f"no model of {root} loaded: {'; '.join(errors.values())}")
    failed = f"; failed: {', '.join(sorted(errors))}" if errors else ""
    print(f"serving {len(ready)} model(s) from {root} at {handle.url}/v2/models/ ({', '.join(ready) or 'none yet'})"
          f"{failed}", flush=True)
    while not stop.wait(0.5):
        pass
    print("serve: signal received; draining in-flight requests", flush=True)
    handle.stop(drain=True)
    total = sum(m.stats.snapshot()["requests"] for m in handle._app.table.served())
    print(f"serve: stopped ({total} inference requests served)", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m ngcx_runtime.serve ...`: the same command without the ngcx-runtime front end."""
    from .errors import RuntimeUserError

    p = argparse.ArgumentParser(prog="ngcx-runtime serve", description=__doc__.split("\n\n")[0])
    _add_arguments(p)
    p.set_defaults(parser=p)
    args = p.parse_args(argv)
    try:
        return run(args)
    except (RuntimeUserError, ServeError) as exc:
        print(f"ngcx-runtime serve: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
