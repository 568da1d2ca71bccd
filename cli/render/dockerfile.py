"""Behind `ngcx render`: catalog release -> Dockerfile (and a build context) from the Jinja2 recipes.

Why templates + data: the catalog says WHAT is pinned, images/NAME/image.yaml says WHICH recipe
blocks make the image, and recipes/*.j2 say HOW each layer is written. Layer order is chosen for
caching: the OS packages every image needs, then python, then the heavy CUDA wheels, the image's
own OS packages, the framework, devel tools, the small fast-changing ngcx-runtime, and the app
layer (tests, labels, entrypoint) last. Everything up to the CUDA wheels depends only on the base,
python and the CUDA stack, so every image on one stack shares those layers (stored and pulled once).
"""

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ngcx_runtime import __version__

from .recipe import BASE_APT, PACKAGES_BLOCK, STACK_BLOCKS, Recipe, image_packages, load_recipe

if TYPE_CHECKING:

    from ..catalog.model import Catalog, Release

# The OS packages only devel images add (recipes/devel.j2).
DEVEL_APT = ("build-essential", "python3-dev", "git", "pkg-config")


def _config_base() -> str | None:
    """The user's base preference: $NGCX_BASE, else `base = ...` under [build] in config.toml."""
    env = os.environ.get("NGCX_BASE")
    if env:
        return env
    from ..core import paths

    file = paths.config_dir() / "config.toml"
    if not file.is_file():
        return None
    import tomllib  # here, not above: most calls have no config file (and render is a hot path)

    try:
        return tomllib.loads(file.read_text()).get("build", {}).get("base")
    except tomllib.TOMLDecodeError as exc:
        from ..core.errors import UserError

        raise UserError(f"{file}: malformed TOML: {exc}") from None


def resolve_base(release: "Release", base: str | None) -> str:
    """Which image to build FROM.

    `--base offline` (or config/env NGCX_BASE=offline) picks the catalog's offline base, the
    tag `ngcx base bootstrap` makes; `--base IMAGE` any image; default: the catalog's public base.
    """
    from ..core.errors import UserError

    choice = base or _config_base()
    if not choice:
        return release.base.image
    if choice == "offline":
        if not release.base.offline:
            raise UserError(f"{release.ref}: base profile {release.spec.base!r} has no offline base",
                            hint="pass --base IMAGE explicitly")
        return release.base.offline
    if any(c.isspace() for c in choice) or choice.startswith("-"):
        raise UserError(f"--base {choice!r} is not an image reference")
    return choice


def _environment():
    """The recipes' Jinja2 environment, rendering from the precompiled modules where they are current."""
    from ..core import paths
    from .precompiled import environment

    return environment(paths.recipes_dir())


def render_dockerfile(release: "Release", variant: str = "runtime", base: str | None = None,
                      catalog: "Catalog | None" = None) -> str:
    """The Dockerfile text for one release and variant.

    A text rendered before from exactly the same inputs (see render_inputs) comes from the cache
    (ngcx/catalog/cache.py: private folder, checksummed entries), else from the Dockerfiles shipped rendered
    (seed.py: the shipped catalog's), which spares importing Jinja2 on every `ngcx render`; anything else
    renders and is stored.
    """
    from ..core import naming
    from ..core.errors import UserError

    if variant not in naming.VARIANTS:
        raise UserError(f"unknown variant {variant!r}", hint=f"use one of {', '.join(naming.VARIANTS)}")
    description = catalog.image(release.image).description if catalog else release.image
    source = catalog.source if catalog else None
    inputs = render_inputs(release, variant, base, description, source)
    key = _cache_key(inputs) if inputs is not None else None
    if inputs is None or key is None:
        return render_uncached(release, variant, base, description, source)
    from ..catalog import cache
    from . import seed

    body = cache.read_entry("dockerfile", key)
    if body is not None:
        return body.decode()
    seeded = seed.lookup(inputs)
    if seeded is not None:
        return seeded
    text = render_uncached(release, variant, base, description, source)
    cache.write_entry("dockerfile", key, text.encode())
    return text


