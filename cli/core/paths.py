"""Where ngcx finds its data (catalog, recipes, images) and keeps its state.

Why two data locations: in a source checkout or editable install the catalog lives at the repo
root (the design card's layout); an installed wheel carries the same files as ngcx/_data.
State (SQLite, credentials, build contexts) lives outside the repo and outside any image.
"""

from __future__ import annotations

import os
from pathlib import Path


def data_dir() -> Path:
    """Folder holding registry.yaml, images/ and recipes/."""
    override = os.environ.get("NGCX_DATA_DIR")
    if override:
        return Path(override)
    here = Path(__file__).resolve().parent.parent   # the ngcx package folder (cli/ in a checkout)
    packaged = here / "_data"
    if (packaged / "registry.yaml").is_file():
        return packaged
    return here.parent


def registry_file() -> Path:
    return data_dir() / "registry.yaml"


def recipes_dir() -> Path:
    return data_dir() / "recipes"


def images_dir() -> Path:
    return data_dir() / "images"


def runtime_src_dir() -> Path:
    """The ngcx_runtime package source, copied into every build context (checkout or wheel)."""
    import ngcx_runtime

    return Path(ngcx_runtime.__file__).resolve().parent


def state_dir() -> Path:
    """Per-user state: $NGCX_STATE_DIR, else $XDG_STATE_HOME/ngcx, else ~/.local/state/ngcx."""
    override = os.environ.get("NGCX_STATE_DIR")
    if override:
        base = Path(override)
    else:
        xdg = os.environ.get("XDG_STATE_HOME")
        base = Path(xdg) / "ngcx" if xdg else Path.home() / ".local" / "state" / "ngcx"
    _ensure_dir(base, "NGCX_STATE_DIR", "state", mode=0o755, writable=True)
    return base


def config_dir() -> Path:
    """Per-user config (credentials file fallback): $NGCX_CONFIG_DIR or ~/.config/ngcx."""
    override = os.environ.get("NGCX_CONFIG_DIR")
    base = Path(override) if override else Path(
        os.environ.get("XDG_CONFIG_HOME", str(Path.home() / ".config"))) / "ngcx"
    _ensure_dir(base, "NGCX_CONFIG_DIR", "config", mode=0o700, writable=False)
    return base


def _ensure_dir(folder: Path, env_var: str, what: str, mode: int, writable: bool) -> None:
    """Create `folder` and require it to be writable, else one UserError line naming the override.

    Why here: every command reaches its state/config folder through these two functions, so an
    unwritable or impossible path (a read-only mount, a path under a regular file) fails once, with
    the fix, instead of as an OSError traceback from whichever command touched it first. The config
    folder is only read (config.toml), so a read-only one (a mounted ConfigMap) is fine.
    """
    from .errors import UserError

    try:
        folder.mkdir(parents=True, exist_ok=True, mode=mode)
    except OSError as exc:
        if folder.is_dir() and not writable:
            return
        raise UserError(f"cannot create the ngcx {what} folder {folder}: {exc.strerror}",
                        hint=f"set {env_var} to a writable folder") from None
    if writable and not os.access(folder, os.W_OK | os.X_OK):
        raise UserError(f"the ngcx {what} folder {folder} is not writable",
                        hint=f"fix its permissions, or set {env_var} to a writable folder")
