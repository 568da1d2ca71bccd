"""`serve --processes N` and `serve --mps N`: N server processes behind one port, sharing the GPU.

Why processes: one Python process serves a few thousand small requests a second before its
interpreter lock is the limit, and on a GPU one process's small batches leave most of the chip
idle. The seeds' lesson (seeds-digest, MPS): for inference that one process cannot fill, MPS ran
several processes' kernels side by side (7x), and batching on top added ~60 %.

How: the supervisor (this module) starts N `ngcx-runtime serve` children with the same arguments;
each binds the same --port (and --grpc-port) with SO_REUSEPORT, so the kernel spreads incoming
connections over them: one endpoint, no proxy hop. With --mps the supervisor first makes sure an
NVIDIA MPS control daemon runs (`nvidia-cuda-mps-control -d` with CUDA_MPS_PIPE_DIRECTORY and
CUDA_MPS_LOG_DIRECTORY set; an already running one, e.g. the host's daemon that `ngcx run --mps`
started, is joined and left running), so the children's CUDA work runs concurrently instead of
time-sliced. Where MPS cannot run (no nvidia-cuda-mps-control and no running daemon, or no GPU)
--mps is refused with one line before anything starts.

Why each child gets cores / N compute threads (OMP_NUM_THREADS, unless the caller set it): every
child's torch (and ONNX Runtime) would otherwise size its thread pool to all the cores, and N
pools spinning on the same cores starved the children's request threads. Measured on the H100
(16 cores, one call, bench/results/gpu/targets/targets_threads_*_h100.json): ResNet-50 batch 1
from 64 clients under --mps 4 served 514 img/s with 16 threads per child, 3,887 with 4.

Which GPUs each child uses (placement.split_for_processes): the supervisor's placement (every visible GPU by
default, or --gpus) shared out, child i of N on GPU i mod G when N >= G, else every N-th GPU, passed to the child
as --gpus (the default's share as the hidden --spread-gpus, which stays soft: placement.py says why). So `--mps 8`
on a 4-GPU host runs two processes per GPU, and `--processes 2` there two processes of two GPUs each.

What is per process: each child has its own models, batchers, shared-memory registrations
(registrations made over one keep-alive connection serve the requests of that connection, as
tritonclient uses them) and counters; with --metrics-port P child i serves its metrics on P + i.
Repository load/unload are refused (they would change one process only). SIGTERM/SIGINT drain
every child; the daemon is stopped only if this supervisor started it.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from .errors import RuntimeUserError

MPS_CONTROL = "nvidia-cuda-mps-control"
DEFAULT_PIPE_DIR = "/tmp/ngcx-mps/pipe"
DEFAULT_LOG_DIR = "/tmp/ngcx-mps/log"
READY_MARK = re.compile(r"serving model '|serving \d+ model")     # what a child prints once it serves
SKIP = {"mps", "processes", "port", "grpc_port", "metrics_port", "reuse_port", "func", "parser", "help", "gpus",
        "spread_gpus"}


class MpsUnavailable(RuntimeUserError):
    """MPS cannot run here (one line: what is missing and what to do)."""


def pipe_dirs(env: dict[str, str] | None = None) -> tuple[Path, Path]:
    env = os.environ if env is None else env
    return (Path(env.get("CUDA_MPS_PIPE_DIRECTORY") or DEFAULT_PIPE_DIR),
            Path(env.get("CUDA_MPS_LOG_DIRECTORY") or DEFAULT_LOG_DIR))


def daemon_running(pipe_dir: Path) -> bool:
    """A control daemon listens on pipe_dir/control: the socket exists and is not refusing connections
    (the file outlives a daemon that was told to quit: then connect is refused)."""
    control = pipe_dir / "control"
    try:
        if control.is_fifo():
            return True
        if not control.is_socket():
            return False
    except OSError:
        return False
    for kind in (socket.SOCK_STREAM, socket.SOCK_SEQPACKET):
        with socket.socket(socket.AF_UNIX, kind) as sock:
            sock.settimeout(2.0)
            try:
                sock.connect(str(control))
                return True
            except (ConnectionRefusedError, FileNotFoundError):
                return False
            except OSError:
                continue                  # another socket type (EPROTOTYPE): try the next
    return True


def gpu_present() -> bool:
    return bool(glob.glob("/dev/nvidia[0-9]*"))


def unavailable_reason(pipe_dir: Path) -> str | None:
    """Why MPS cannot be used here, or None."""
    if not gpu_present():
        return "this host has no NVIDIA GPU (/dev/nvidia0 is missing); MPS shares a GPU between processes"
    if daemon_running(pipe_dir):
        return None
    if shutil.which(MPS_CONTROL) is None:
        return (f"{MPS_CONTROL} is not installed and no MPS daemon runs at {pipe_dir} (set CUDA_MPS_PIPE_DIRECTORY "
                "to a running one, or start the server with `ngcx run --mps`, which starts it on the host)")
    return None


def _env(pipe_dir: Path, log_dir: Path) -> dict[str, str]:
    return {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(pipe_dir), "CUDA_MPS_LOG_DIRECTORY": str(log_dir)}


def start_daemon(pipe_dir: Path, log_dir: Path, timeout: float = 10.0) -> bool:
    """Start `nvidia-cuda-mps-control -d` unless one runs at pipe_dir; True when this call started it."""
    if daemon_running(pipe_dir):
        return False
    for d in (pipe_dir, log_dir):
        d.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([MPS_CONTROL, "-d"], env=_env(pipe_dir, log_dir), capture_output=True, text=True,
                          timeout=timeout)
    if proc.returncode != 0:
        why = " ".join((proc.stderr or proc.stdout or f"exit {proc.returncode}").split())[:200]
        raise MpsUnavailable(f"{MPS_CONTROL} -d failed: {why}; see {log_dir}/control.log")
    deadline = time.monotonic() + timeout
    while not daemon_running(pipe_dir):
        if time.monotonic() > deadline:
            raise MpsUnavailable(f"the MPS control daemon did not open {pipe_dir}/control in {timeout:g} s; see "
                                 f"{log_dir}/control.log")
        time.sleep(0.05)
    return True


def control(command: str, pipe_dir: Path, log_dir: Path, timeout: float = 10.0) -> str:
    """One command to the control daemon (e.g. get_server_list, quit); its answer."""
    proc = subprocess.run([MPS_CONTROL], input=command + "\n", env=_env(pipe_dir, log_dir), capture_output=True,
                          text=True, timeout=timeout)
    return proc.stdout.strip()


def stop_daemon(pipe_dir: Path, log_dir: Path, timeout: float = 10.0) -> None:
    """quit, then wait until the daemon no longer answers (it shuts its MPS server down first)."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        control("quit", pipe_dir, log_dir)
    deadline = time.monotonic() + timeout
    while daemon_running(pipe_dir) and time.monotonic() < deadline:
        time.sleep(0.1)


