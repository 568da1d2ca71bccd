"""The YAML loader: libyaml reads the files, the pure-Python loader words the errors (core/yamlio.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from ngcx.core import paths, yamlio
from ngcx.core.errors import UserError

REPO = Path(__file__).resolve().parents[2]
YAML_FILES = [paths.registry_file(), *sorted(paths.images_dir().glob("*/image.yaml")),
              *sorted((REPO / "examples").glob("**/*.yaml"))]


def test_the_fast_loader_is_libyaml_where_pyyaml_has_it() -> None:
    """The speed of a cold `ngcx render` depends on it: a silent fall back to pure Python is 7x slower."""
    assert yaml.__with_libyaml__, "PyYAML without libyaml: install the wheel, not a source build"
    assert yamlio.LOADERS[0] is yamlio.FastLimitedLoader and yamlio.LOADERS[-1] is yamlio.SafeLimitedLoader


@pytest.mark.parametrize("file", YAML_FILES, ids=lambda f: str(f.relative_to(REPO)))
def test_both_loaders_read_the_shipped_files_alike(file: Path) -> None:
    text = file.read_text(encoding="utf-8")
    assert yaml.load(text, Loader=yamlio.FastLimitedLoader) == yaml.load(text, Loader=yamlio.SafeLimitedLoader)


@pytest.mark.parametrize(("text", "message"), [
    ("a:\n\t- 1\n", "t.yaml:2:1: malformed YAML: found character '\\t' that cannot start any token"),
    ("a: [1, 2\n", "t.yaml:2:1: malformed YAML: expected ',' or ']', but got '<stream end>'"),
    ("a: 1\na: 2\n", "t.yaml:2:1: malformed YAML: duplicate key 'a' (first at line 1); each image and release "
                     "may appear once"),
])
def test_an_error_names_what_the_pure_python_loader_names(text: str, message: str) -> None:
    """libyaml says "found character that cannot start any token"; users are told which character."""
    with pytest.raises(UserError) as caught:
        yamlio.load_yaml(text, "t.yaml")
    assert str(caught.value) == message + " (fix the YAML syntax at that line)"
