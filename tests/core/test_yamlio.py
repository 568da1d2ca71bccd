"""The YAML loader: libyaml reads the files, the pure-Python loader words the errors (core/yamlio.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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


# ----------------------------------------------------------------------------- libyaml is used only where it agrees

ALPHABET = [*"ab: -[]{},'\"\n #&*|>%@`?!1.0\\\t~=<$\r", "  ", "- ", ": ", "\n  ", "a: ", "\n- ", "---", "...",
            "%YAML 1.1\n", "? ", "&x ", "*x", "<<: ", "0x1F", "1e3", "2001-12-14", ".inf", "null", "yes",
            "'a''b'", "\u00e9", "\u00a7", "\u2014", "\u4e2d", "\u00a0", "\ufeff", "\x85", "\u2028", "\U0001f600"]


def _pure_python(text: str) -> tuple[str, object]:
    try:
        return "ok", yaml.load(text, Loader=yamlio.SafeLimitedLoader)
    except yaml.YAMLError:
        return "error", None


@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(ALPHABET), max_size=40).map("".join))
def test_every_text_reads_as_the_pure_python_loader_reads_it(text: str) -> None:
    """libyaml reads some texts otherwise (a lone '!' is '' there and None in PyYAML; '|#' and a byte-order mark
    mid-line pass there only): load_yaml gives libyaml only text they read alike, so a file means one thing."""
    expected = _pure_python(text)
    try:
        got = ("ok", yamlio.load_yaml(text, "t.yaml"))
    except UserError:
        got = ("error", None)
    assert got == expected
