"""`ngcx dashboard`: every deployment, image and build of this machine's state, live in the browser."""

from __future__ import annotations

from typing import Annotated

import typer

from ..core.errors import UserError

EXTRA_HINT = "install the dashboard's extra: pip install 'ngcx[dashboard]'"
# The extra's modules (pyproject.toml [project.optional-dependencies] dashboard), imported before the server
# starts: server.py imports uvicorn only inside serve(), so a check of dashboard.server alone let a missing
# uvicorn end in a traceback (issue 46).
EXTRA_MODULES = ("starlette", "uvicorn", "prometheus_client")


def register(app: typer.Typer) -> None:
    app.command("dashboard")(dashboard_cmd)


def dashboard_cmd(
        port: Annotated[int, typer.Option("--port", min=0, max=65535, help="Port to listen on (0: a free one).")]
        = 8265,
        host: Annotated[str, typer.Option("--host", help="Address to listen on; loopback unless you widen it. "
                                                          "The printed token is needed on every request.")]
        = "127.0.0.1",
        open_browser: Annotated[bool, typer.Option("--open", help="Open the URL in the default browser.")] = False,
        interval: Annotated[float, typer.Option("--interval", min=0.2, max=60,
                                                help="Seconds between scrapes of each endpoint's /metrics.")]
        = 1.0) -> None:
    """A local web app over the state store and the deployments' live metrics (prints its URL with a token)."""
    _require_extra()
    from ..dashboard.server import serve

    serve(host, port, open_browser, interval)


def _require_extra() -> None:
    """One line naming the extra when any of its modules is missing, as the cloud SDK extras do
    (clouds/aws.py, clouds/aliyun.py EXTRA_HINT)."""
    import importlib

    for name in EXTRA_MODULES:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            raise UserError(f"ngcx dashboard needs {exc.name or name}, which is not installed",
                            hint=EXTRA_HINT) from None
