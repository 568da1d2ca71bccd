"""The validated-catalog cache and the rendered-Dockerfile cache (issue 13: `ngcx render` as fast as hpccm).

What a user must never notice: a cached catalog is the same Catalog a fresh validation gives; an
edited catalog is validated again (an invalid edit fails with the same line as without a cache);
a garbage, foreign or half-written cache entry is ignored and rewritten; an unusable cache folder
changes nothing but speed. And a cached Dockerfile is never stale: editing a recipe, an image.yaml
or the base choice renders anew. Every test gets its own XDG_CACHE_HOME.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ngcx.catalog import cache
from ngcx.catalog.model import validated_catalog
from ngcx.core import paths
from ngcx.core.errors import UserError

SHIPPED = paths.registry_file()
# An edit the rules refuse: torch 2.8.0 is built for CUDA 12.8, the 24.11 release pins CUDA 12.4.
BAD_EDIT = ("framework: torch==2.5.1", "framework: torch==2.8.0")


@pytest.fixture(autouse=True)
def _own_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private cache folder per test; the user's state, config, base and data dir stay out."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("NGCX_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("NGCX_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.delenv("NGCX_BASE", raising=False)
    monkeypatch.delenv("NGCX_DATA_DIR", raising=False)
    return tmp_path / "cache" / "ngcx"


def ngcx(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """The real CLI in a subprocess, with the test's environment plus `env`."""
    proc = subprocess.run([sys.executable, "-m", "ngcx", *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **env})
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def catalog_entries(folder: Path) -> list[Path]:
    return sorted(folder.glob("catalog-*")) if folder.is_dir() else []


def copy_catalog(tmp_path: Path, text: str | None = None) -> Path:
    """The shipped catalog (or `text`) in a file of its own; one trailing comment makes its bytes another
    catalog's than the shipped one, which the seed holds ready (tests below: the user's cache at work)."""
    file = tmp_path / "registry.yaml"
    file.write_text(text if text is not None else SHIPPED.read_text(encoding="utf-8") + "# a copy\n", encoding="utf-8")
    return file


def edit(file: Path, old: str, new: str) -> None:
    text = file.read_text(encoding="utf-8")
    assert text.count(old) == 1, old
    file.write_text(text.replace(old, new), encoding="utf-8")


# ----------------------------------------------------------------------------- hits


def test_a_hit_is_the_catalog_a_fresh_validation_gives(tmp_path: Path, _own_dirs: Path) -> None:
    file = copy_catalog(tmp_path)
    fresh = validated_catalog(file.read_text(encoding="utf-8"), str(file))
    first = cache.load_catalog(file)                 # miss: validated, then stored
    assert len(catalog_entries(_own_dirs)) == 1
    hit = cache.cached_catalog(file.read_bytes(), str(file))
    assert hit is not None, "the stored entry was not used"
    assert hit == fresh == first
    assert hit.spec == fresh.spec                    # the lazily re-validated schema model, too
    assert [r.labels() for r in hit.all_releases()] == [r.labels() for r in fresh.all_releases()]
    assert cache.load_catalog(file) == fresh


# ----------------------------------------------------------------------------- the shipped seed


def test_the_shipped_seed_is_current() -> None:
    """cli/catalog/registry.seed holds the shipped catalog validated by this code; NGCX_UPDATE_GOLDEN=1 rewrites it."""
    want = cache.seed_entry(SHIPPED.read_bytes(), str(SHIPPED))
    if os.environ.get("NGCX_UPDATE_GOLDEN") == "1":
        cache.SEED.write_bytes(want)
    assert cache.SEED.read_bytes() == want, (
        "registry.yaml or the validation code changed: NGCX_UPDATE_GOLDEN=1 .venv/bin/python -m pytest "
        "tests/catalog/test_catalog_cache.py -k seed, then review the diff")