def render_uncached(release: "Release", variant: str, base: str | None, description: str,
                    catalog_source: str | None = None, *, pinned: bool = True) -> str:
    """Render Dockerfile.j2 (no cache): recipe checks first, then the base, then the wheel hashes, as users see
    the errors. `pinned=False` leaves out this machine's base pin (basepin.py): what the shipped seeds hold."""
    from ..catalog.lockdata import release_lock
    from ..core.errors import UserError

    recipe = load_recipe(release.image)
    if "framework" in recipe.blocks and release.framework is None:
        raise UserError(f"{release.ref}: image recipe has a framework block but the release pins no framework")
    packages = image_packages(recipe)
    base_image = resolve_base(release, base)
    lock = release_lock(release, catalog_source)
    text = _environment().get_template("Dockerfile.j2").render(
        release=release, variant=variant, blocks=layer_blocks(recipe, release), recipe=recipe,
        base_image=base_image, base_id=_base_id(base_image) if pinned else None, lock=lock,
        apt_packages=sorted(BASE_APT), image_packages=packages,
        devel_packages=sorted(DEVEL_APT),
        labels=release.labels(), description=description, runtime_version=__version__,
        site=f"/opt/ngcx/venv/lib/python{release.spec.python}/site-packages",
    )
    return _tidy(text)


def seed_texts(catalog: "Catalog") -> dict[str, str]:
    """What seed.SEED holds for `catalog` (the shipped one): {seed key: Dockerfile} for every release x variant x
    base (the catalog's public one and its offline one), rendered now; a release without wheel hashes (its index
    unreachable when `ngcx catalog lock` ran) does not render, so it has none."""
    from ..catalog.lockdata import is_locked
    from ..core import naming
    from . import seed

    texts = {}
    for release in filter(lambda r: is_locked(r, catalog.source), catalog.all_releases()):
        description = catalog.image(release.image).description
        for variant in naming.VARIANTS:
            for base in (None, "offline") if release.base.offline else (None,):
                inputs = render_inputs(release, variant, base, description, pinned=False)
                if inputs is None:
                    raise OSError(f"{release.ref}: the render's inputs cannot be read")
                texts[seed.key(inputs)] = render_uncached(release, variant, base, description, pinned=False)
    return texts


def layer_blocks(recipe: Recipe, release: "Release") -> list[str]:
    """The blocks to render, in layer order: image.yaml's, less a framework the release does not pin,
    with the image's own OS packages (if any) right after the stack blocks (base, python, cuda).

    Why there and not in the base apt layer: a layer is shared only when every layer under it is the
    same, so one extra package in the first apt RUN (pytorch's gcc) would make each image on a CUDA
    stack store and pull its own copy of the ~2 GB CUDA wheels. After the CUDA layer, before the
    framework, the packages still come before the heavy framework wheels that may need them."""
    blocks = [b for b in recipe.blocks if b != "framework" or release.framework]
    if image_packages(recipe):
        at = next(i for i, b in enumerate(blocks) if b not in STACK_BLOCKS)  # blocks end with "app"
        blocks.insert(at, PACKAGES_BLOCK)
    return blocks


# The code a rendered Dockerfile depends on besides the templates: this module (packages, _tidy),
# naming (labels, variants) and the completed catalog (Release.labels, pins).
RENDER_CODE = ("render/dockerfile.py", "core/naming.py", "catalog/complete.py", "catalog/patterns.py",
               "catalog/lockdata.py", "render/basepin.py")  # under cli/


def _base_id(base_image: str) -> str | None:
    """The image ID this machine recorded for the base tag (basepin.py), for the rendered pin; a digest reference
    or an unrecorded base has none."""
    from . import basepin

    return None if "@" in base_image else basepin.recorded(base_image)