def child_argv(args: argparse.Namespace) -> list[str]:
    """The serve arguments a child gets: the supervisor's own, minus --mps/--processes and the ports."""
    parser: argparse.ArgumentParser = args.parser
    out: list[str] = []
    for action in parser._actions:              # noqa: SLF001 - argparse has no public list of its actions
        if action.dest in SKIP or not hasattr(args, action.dest):
            continue
        value = getattr(args, action.dest)
        if not action.option_strings:           # the positional MODEL
            if value is not None:
                out.append(str(value))
            continue
        flag = action.option_strings[-1]
        if isinstance(action, argparse._StoreTrueAction):    # noqa: SLF001
            if value:
                out.append(flag)
        elif isinstance(action, argparse._AppendAction):     # noqa: SLF001
            for item in value or []:
                out += [flag, str(item)]
        elif value is not None and value != action.default:
            out += [flag, str(value)]
    return out


def _reserve(host: str, port: int) -> socket.socket:
    """Bind (not listen) host:port with SO_REUSEPORT: picks the port for 0 and keeps it ours while children bind."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise RuntimeUserError(f"cannot listen on {host}:{port}: {exc.strerror or exc}; pick another port") from None
    return sock


class _Child:
    """One server process; its output is passed through prefixed with [i], and watched for readiness."""

    def __init__(self, index: int, argv: list[str], env: dict[str, str]):
        self.index = index
        self.ready = threading.Event()
        self.proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     bufsize=1, start_new_session=True)
        self.reader = threading.Thread(target=self._pump, name=f"ngcx-mps-{index}", daemon=True)
        self.reader.start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if READY_MARK.search(line):
                self.ready.set()
            sys.stdout.write(f"[{self.index}] {line}")
            sys.stdout.flush()

    def signal(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signum)


def supervise(args: argparse.Namespace) -> int:
    """Run N children behind one port until SIGTERM/SIGINT; exit 2 when one fails to start serving."""
    from .served import ServeError

    n = args.mps if args.mps is not None else args.processes
    pipe_dir, log_dir = pipe_dirs()
    if args.mps is not None:
        why = unavailable_reason(pipe_dir)
        if why:
            raise ServeError(f"--mps: MPS is unavailable here: {why}")
    reserved = [_reserve(args.host, args.port)]
    port = reserved[0].getsockname()[1]
    grpc_port = None
    if args.grpc_port is not None:
        reserved.append(_reserve(args.host, args.grpc_port))
        grpc_port = reserved[-1].getsockname()[1]
    started = start_daemon(pipe_dir, log_dir) if args.mps is not None else False
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    children: list[_Child] = []
    try:
        base = [sys.executable, "-m", "ngcx_runtime.serve", *child_argv(args), "--port", str(port), "--reuse-port"]
        if grpc_port is not None:
            base += ["--grpc-port", str(grpc_port)]
        env = _env(pipe_dir, log_dir) if args.mps is not None else dict(os.environ)
        env["PYTHONUNBUFFERED"] = "1"
        env.pop("NGCX_RUNTIME_MPS", None)             # the children serve; they do not supervise again
        env.setdefault("OMP_NUM_THREADS", str(thread_share(n)))
        shares = gpu_shares(args, n)
        for i in range(n):
            metrics = [] if args.metrics_port is None else ["--metrics-port",
                                                            str(args.metrics_port + i if args.metrics_port else 0)]
            children.append(_Child(i, base + metrics + shares[i], env))
        what = f"MPS daemon {'started' if started else 'joined'} at {pipe_dir}" if args.mps is not None else "no MPS"
        grpc = f", gRPC {args.host}:{grpc_port}" if grpc_port is not None else ""
        print(f"serve: {n} processes behind http://{args.host}:{port}{grpc} ({what}); ready once each has loaded",
              flush=True)
        return _watch(children, stop, n)
    finally:
        for child in children:
            child.signal(signal.SIGTERM)
        for child in children:
            try:
                child.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                child.signal(signal.SIGKILL)
        for sock in reserved:
            sock.close()
        if started:
            stop_daemon(pipe_dir, log_dir)


def gpu_shares(args: argparse.Namespace, n: int) -> list[list[str]]:
    """Each child's GPU flags: its share of the supervisor's placement (args.devices, serve._placement)."""
    from .placement import gpus_of, is_soft, split_for_processes

    devices = getattr(args, "devices", ()) or ()
    gpus = gpus_of(devices)
    if not gpus:
        return [[] for _ in range(n)]
    flag = "--spread-gpus" if is_soft(devices) else "--gpus"
    return [[flag, ",".join(map(str, share))] for share in split_for_processes(gpus, n)]


def thread_share(n: int) -> int:
    """The compute threads one of n children may use: the cores this process may run on, split n ways."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // n)


def _watch(children: list[_Child], stop: threading.Event, n: int) -> int:
    announced = False
    while not stop.wait(0.2):
        failed = [c for c in children if c.proc.poll() is not None]
        if failed:
            c = failed[0]
            print(f"serve: process {c.index} exited with {c.proc.returncode}; stopping the others", flush=True)
            return c.proc.returncode or 2
        if not announced and all(c.ready.is_set() for c in children):
            announced = True
            print(f"serve: all {n} processes are serving", flush=True)
    print(f"serve: signal received; draining {n} processes", flush=True)
    return 0


def describe(pipe_dir: Path | None = None) -> dict[str, Any]:
    """For tests and `info`: is MPS usable here, and why not."""
    pipe_dir = pipe_dir or pipe_dirs()[0]
    why = unavailable_reason(pipe_dir)
    return {"usable": why is None, "reason": why, "pipe_directory": str(pipe_dir),
            "daemon_running": daemon_running(pipe_dir)}
