"""A validated-catalog cache, so `ngcx render` and `ngcx catalog ls` do not re-validate an unchanged catalog.

Why: validation (pydantic schema + every compatibility rule) is most of what `ngcx render` costs, and
the same registry.yaml is validated again on every call. A catalog that passed is stored as plain
JSON data under $XDG_CACHE_HOME/ngcx (default ~/.cache/ngcx) and rebuilt from complete.py's
dataclasses without importing pydantic.

Why it cannot weaken validation: the key is the sha256 of the catalog file's exact bytes, the ngcx
version, and the source of every module that decides validity or the completed data (CODE_FILES).
A changed catalog has another key, so it is fully validated (and, if invalid, fails with the same
error; invalid catalogs are never stored). A changed rule or schema changes the key, too.

Why JSON and not pickle: a pickle runs code when loaded, and a cache folder is a place another user
or a stray tool might write to. JSON is data only. Beyond that, an entry is used only when (1) the
folder is a real folder (not a link) owned by this user and writable by no one else, (2) the file is a
regular file owned by this user and writable by no one else, (3) its header names the expected key
and (4) the sha256 of its body matches the header. Anything else (garbage, truncation, a foreign
owner, a missing or read-only folder) is a miss: the catalog is validated as if there were no cache,
and the entry is rewritten where the folder allows. The cache never makes a command fail.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.errors import UserError

if TYPE_CHECKING:
    from .complete import Catalog

FORMAT = "ngcx-cache 1"
MAX_ENTRY_BYTES = 4 << 20   # the shipped catalog's entry is ~40 KB
MAX_ENTRIES = 32            # per kind: tests and edits make many catalogs; keep the newest
# Modules whose code decides whether a catalog is valid or what the completed catalog holds.
# Paths under cli/ (the ngcx package folder).
CODE_FILES = ("catalog/patterns.py", "core/yamlio.py", "catalog/schema.py", "catalog/rules.py", "catalog/complete.py",
              "catalog/model.py", "catalog/cache.py")

# The shipped catalog, validated ahead of time (seeded_catalog says why; seed_entry writes it).
SEED = Path(__file__).with_name("registry.seed")

_code_digest: str | None = None


# ----------------------------------------------------------------------------- keys


def source_digest(files: list[Path] | tuple[Path, ...]) -> str:
    """sha256 over the ngcx version and the bytes of `files` (the code a cached result depends on)."""
    from .. import __version__

    h = hashlib.sha256(f"ngcx {__version__}\0".encode())
    for file in files:
        h.update(file.name.encode() + b"\0" + file.read_bytes() + b"\0")
    return h.hexdigest()


def code_digest() -> str:
    """The catalog code's digest, computed once per process."""
    global _code_digest
    if _code_digest is None:
        here = Path(__file__).resolve().parent.parent
        _code_digest = source_digest([here / name for name in CODE_FILES])
    return _code_digest


def catalog_key(raw: bytes) -> str:
    """The cache key of a catalog file's bytes under this ngcx and this validation code."""
    return hashlib.sha256(b"catalog\0" + code_digest().encode() + b"\0" + raw).hexdigest()


# ----------------------------------------------------------------------------- the folder and its entries


def cache_dir() -> Path:
    """$XDG_CACHE_HOME/ngcx, else ~/.cache/ngcx (may not exist yet)."""
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "ngcx"


def _private(st: os.stat_result) -> bool:
    """Owned by this user and writable by no one else: nobody but us can have put it there."""
    return st.st_uid == os.geteuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def _usable_dir(create: bool) -> Path | None:
    """The cache folder if it is a private real folder (created 0700 when `create`), else None."""
    try:
        folder = cache_dir()
        if create:
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = folder.lstat()
    except (OSError, RuntimeError):  # RuntimeError: no home directory to expand
        return None
    return folder if stat.S_ISDIR(st.st_mode) and _private(st) else None


