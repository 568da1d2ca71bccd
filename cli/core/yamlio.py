"""The one YAML loader for every file the CLI reads (registry.yaml, images/*/image.yaml, ngcx.yaml).

Why one loader with limits (issue 8): these files are user input. PyYAML's composer recurses once
per nesting level, so `a: [[[[...` 100 000 deep was a RecursionError traceback; anchors and aliases
share nodes, so a "billion laughs" file is small on disk but expands exponentially for every
consumer that walks it (pydantic, json output); a 5000-digit integer or a timestamp like 2001-13-45
raised ValueError from deep inside PyYAML. Here each of those is a UserError naming file:line and
the fix. Only YAML's safe tags are constructed (SafeLoader): `!!python/object...` is an error,
never executed.

Why two loaders: PyYAML's pure-Python scanner and parser took 0.052 s to read registry.yaml in a
cold `ngcx render`, libyaml's C ones 0.007 s (in process; the whole command: BENCHMARKS.md#cli). The
fast loader keeps the Python composer and constructor, so every limit above holds unchanged; only
tokens and events come from C. It reads only text both parsers read alike (`_ALIKE`: fuzzing found
them apart on tags, complex keys, byte-order marks and other non-ASCII line breaks); a file it
refuses is read again by the pure-Python one, whose messages name the offending character
(libyaml's: "found character that cannot start any token"), so an error reads the same either way.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from .errors import UserError

MAX_BYTES = 1 << 20  # the shipped catalog is ~11 KB; PyYAML reads ~1 MB/s
MAX_DEPTH = 64  # the catalog nests 5 levels deep
MAX_NODES = 100_000  # nodes after expanding every alias (the catalog has ~730)


def decode_text(raw: bytes, what: str, hint: str = "save it as UTF-8") -> str:
    """A YAML file's bytes as text with universal newlines, exactly as Path.read_text gives it (the caches
    and seeds key on the bytes, so the files are read as bytes first); not UTF-8 -> one UserError line."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{what} is not UTF-8 text (byte {exc.start})", hint=hint) from None
    return text.replace("\r\n", "\n").replace("\r", "\n")


class _Limits:
    """Refuses duplicate keys, deep nesting and alias bombs, and reports where (mixed into both loaders)."""

    _depth = 0

    def _start_limits(self) -> None:
        self._depth = 0
        self._sizes: dict[int, int] = {}  # id(node) -> node count with aliases expanded

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        """Compose iteratively-bounded: the composer recurses once per level, so cap the levels."""
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise yaml.composer.ComposerError(
                    None, None, f"nesting deeper than {MAX_DEPTH} levels (a catalog needs about 5; "
                    "look for an unclosed [ or {)", self.peek_event().start_mark)
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        if self._expanded_size(node) > MAX_NODES:
            raise yaml.composer.ComposerError(
                None, None, f"aliases expand to more than {MAX_NODES} values (an alias bomb?); "
                "write the values out or use fewer aliases", node.start_mark)
        return node

    def _expanded_size(self, node: yaml.Node) -> int:
        """Nodes under `node` counting every alias use; children are already sized (composed first)."""
        size = self._sizes.get(id(node))
        if size is None:
            if isinstance(node, yaml.MappingNode):
                children = [n for pair in node.value for n in pair]
            elif isinstance(node, yaml.SequenceNode):
                children = node.value
            else:
                children = []
            size = 1 + sum(self._sizes.get(id(c), 1) for c in children)
            self._sizes[id(node)] = size
        return size

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        """Scalars PyYAML accepts but Python refuses (5000-digit ints, month 13) -> a marked error."""
        try:
            return super().construct_object(node, deep=deep)
        except (ValueError, OverflowError) as exc:
            value = node.value if isinstance(node, yaml.ScalarNode) else node.tag
            shown = value if len(value) <= 40 else value[:37] + "..."
            reason = "too many digits" if "digits" in str(exc) else str(exc).splitlines()[0]
            raise yaml.constructor.ConstructorError(
                None, None, f"cannot read value {shown!r}: {reason}; quote it if it is text", node.start_mark) from None


class SafeLimitedLoader(_Limits, yaml.SafeLoader):
    """The pure-Python SafeLoader with the limits: its error messages are the ones users see."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._start_limits()


if yaml.__with_libyaml__:
    from yaml.composer import Composer
    from yaml.constructor import SafeConstructor
    from yaml.cyaml import CParser
    from yaml.resolver import Resolver

    class FastLimitedLoader(_Limits, Composer, CParser, SafeConstructor, Resolver):
        """libyaml's scanner and parser under the same Python composer, constructor and limits."""

        def __init__(self, stream: str) -> None:
            CParser.__init__(self, stream)
            Composer.__init__(self)
            SafeConstructor.__init__(self)
            Resolver.__init__(self)
            self._start_limits()

    LOADERS: tuple[type, ...] = (FastLimitedLoader, SafeLimitedLoader)
