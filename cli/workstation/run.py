"""The docker run lines of `ngcx run IMAGE[:RELEASE] -- CMD...`: the same image, on this host's GPUs.

In a project folder (ngcx.yaml), `ngcx run` serves the project's image instead: it starts it on
localhost (all GPUs when present), waits until the model is loaded and warmed up, prints the URL
once, and stops the server on Ctrl-C (cli/project/serving.py).

`--mps N` (serving a model to many small clients): ngcx starts NVIDIA's MPS control daemon on this
host (pipe and log folders under /tmp/ngcx-mps, or CUDA_MPS_PIPE_DIRECTORY / _LOG_DIRECTORY), runs
the container in the host's IPC namespace with the pipe folder mounted, and sets NGCX_RUNTIME_MPS=N,
which makes `ngcx-runtime serve` inside start N server processes sharing the GPU behind one port.
Where MPS cannot run (no GPU, no nvidia-cuda-mps-control) it refuses with one line before docker runs.
The daemon keeps running after the container stops; `echo quit | nvidia-cuda-mps-control` ends it.

Why a driver check first: a CUDA 13 image on a 550 driver fails deep inside the framework
("CUDA driver version is insufficient") or, through NVIDIA_REQUIRE_CUDA, with a terse
nvidia-container-cli error. ngcx compares the host driver with the release's floor for the
host's GPU architecture before starting anything, and refuses naming both versions.
"""

from __future__ import annotations

from ..core.errors import UserError


def docker_run_argv(cli: str, tag: str, cmd: list[str], gpus: bool, interactive: bool,
                    ports: list[str], volumes: list[str], env: list[str], extra: list[str] | None = None) -> list[str]:
    argv = [cli, "run", "--rm", *(extra or [])]
    if interactive:
        argv.append("-it")
    if gpus:
        argv += ["--gpus", "all"]
    for p in ports:
        argv += ["-p", p]
    for v in volumes:
        argv += ["-v", v]
    for e in env:
        argv += ["-e", e]
    return [*argv, tag, *cmd]


def mps_docker_args(processes: int) -> tuple[list[str], list[str], list[str]]:
    """Start (or join) the host's MPS daemon; the docker run extras: (ipc/flags, volumes, env)."""
    from ngcx_runtime import mps

    pipe_dir, log_dir = mps.pipe_dirs()
    why = mps.unavailable_reason(pipe_dir)
    if why:
        raise UserError(f"--mps: MPS is unavailable on this host: {why}",
                        hint="run without --mps (one server process), or on a host with an NVIDIA GPU and driver")
    try:
        started = mps.start_daemon(pipe_dir, log_dir)
    except mps.MpsUnavailable as exc:
        raise UserError(f"--mps: {exc}") from None
    import sys

    print(f"ngcx: MPS control daemon {'started' if started else 'already running'} at {pipe_dir} "
          f"(stop it with `echo quit | CUDA_MPS_PIPE_DIRECTORY={pipe_dir} nvidia-cuda-mps-control`)", file=sys.stderr)
    return (["--ipc", "host"], [f"{pipe_dir}:{pipe_dir}"],
            [f"CUDA_MPS_PIPE_DIRECTORY={pipe_dir}", f"NGCX_RUNTIME_MPS={processes}"])
