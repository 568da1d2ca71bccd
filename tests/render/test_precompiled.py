"""What the render stage ships ahead of time: the recipes compiled to Python, the image.yaml files checked and
the shipped catalog's Dockerfiles rendered.

A user must never notice either but in speed (issue 24: a cold `ngcx render` no slower than hpccm): what
they render is what Jinja2 renders from the sources, an edited recipe or image.yaml is read as it is now,
and a stale artifact is ignored. Both are kept current here like the goldens:
    NGCX_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/render/test_precompiled.py
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from jinja2 import Environment, FileSystemLoader

from ngcx.catalog import load_catalog
from ngcx.catalog.lockdata import is_locked
from ngcx.core import paths
from ngcx.render import dockerfile, precompiled, recipe, seed

COMPILED = Path(precompiled.__file__).with_name(precompiled.PACKAGE)
UPDATE = os.environ.get("NGCX_UPDATE_GOLDEN") == "1"
REWRITE = "NGCX_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/render/test_precompiled.py, then review the diff"


@pytest.fixture(autouse=True)
def _no_user_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("NGCX_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.delenv("NGCX_BASE", raising=False)
    monkeypatch.delenv("NGCX_DATA_DIR", raising=False)


def edit_app_recipe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ngcx's data (recipes, images, catalog) copied, app.j2 edited (one comment line first), and in use."""
    data = tmp_path / "data"
    shutil.copytree(paths.recipes_dir(), data / "recipes")
    shutil.copytree(paths.images_dir(), data / "images")
    shutil.copy(paths.registry_file(), data / "registry.yaml")
    shutil.copy(paths.registry_file().with_name("registry.lock.yaml"), data / "registry.lock.yaml")
    app = data / "recipes" / "app.j2"
    app.write_text("# edited app block\n" + app.read_text(encoding="utf-8"), encoding="utf-8")
    monkeypatch.setenv("NGCX_DATA_DIR", str(data))


def compiled_from_module(template) -> bool:
    """Whether a loaded template renders from a module under compiled/ (else Jinja2 compiled its source now)."""
    return (template.root_render_func.__module__ or "").startswith(f"ngcx.render.{precompiled.PACKAGE}.")


# ----------------------------------------------------------------------------- compiled recipes


def test_the_compiled_recipes_are_current() -> None:
    if UPDATE:
        precompiled.write(paths.recipes_dir(), COMPILED)
    want = precompiled.generate(paths.recipes_dir())
    have = {f.name: f.read_text(encoding="utf-8") for f in COMPILED.glob("*_j2.py")}
    assert sorted(have) == sorted(want), f"compiled/ does not match recipes/*.j2: {REWRITE}"
    stale = [name for name in want if have[name] != want[name]]
    assert stale == [], f"recipes changed since compiled: {REWRITE}"