else:  # pragma: no cover - PyYAML wheels ship libyaml; a source build without it is only slower
    LOADERS = (SafeLimitedLoader,)


# What libyaml and PyYAML read alike (fuzzed: tests/core/test_yamlio.py): lines of printable characters
# (no tab, CR, byte-order mark, NEL or Unicode line separator: the parsers split lines differently) without
# a tag ('!': libyaml reads a lone '!' as '', PyYAML as None), a complex key ('?') or a block scalar header
# running into a comment ('|#', which only libyaml accepts). Anything else goes to the pure-Python loader.
_ALIKE = re.compile(r"[^\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029\ufeff\ud800-\udfff]*\Z")
_UNLIKE = re.compile(r"[!?]|[|>][-+0-9]*#")


def _libyaml_reads_alike(text: str) -> bool:
    return bool(_ALIKE.match(text)) and not _UNLIKE.search(text)


def _read(text: str, call: Any) -> Any:
    """call(text, Loader=...) (yaml.load or yaml.compose) by libyaml where it reads alike, else by the
    pure-Python loader; a libyaml error is read again there, for its message (the error path only)."""
    if _libyaml_reads_alike(text):
        try:
            return call(text, Loader=LOADERS[0])
        except yaml.YAMLError:
            pass
    return call(text, Loader=SafeLimitedLoader)


def _construct_mapping(loader: _Limits, node: yaml.MappingNode, deep: bool = False) -> dict:
    """Refuse duplicate keys (PyYAML silently keeps the last one, hiding a second release)."""
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        line = key_node.start_mark.line + 1
        try:
            duplicate = key in seen
        except TypeError:  # a list or mapping used as a key: unhashable
            raise yaml.constructor.ConstructorError(
                None, None, "a list or mapping cannot be a key", key_node.start_mark) from None
        if duplicate:
            raise yaml.constructor.ConstructorError(
                None, None,
                f"duplicate key {key!r} (first at line {seen[key]}); each image and release may appear once",
                key_node.start_mark,
            )
        seen[key] = line
    return loader.construct_mapping(node, deep=deep)


for _loader in LOADERS:
    _loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_yaml(text: str, source: str) -> Any:
    """YAML text -> plain data; anything malformed or over the limits -> UserError with file:line."""
    if len(text) > MAX_BYTES:
        raise UserError(f"{source}: {len(text)} characters is too large for a YAML file here "
                        f"(limit {MAX_BYTES})", hint="check that this is the right file")
    try:
        return _read(text, yaml.load)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        problem = " ".join((exc.problem or str(exc)).split())
        raise UserError(f"{where}: malformed YAML: {problem}", hint="fix the YAML syntax at that line") from None
    except yaml.YAMLError as exc:
        raise UserError(f"{source}: malformed YAML: {' '.join(str(exc).split())}") from None


def read_text(file: Path, hint: str) -> str:
    """A YAML file the user wrote, as text; unreadable or not UTF-8 -> one UserError line."""
    try:
        return file.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{file} is not UTF-8 text (byte {exc.start})", hint="save it as UTF-8") from None
    except OSError as exc:
        raise UserError(f"cannot read {file}: {exc.strerror or exc}", hint=hint) from None


def load_mapping_with_lines(text: str, source: str, expected: str) -> tuple[dict, dict[tuple, int]]:
    """A YAML mapping plus {path: line} for every key and list item, so a schema error can say
    file:line (ngcx.yaml, examples.yaml). `expected` says what the top level must be, for the error."""
    from .problems import Problem, ProblemsFound

    data = load_yaml(text, source)
    if not isinstance(data, dict):
        raise ProblemsFound(source, [Problem(source, "", "parse.not-a-mapping", f"the file must be {expected}",
                                             "`ngcx init --model PATH` writes a starting point")])
    lines: dict[tuple, int] = {}
    _index(_read(text, yaml.compose), (), lines)
    return data, lines


def _index(node: yaml.Node | None, path: tuple, lines: dict[tuple, int]) -> None:
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            sub = (*path, key.value)
            lines[sub] = key.start_mark.line + 1
            _index(value, sub, lines)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            lines[(*path, i)] = item.start_mark.line + 1
            _index(item, (*path, i), lines)