def read_entry(kind: str, key: str) -> bytes | None:
    """The body stored under (kind, key), or None for a miss, a foreign file or a corrupt one."""
    folder = _usable_dir(create=False)
    if folder is None:
        return None
    try:
        fd = os.open(folder / f"{kind}-{key}", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or not _private(st) or st.st_size > MAX_ENTRY_BYTES:
            return None
        data = os.read(fd, MAX_ENTRY_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    return _checked(data, key)


def _checked(data: bytes, key: str) -> bytes | None:
    """The body of an entry (header line + body) if its header names `key` and the body's sha256, else None."""
    header, sep, body = data.partition(b"\n")
    if not sep or header != f"{FORMAT} {key} {hashlib.sha256(body).hexdigest()}".encode():
        return None
    return body


def _entry(key: str, body: bytes) -> bytes:
    """An entry as stored: the header _checked expects, then the body."""
    return f"{FORMAT} {key} {hashlib.sha256(body).hexdigest()}\n".encode() + body


def write_entry(kind: str, key: str, body: bytes) -> bool:
    """Store body under (kind, key) atomically (a reader never sees half a file); False when it cannot."""
    folder = _usable_dir(create=True)
    if folder is None:
        return False
    import tempfile  # only on a miss

    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{kind}-", dir=folder)  # mode 0600
        with os.fdopen(fd, "wb") as out:
            out.write(_entry(key, body))
        os.replace(tmp, folder / f"{kind}-{key}")
        tmp = None
    except OSError:
        return False
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
    _prune(folder, kind)
    return True


def _prune(folder: Path, kind: str) -> None:
    """Keep the newest MAX_ENTRIES entries of one kind: every edited catalog is a new key."""
    try:
        entries = [(e.stat().st_mtime_ns, e.path) for e in os.scandir(folder) if e.name.startswith(f"{kind}-")]
        for _, path in sorted(entries)[:-MAX_ENTRIES]:
            os.unlink(path)
    except OSError:
        pass


# ----------------------------------------------------------------------------- the catalog as plain data


def catalog_to_plain(cat: Catalog) -> dict[str, Any]:
    """What a cache entry holds: the completed catalog as JSON data (its source path is not stored)."""
    return {
        "releases": {image: {tag: asdict(rel) for tag, rel in rels.items()} for image, rels in cat.releases.items()},
        "images": {name: asdict(img) for name, img in cat.images.items()},
        "bases": {name: asdict(base) for name, base in cat.bases.items()},
        "spec": cat.spec_data,
    }


def _tuples(data: dict[str, Any]) -> dict[str, Any]:
    """JSON has lists only; the completed dataclasses hold tuples."""
    return {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}


def catalog_from_plain(data: dict[str, Any], source: str) -> Catalog:
    """Rebuild the Catalog that catalog_to_plain stored (any shape error raises: the caller treats it as a miss)."""
    from .complete import BaseInfo, Catalog, ImageInfo, Pin, Release, ReleaseInfo

    bases = {name: BaseInfo(**b) for name, b in data["bases"].items()}
    releases: dict[str, dict[str, Release]] = {}
    for image, rels in data["releases"].items():
        releases[image] = {}
        for tag, rel in rels.items():
            fields = _tuples(rel)
            fields["spec"] = ReleaseInfo(**_tuples(rel["spec"]))
            fields["base"] = BaseInfo(**rel["base"])
            fields["pins"] = tuple(Pin(**p) for p in rel["pins"])
            fields["framework"] = Pin(**rel["framework"]) if rel["framework"] else None
            releases[image][tag] = Release(**fields)
    images = {name: ImageInfo(**img) for name, img in data["images"].items()}
    return Catalog(source=source, releases=releases, images=images, bases=bases, spec_data=data["spec"])


# ----------------------------------------------------------------------------- the entry point


def _read_catalog(file: Path) -> bytes:
    """The catalog file's bytes; missing / unreadable -> one UserError line."""
    try:
        return file.read_bytes()
    except FileNotFoundError:
        raise UserError(f"catalog file {file} does not exist",
                        hint="pass an existing registry.yaml or omit the argument for the shipped one") from None
    except OSError as exc:
        raise UserError(f"cannot read catalog {file}: {exc.strerror or exc.__class__.__name__}") from None


def _decode(raw: bytes, file: Path) -> str:
    from ..core.yamlio import decode_text

    return decode_text(raw, f"catalog {file}", hint="save it as UTF-8, or check that this is the right file")


def cached_catalog(raw: bytes, source: str) -> Catalog | None:
    """The catalog validated earlier from exactly these bytes, or None (miss, foreign or corrupt entry)."""
    return _from_body(read_entry("catalog", catalog_key(raw)), source)


def seeded_catalog(raw: bytes, source: str) -> Catalog | None:
    """The catalog from the seed shipped with ngcx (SEED) if it was validated from exactly these bytes by this code.

    Why: a user's first `ngcx render` has an empty cache and paid ~0.1 s for pydantic-core, the schema and
    the rules (bench/results/cli.json, the cold rows) on the catalog ngcx ships, the same every time.
    The seed is an entry like the cache's, written by seed_entry and kept current by
    tests/catalog/test_catalog_cache.py; its key covers the catalog's bytes, the ngcx version and the
    validation code (catalog_key), so any edit of either misses it and validates as before.
    """
    try:
        data = SEED.read_bytes()
    except OSError:
        return None
    return _from_body(_checked(data, catalog_key(raw)), source)


def seed_entry(raw: bytes, source: str) -> bytes:
    """What SEED must hold for the catalog `raw`: validated now, stored as a cache entry (raises as validation does)."""
    from .model import validated_catalog

    cat = validated_catalog(_decode(raw, Path(source)), source)
    return _entry(catalog_key(raw), _plain_json(cat))


def _plain_json(cat: Catalog) -> bytes:
    return json.dumps(catalog_to_plain(cat), separators=(",", ":")).encode()


def _from_body(body: bytes | None, source: str) -> Catalog | None:
    if body is None:
        return None
    try:
        return catalog_from_plain(json.loads(body), source)
    except Exception:  # any malformed entry is a miss, never an error: it is validated again and rewritten
        return None


def load_catalog(path: str | Path | None = None) -> Catalog:
    """Load, validate and complete a catalog (default: the shipped registry.yaml), via the cache.

    Hit (the user's cache, else the shipped seed): the same Catalog a fresh load gives, without pydantic.
    Miss: read -> validate -> complete (model.validated_catalog raises CatalogInvalid / UserError exactly
    as without a cache), then stored.
    """
    from ..core import paths

    file = Path(path) if path else paths.registry_file()
    raw = _read_catalog(file)
    hit = cached_catalog(raw, str(file)) or seeded_catalog(raw, str(file))
    if hit is not None:
        return hit
    from .model import validated_catalog

    cat = validated_catalog(_decode(raw, file), str(file))
    write_entry("catalog", catalog_key(raw), _plain_json(cat))
    return cat