def test_every_release_renders_what_jinja2_renders_from_the_sources(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every recipe comes from its module, and every release and variant renders byte for byte as
    Jinja2's own FileSystemLoader renders it from the sources."""
    env = precompiled.environment(paths.recipes_dir())
    names = sorted(f.name for f in paths.recipes_dir().glob("*.j2"))
    assert names and all(compiled_from_module(env.get_template(n)) for n in names)
    catalog = load_catalog()
    cases = [(r, v, catalog.image(r.image).description) for r in catalog.all_releases() for v in ("runtime", "devel")
             if is_locked(r, catalog.source)]  # a release without wheel hashes does not render
    fast = [dockerfile.render_uncached(*case[:2], None, case[2]) for case in cases]
    plain = Environment(loader=FileSystemLoader(str(paths.recipes_dir())), **precompiled.OPTIONS)
    monkeypatch.setattr(dockerfile, "_environment", lambda: plain)
    slow = [dockerfile.render_uncached(*case[:2], None, case[2]) for case in cases]
    assert len(cases) >= 8 and fast == slow


def test_an_edited_recipe_renders_from_its_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The module of an edited recipe is stale and not used; the unedited ones still are."""
    edit_app_recipe(tmp_path, monkeypatch)
    env = dockerfile._environment()
    assert not compiled_from_module(env.get_template("app.j2"))
    assert compiled_from_module(env.get_template("cuda.j2"))
    release = load_catalog().resolve("cuda:24.05")
    assert "\n# edited app block\n" in dockerfile.render_uncached(release, "runtime", None, "d")


def test_other_options_or_another_jinja2_miss_every_module(monkeypatch: pytest.MonkeyPatch) -> None:
    source = (paths.recipes_dir() / "cuda.j2").read_text(encoding="utf-8")
    before = precompiled.stamp(source)
    monkeypatch.setitem(precompiled.OPTIONS, "trim_blocks", False)
    assert precompiled.stamp(source) != before
    monkeypatch.undo()
    import jinja2

    monkeypatch.setattr(jinja2, "__version__", "0.0.0")
    assert precompiled.stamp(source) != before
    assert not compiled_from_module(precompiled.environment(paths.recipes_dir()).get_template("cuda.j2"))


# ----------------------------------------------------------------------------- checked image.yaml files


def test_the_recipe_seed_is_current() -> None:
    want = recipe.seed(paths.images_dir())
    if UPDATE:
        recipe.SEED.write_text(want, encoding="utf-8")
    assert recipe.SEED.read_text(encoding="utf-8") == want, f"an image.yaml or its checks changed: {REWRITE}"


@pytest.mark.parametrize("image", sorted(p.parent.name for p in paths.images_dir().glob("*/image.yaml")))
def test_a_seeded_recipe_is_the_recipe_a_fresh_check_gives(image: str) -> None:
    file = paths.images_dir() / image / "image.yaml"
    assert recipe._seeded(image, file.read_bytes()) is not None, "the seed does not hold this image"
    fresh = recipe.Recipe(name=image, tests_dir=file.parent / "tests", **recipe._checked(file.read_bytes(), file))
    assert recipe.load_recipe(image) == fresh


def test_an_edited_image_yaml_is_read_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "data"
    shutil.copytree(paths.images_dir(), data / "images")
    file = data / "images" / "cuda" / "image.yaml"
    file.write_text(file.read_text(encoding="utf-8").replace("apt: []", "apt: [curl]"), encoding="utf-8")
    monkeypatch.setenv("NGCX_DATA_DIR", str(data))
    assert recipe._seeded("cuda", file.read_bytes()) is None
    assert recipe.load_recipe("cuda").apt == ("curl",)


def test_a_cold_load_of_a_shipped_recipe_reads_no_yaml() -> None:
    probe = "import sys, ngcx.render.recipe as r; r.load_recipe('pytorch'); print('yaml' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "False", proc.stdout + proc.stderr


# ----------------------------------------------------------------------------- the shipped Dockerfiles, rendered


def test_the_dockerfile_seed_is_current() -> None:
    """It holds exactly what rendering the shipped catalog gives now (every release x variant x base)."""
    want = seed.pack(dockerfile.seed_texts(load_catalog()))
    if UPDATE:
        seed.SEED.write_bytes(want)
    assert seed.SEED.read_bytes() == want, f"a recipe, image.yaml, the catalog or the render code changed: {REWRITE}"


def test_a_first_render_of_a_shipped_release_imports_no_jinja2_and_prints_what_jinja2_renders(
        tmp_path: Path) -> None:
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "empty-cache")}
    probe = ("import sys; from ngcx.commands.render import render_command; render_command('pytorch:24.11'); "
             "print('jinja2' in sys.modules, file=sys.stderr)")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0 and proc.stderr.strip() == "False", proc.stderr
    catalog = load_catalog()
    release = catalog.resolve("pytorch:24.11")
    assert proc.stdout == dockerfile.render_uncached(release, "runtime", None, catalog.image("pytorch").description)


def test_an_edited_recipe_or_a_users_base_misses_the_seed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    catalog = load_catalog()
    release = catalog.resolve("cuda:24.05")
    description = catalog.image("cuda").description
    assert seed.lookup(dockerfile.render_inputs(release, "runtime", None, description)) is not None
    assert seed.lookup(dockerfile.render_inputs(release, "runtime", "example.com/my-base:1", description)) is None
    edit_app_recipe(tmp_path, monkeypatch)
    assert seed.lookup(dockerfile.render_inputs(release, "runtime", None, description)) is None
    assert "\n# edited app block\n" in dockerfile.render_dockerfile(release, "runtime", None, catalog)


def test_another_jinja2_misses_the_seed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The key holds Jinja2's __init__.py (its version): another release of Jinja2 renders afresh."""
    import jinja2

    inputs = dockerfile.render_inputs(load_catalog().resolve("cuda:24.05"), "runtime", None,
                                      load_catalog().image("cuda").description)
    assert seed.lookup(inputs) is not None
    other = tmp_path / "jinja2" / "__init__.py"
    other.parent.mkdir()
    other.write_bytes(Path(jinja2.__file__).read_bytes().replace(jinja2.__version__.encode(), b"9.9.9"))
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib

    importlib.invalidate_caches()
    monkeypatch.delitem(sys.modules, "jinja2")
    assert seed.lookup(inputs) is None
