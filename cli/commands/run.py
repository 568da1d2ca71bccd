"""`ngcx run`: a catalog image or the project on this workstation (workstation/run.py, project/serving.py)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from ..core.errors import UserError
from ..workstation.run import docker_run_argv, mps_docker_args
from .options import CatalogOpt, Gpu, GpuOpt, ProjectFileOpt, VariantOpt


def register(app: typer.Typer) -> None:
    @app.command("run", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
    def run_cmd(
        ctx: typer.Context,
        ref: Annotated[str | None, typer.Argument(
            help="IMAGE[:RELEASE] or a local image tag; omit it in a project folder (ngcx.yaml).")] = None,
        project_file: ProjectFileOpt = None,
        port: Annotated[int, typer.Option("--port", help="Project mode: host port on 127.0.0.1.")] = 8000,
        detach: Annotated[bool, typer.Option("--detach", "-d", help="Project mode: leave it running.")] = False,
        variant: VariantOpt = "runtime",
        publish: Annotated[list[str] | None, typer.Option("-p", "--publish", help="Port mapping (repeatable).")] = None,
        volume: Annotated[list[str] | None, typer.Option("-v", "--volume", help="Bind mount (repeatable).")] = None,
        env: Annotated[list[str] | None, typer.Option("-e", "--env", help="Environment variable (repeatable).")] = None,
        gpu: GpuOpt = Gpu.auto,
        catalog_file: CatalogOpt = None,
        mps: Annotated[int | None, typer.Option(
            "--mps", min=1, help="Start the host's MPS daemon and let `ngcx-runtime serve` inside run N processes "
                                 "sharing the GPU behind one port.")] = None,
    ) -> None:
        """Run a command in an image on this host, with all its GPUs when it has NVIDIA GPUs."""
        import sys

        from ..catalog import load_catalog
        from ..core.engine import docker_cli, engine_client
        from ..workstation.host import check_driver, host_gpus, host_has_gpu, resolve_image

        if ref is None:
            if mps is not None:
                raise UserError("--mps applies to `ngcx run IMAGE -- ngcx-runtime serve ...` for now, not to a "
                                "project", hint="give the project's image tag as IMAGE, or drop --mps")
            return run_project(project_file, port, detach, gpu)
        tag = resolve_image(ref, variant, catalog_file)
        labels = engine_client().images.get(tag).labels or {}
        release = None
        if labels.get("ai.ngcx.image"):
            try:
                release = load_catalog(catalog_file).resolve(f"{labels['ai.ngcx.image']}:{labels['ai.ngcx.release']}")
            except UserError:
                release = None  # an image from another catalog: fall back to its labels
        use_gpu, why = host_has_gpu()
        if gpu == "off":
            use_gpu = False
        elif gpu == "require" and not use_gpu:
            raise UserError(f"--gpu require: {why}")
        if use_gpu:
            driver, gpus = host_gpus()
            check_driver(labels, release, driver, gpus)
        elif mps is not None:
            raise UserError(f"--mps needs the GPU: {why or '--gpu off'}", hint="drop --mps to run on the CPU")
        else:
            print(f"ngcx: {why or 'GPU off'}; running on the CPU", file=sys.stderr)
        extra, mps_volumes, mps_env = mps_docker_args(mps) if mps is not None else ([], [], [])
        cli = docker_cli()
        if cli is None:
            raise UserError("the docker CLI is not installed", hint="apt-get install docker.io")
        argv = docker_run_argv(cli, tag, list(ctx.args), use_gpu, sys.stdin.isatty() and sys.stdout.isatty(),
                               publish or [], [*(volume or []), *mps_volumes], [*(env or []), *mps_env], extra)
        os.execvp(argv[0], argv)


def run_project(project_file: Path | None, port: int, detach: bool, gpu_mode: str) -> None:
    """Serve the project here until Ctrl-C (or leave it running with --detach)."""
    import signal
    import sys
    import time

    from ..project import find_project_file
    from ..project.serving import start
    from ..project.spec import load_project
    from ..workstation.host import check_driver, host_gpus, host_has_gpu

    file = find_project_file(project_file) if project_file else find_project_file()
    if file is None:
        where = project_file or Path.cwd()
        raise UserError(f"no IMAGE given and no ngcx.yaml in {where}",
                        hint="give an image (`ngcx run cuda:24.05 -- nvidia-smi`) or run `ngcx init` here")
    project = load_project(file)
    use_gpu, why = host_has_gpu()
    if gpu_mode == "require" and not use_gpu:
        raise UserError(f"--gpu require: {why}")
    use_gpu = use_gpu and gpu_mode != "off"
    if use_gpu:
        driver, gpus = host_gpus()
        check_driver({}, project.release, driver, gpus)
    served = start(project, port=port, gpu=use_gpu)
    device = "all GPUs" if use_gpu else "CPU"
    print(f"ready: {served.url}/v2/models/{served.model} ({project.image_tag} on {device}, "
          f"ready in {served.ready_s:.1f} s)", flush=True)
    if detach:
        print(f"container {served.container.short_id}: stop and remove it with "
              f"`docker rm -f {served.container.short_id}`")
        return
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        for chunk in served.container.logs(stream=True, follow=True, since=int(time.time())):
            sys.stderr.write(chunk.decode(errors="replace"))
    except KeyboardInterrupt:
        pass
    finally:
        print("ngcx: stopping the server", file=sys.stderr)
        served.stop()


def _interrupt(_signum: int, _frame: object) -> None:
    """SIGTERM stops `ngcx run` the way Ctrl-C does: the server is stopped, not orphaned."""
    raise KeyboardInterrupt