def render_inputs(release: "Release", variant: str, base: str | None, description: str,
                  catalog_source: str | None = None, *, pinned: bool = True) -> str | None:
    """sha256 of every input of render_uncached but Jinja2, or None (render without the cache) when one cannot
    be read.

    Inputs: the release's completed data, variant, the resolved base image and its recorded ID (unless not
    `pinned`), the description, the release's wheel hashes (catalog/lockdata.py), the image's image.yaml bytes,
    every file under recipes/ (templates include each other), and the code in RENDER_CODE with the ngcx version.
    Errors are never cached: on any problem here (no hashes included) the uncached path runs and reports it.
    """
    import json
    from dataclasses import asdict

    from ..catalog.cache import source_digest
    from ..catalog.lockdata import release_lock
    from ..core import paths
    from ..core.errors import UserError

    here = Path(__file__).resolve().parent.parent
    try:
        h = hashlib.sha256(b"dockerfile\0" + source_digest([here / f for f in RENDER_CODE]).encode())
        base_image = resolve_base(release, base)
        lock = asdict(release_lock(release, catalog_source))
        h.update(json.dumps([asdict(release), variant, base_image, description, lock,
                             _base_id(base_image) if pinned else None], sort_keys=True).encode())
        h.update(b"\0image.yaml\0" + (paths.images_dir() / release.image / "image.yaml").read_bytes())
        recipes = paths.recipes_dir()
        for file in sorted(p for p in recipes.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
            h.update(b"\0" + file.relative_to(recipes).as_posix().encode() + b"\0" + file.read_bytes())
    except (OSError, UserError):
        return None
    return h.hexdigest()


def _cache_key(inputs: str) -> str | None:
    """The user cache's key: the inputs and Jinja2's installed file (an upgrade may render differently)."""
    try:
        return hashlib.sha256(f"{inputs}\0{_module_stamp('jinja2')}".encode()).hexdigest()
    except OSError:
        return None


def _module_stamp(name: str) -> str:
    """Where an installed package is, with its size and mtime: changes when pip replaces it; no import."""
    from importlib.util import find_spec

    spec = find_spec(name)
    if spec is None or not spec.origin:
        raise OSError(f"{name} is not installed")
    st = os.stat(spec.origin)
    return f"{spec.origin}\0{st.st_size}\0{st.st_mtime_ns}"


def _tidy(text: str) -> str:
    """Collapse runs of blank lines the block includes leave behind."""
    out: list[str] = []
    for line in text.splitlines():
        if not line.strip() and out and not out[-1].strip():
            continue
        out.append(line.rstrip())
    return "\n".join(out).strip() + "\n"


def runtime_package_files() -> dict[str, bytes]:
    """ngcx_runtime sources + a rendered pyproject, as the build context's ngcx-runtime/ folder."""
    from ..core import paths

    src = paths.runtime_src_dir()
    files: dict[str, bytes] = {}
    packages = []
    for path in sorted(src.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        rel = path.relative_to(src)
        files[f"ngcx_runtime/{rel.as_posix()}"] = path.read_bytes()
        if path.name == "__init__.py":
            packages.append(".".join(("ngcx_runtime", *rel.parent.parts)))
    pyproject = _environment().get_template("runtime-pyproject.toml.j2").render(
        version=__version__, packages=sorted(packages))
    files["pyproject.toml"] = pyproject.encode()
    return files


@dataclass(frozen=True)
class Context:
    """A build context on disk: Dockerfile, ngcx-runtime/, tests/."""

    path: Path
    dockerfile: Path
    digest: str  # sha256 of the Dockerfile text, recorded with each build


def write_context(release: "Release", out_dir: Path, variant: str = "runtime", base: str | None = None,
                  catalog: "Catalog | None" = None) -> Context:
    """Materialize the build context. Nothing secret is ever written here.

    A folder that is a file, is unwritable, or holds anything but an earlier ngcx context is one
    UserError (exit 2): `--context .` in a project must never wipe the project.
    """
    from ..core.errors import UserError

    text = render_dockerfile(release, variant, base, catalog)
    recipe = load_recipe(release.image)
    try:
        _clear_context_dir(out_dir)
        return _fill_context(out_dir, text, recipe)
    except OSError as exc:
        raise UserError(f"cannot write the build context {out_dir}: {exc.strerror or exc.__class__.__name__}",
                        hint="pass --context a new folder you can write to") from None


def _clear_context_dir(out_dir: Path) -> None:
    """Empty an earlier context (it has ngcx-runtime/); refuse any other non-empty folder or a file."""
    from ..core.errors import UserError

    if out_dir.exists() and not out_dir.is_dir():
        raise UserError(f"--context {out_dir} is a file, not a folder", hint="pass a new or empty folder")
    if not out_dir.is_dir() or not any(out_dir.iterdir()):
        return
    if not (out_dir / "ngcx-runtime").is_dir():
        raise UserError(f"--context {out_dir} is a non-empty folder that is not an ngcx build context; "
                        "refusing to delete what is in it", hint="pass a new or empty folder")
    import shutil  # here and below, not at the top: `ngcx render` to stdout is a hot path

    # ngcx-runtime/ goes last, so an interrupted clean still looks like a context to the next run.
    for child in sorted(out_dir.iterdir(), key=lambda p: p.name == "ngcx-runtime"):
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


def _fill_context(out_dir: Path, text: str, recipe: Recipe) -> Context:
    """Write ngcx-runtime/ first (it marks the folder as a context), the Dockerfile last."""
    (out_dir / "ngcx-runtime").mkdir(parents=True)
    for rel, data in runtime_package_files().items():
        target = out_dir / "ngcx-runtime" / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    tests = out_dir / "tests"
    if recipe.tests_dir.is_dir():
        import shutil

        shutil.copytree(recipe.tests_dir, tests, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    else:
        tests.mkdir()
    (out_dir / ".dockerignore").write_text("**/__pycache__\n**/*.pyc\n")
    dockerfile = out_dir / "Dockerfile"
    dockerfile.write_text(text)
    return Context(out_dir, dockerfile, hashlib.sha256(text.encode()).hexdigest())