def test_the_seed_is_the_catalog_a_fresh_validation_gives(_own_dirs: Path) -> None:
    """An empty cache loads the shipped catalog from the seed: the same Catalog, nothing validated, nothing stored."""
    seeded = cache.seeded_catalog(SHIPPED.read_bytes(), str(SHIPPED))
    assert seeded is not None, "the seed does not match the shipped catalog"
    fresh = validated_catalog(SHIPPED.read_text(encoding="utf-8"), str(SHIPPED))
    assert cache.load_catalog() == seeded == fresh
    assert [r.labels() for r in seeded.all_releases()] == [r.labels() for r in fresh.all_releases()]
    assert catalog_entries(_own_dirs) == []


@pytest.mark.parametrize("damage", ["missing", "other-catalog", "flipped-byte"])
def test_a_seed_that_does_not_match_is_validated_as_before(damage: str, tmp_path: Path, _own_dirs: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A seed for other bytes (an edited catalog or rule, another version) or a damaged one is a miss, never used."""
    seed = tmp_path / "registry.seed"
    data = cache.SEED.read_bytes()
    if damage == "other-catalog":
        seed.write_bytes(cache.seed_entry(copy_catalog(tmp_path).read_bytes(), "x"))
    elif damage == "flipped-byte":
        seed.write_bytes(data.replace(b"9.1.0.70", b"9.1.0.71", 1))
    monkeypatch.setattr(cache, "SEED", seed)
    assert cache.seeded_catalog(SHIPPED.read_bytes(), str(SHIPPED)) is None
    assert cache.load_catalog() == validated_catalog(SHIPPED.read_text(encoding="utf-8"), str(SHIPPED))
    assert len(catalog_entries(_own_dirs)) == 1      # validated, then stored in the user's cache


def test_a_warm_render_imports_neither_pydantic_nor_jinja2_and_prints_the_same(tmp_path: Path) -> None:
    """The point of the cache: the second `ngcx render` skips validation and templating, same bytes.
    A cold one of the shipped catalog reads the seeds (no pydantic-core, no YAML, no Jinja2), and of an edited
    catalog validates with pydantic-core alone: building pydantic models was 0.15-0.30 s of it."""
    probe = ("import sys, ngcx.catalog, ngcx.render.dockerfile as r; c = ngcx.catalog.load_catalog({}); "
             "t = r.render_dockerfile(c.resolve('pytorch:24.11'), 'runtime', None, c); "
             "print(sorted({{'pydantic', 'pydantic_core', 'jinja2', 'yaml'}} & set(sys.modules)))")

    def imported(catalog: Path | None) -> str:
        """The heavy modules one load + render imports; each catalog its own cache (same Dockerfile, same key)."""
        folder = tmp_path / ("edited" if catalog else "shipped")
        proc = subprocess.run([sys.executable, "-c", probe.format(repr(str(catalog)) if catalog else "")],
                              capture_output=True, text=True, timeout=120,
                              env={**os.environ, "XDG_CACHE_HOME": str(folder)})
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.strip()

    assert imported(None) == "[]"                           # cold, seeded: the catalog and its Dockerfiles
    assert imported(None) == "[]"                                               # warm
    edited = copy_catalog(tmp_path)
    # cold, validated; its releases are the shipped ones, so their Dockerfiles are still the seed's
    assert imported(edited) == "['pydantic_core', 'yaml']"
    assert imported(edited) == "[]"
    first, second = ngcx("render", "pytorch:24.11"), ngcx("render", "pytorch:24.11")
    uncached = ngcx("render", "pytorch:24.11", XDG_CACHE_HOME=str(SHIPPED))  # a file: no cache at all
    assert first.returncode == second.returncode == uncached.returncode == 0
    assert first.stdout == second.stdout == uncached.stdout
    assert first.stdout.startswith("# Generated by `ngcx render pytorch:24.11")


# ----------------------------------------------------------------------------- edits are validated


def test_an_invalid_edit_fails_with_the_same_line_as_without_a_cache(tmp_path: Path, _own_dirs: Path) -> None:
    file = copy_catalog(tmp_path)
    assert ngcx("catalog", "ls", "--catalog", str(file)).returncode == 0   # cached while valid
    assert len(catalog_entries(_own_dirs)) == 1
    edit(file, *BAD_EDIT)
    warm = ngcx("render", "pytorch:24.11", "--catalog", str(file))
    cold = ngcx("render", "pytorch:24.11", "--catalog", str(file), XDG_CACHE_HOME=str(tmp_path / "empty"))
    assert warm.returncode == cold.returncode == 2
    assert warm.stdout == "" and warm.stderr == cold.stderr
    assert warm.stderr.startswith(f"ngcx: error: catalog {file} is invalid: pytorch:24.11: ")
    assert "torch 2.8.0 is built for CUDA 12.8" in warm.stderr
    assert len(catalog_entries(_own_dirs)) == 1, "an invalid catalog was stored"
    with pytest.raises(UserError, match="is invalid"):
        cache.load_catalog(file)


def test_a_valid_edit_is_seen_at_once(tmp_path: Path) -> None:
    file = copy_catalog(tmp_path)
    assert "PyTorch (PyPI wheels" in ngcx("catalog", "show", "pytorch:24.11", "--catalog", str(file)).stdout
    edit(file, "description: PyTorch (PyPI wheels,", "description: Edited torch (PyPI wheels,")
    shown = ngcx("catalog", "show", "pytorch:24.11", "--catalog", str(file))
    assert "Edited torch (PyPI wheels" in shown.stdout
    rendered = ngcx("render", "pytorch:24.11", "--catalog", str(file))
    assert 'description="Edited torch (PyPI wheels' in rendered.stdout


# ----------------------------------------------------------------------------- bad entries, bad folders


@pytest.mark.parametrize("damage", ["garbage", "empty", "truncated", "flipped-byte", "wrong-shape", "other-key"])
def test_a_corrupt_entry_is_ignored_and_rewritten(damage: str, tmp_path: Path, _own_dirs: Path) -> None:
    file = copy_catalog(tmp_path)
    good = cache.load_catalog(file)
    [entry] = catalog_entries(_own_dirs)
    data = entry.read_bytes()
    key = cache.catalog_key(file.read_bytes())
    if damage == "garbage":
        entry.write_bytes(b"\x00\xff not a cache entry")
    elif damage == "empty":
        entry.write_bytes(b"")
    elif damage == "truncated":
        entry.write_bytes(data[: len(data) // 2])
    elif damage == "flipped-byte":      # a changed value under an unchanged checksum
        entry.write_bytes(data.replace(b"9.1.0.70", b"9.1.0.71", 1))
    elif damage == "wrong-shape":       # a well-formed entry whose body is not a catalog
        cache.write_entry("catalog", key, b'{"releases": 1}')
    else:                               # another catalog's entry under this name
        entry.write_bytes(data.replace(key.encode(), b"0" * 64, 1))
    assert cache.cached_catalog(file.read_bytes(), str(file)) is None
    again = cache.load_catalog(file)
    assert again == good
    assert entry.read_bytes() == data, "the entry was not rewritten"
    assert cache.cached_catalog(file.read_bytes(), str(file)) == good


def test_an_entry_others_could_write_is_not_trusted(tmp_path: Path, _own_dirs: Path) -> None:
    file = copy_catalog(tmp_path)
    good = cache.load_catalog(file)
    [entry] = catalog_entries(_own_dirs)
    entry.chmod(0o666)
    assert cache.cached_catalog(file.read_bytes(), str(file)) is None
    assert cache.load_catalog(file) == good
    assert entry.stat().st_mode & 0o777 == 0o600      # replaced by a private one
    assert cache.cached_catalog(file.read_bytes(), str(file)) == good


def test_a_shared_or_linked_cache_folder_is_not_used(tmp_path: Path, _own_dirs: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    file = copy_catalog(tmp_path)
    cache.load_catalog(file)
    assert _own_dirs.stat().st_mode & 0o777 == 0o700
    _own_dirs.chmod(0o777)
    assert cache.cached_catalog(file.read_bytes(), str(file)) is None
    _own_dirs.chmod(0o700)
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "ngcx").symlink_to(_own_dirs)
    monkeypatch.setenv("XDG_CACHE_HOME", str(linked))
    assert cache.cached_catalog(file.read_bytes(), str(file)) is None
    before = sorted(p.name for p in _own_dirs.iterdir())
    assert cache.load_catalog(file) == validated_catalog(file.read_text(encoding="utf-8"), str(file))
    assert sorted(p.name for p in _own_dirs.iterdir()) == before, "wrote through a symlinked folder"


def test_an_unwritable_cache_folder_changes_nothing_but_speed(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("x")
    under_a_file = str(blocker / "cache")
    ls = ngcx("catalog", "ls", XDG_CACHE_HOME=under_a_file)
    assert ls.returncode == 0 and "pytorch:24.11" in ls.stdout, ls.stderr
    rendered = ngcx("render", "pytorch:24.11", XDG_CACHE_HOME=under_a_file)
    assert rendered.returncode == 0 and rendered.stdout == ngcx("render", "pytorch:24.11").stdout
    bad = copy_catalog(tmp_path)
    edit(bad, *BAD_EDIT)
    refused = ngcx("catalog", "ls", "--catalog", str(bad), XDG_CACHE_HOME=under_a_file)
    assert refused.returncode == 2 and "torch 2.8.0 is built for CUDA 12.8" in refused.stderr


def test_old_entries_are_pruned(tmp_path: Path, _own_dirs: Path) -> None:
    """Every edited catalog is a new key: the folder keeps the newest MAX_ENTRIES, not all."""
    for n in range(cache.MAX_ENTRIES + 3):
        assert cache.write_entry("catalog", f"{n:064x}", b"{}")
    assert len(catalog_entries(_own_dirs)) == cache.MAX_ENTRIES


# ----------------------------------------------------------------------------- the rendered Dockerfile


def data_copy(tmp_path: Path) -> Path:
    """registry.yaml, images/ and recipes/ in a folder of their own, for NGCX_DATA_DIR."""
    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(SHIPPED, data / "registry.yaml")
    shutil.copy(SHIPPED.with_name("registry.lock.yaml"), data / "registry.lock.yaml")
    for folder in ("images", "recipes"):
        shutil.copytree(paths.data_dir() / folder, data / folder)
    return data


def test_a_rendered_dockerfile_is_never_stale(tmp_path: Path) -> None:
    data = data_copy(tmp_path)
    env = {"NGCX_DATA_DIR": str(data)}
    first = ngcx("render", "pytorch:24.11", **env).stdout
    assert ngcx("render", "pytorch:24.11", **env).stdout == first
    app = data / "recipes" / "app.j2"
    app.write_text("# edited app block\n" + app.read_text())
    assert "# edited app block" in ngcx("render", "pytorch:24.11", **env).stdout
    edit(data / "images" / "pytorch" / "image.yaml", "cmd: [info]", "cmd: [serve]")
    assert 'CMD ["serve"]' in ngcx("render", "pytorch:24.11", **env).stdout
    assert "FROM ${BASE_IMAGE}" in first and "ARG BASE_IMAGE=debian:bookworm-slim" in first
    based = ngcx("render", "pytorch:24.11", **env, NGCX_BASE="registry.example/debian:12").stdout
    assert "ARG BASE_IMAGE=registry.example/debian:12" in based
    variant = ngcx("render", "pytorch:24.11", "--variant", "devel", **env).stdout
    assert "build-essential" in variant and "build-essential" not in first


def test_a_render_error_is_not_cached(tmp_path: Path) -> None:
    data = data_copy(tmp_path)
    env = {"NGCX_DATA_DIR": str(data)}
    recipe = data / "images" / "pytorch" / "image.yaml"
    good = recipe.read_text()
    recipe.write_text(good + "bogus: 1\n")
    for _ in range(2):
        proc = ngcx("render", "pytorch:24.11", **env)
        assert proc.returncode == 2 and "unknown key(s) bogus" in proc.stderr
    recipe.write_text(good)
    assert ngcx("render", "pytorch:24.11", **env).returncode == 0


def test_entries_are_json_data_not_pickles(tmp_path: Path, _own_dirs: Path) -> None:
    cache.load_catalog(copy_catalog(tmp_path))
    [entry] = catalog_entries(_own_dirs)
    header, _, body = entry.read_bytes().partition(b"\n")
    assert header.startswith(cache.FORMAT.encode() + b" ")
    assert set(json.loads(body)) == {"releases", "images", "bases", "spec"}
