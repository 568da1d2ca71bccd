"""Generate cli/clouds/aliyun_models.yaml from Alibaba Cloud's generated v2 SDKs (issue 47).

Why a generated data file and not the SDKs at run time: the v2 packages (alibabacloud-<product><version>) are
the official API metadata rendered as Python, one package per product AND version (ECS alone is ~30 MB of
models). ngcx needs only what they say about each request: the action, its version and method, every
parameter's wire name and shape (scalar, repeat list `X.N`, struct list `X.N.Y`, struct `X.Y`, map, JSON
string), the required ones and each product's endpoint data. So this script, run by hand when ngcx calls a
new product or version, reads the packages and writes that into one YAML file; cli/clouds/aliyun_models.py
checks every request against it (the CLI before sending, the emulators on receipt, the conformance test on
the record), and neither the CLI nor CI installs the SDKs.

How: wire names come from the models' own to_map() (each field set alone to a probe value, so the key it
writes is its wire name), shapes from __init__'s type hints, JSON style from the client's
`array_to_string_with_specified_style(tmp_req.x, 'X', 'json')` (the `*_shrink` fields), required fields from
validate()'s validate_required calls (older packages) or the generated comment line "This parameter is
required." (newer packages dropped validate_required; the comment is the metadata's `required: true`).

Run: pip install --target /tmp/alisdk alibabacloud-ecs20140526 ... (the list in PACKAGES), then
    PYTHONPATH=/tmp/alisdk python scripts/aliyun_models.py > cli/clouds/aliyun_models.yaml
"""

from __future__ import annotations

import importlib
import inspect
import re
import sys
import typing
from importlib import metadata
from typing import Any

import yaml

# (product code, API version, package module): every product/version ngcx or its emulators call.
PACKAGES = [
    ("ecs", "2014-05-26", "alibabacloud_ecs20140526"),
    ("alb", "2020-06-16", "alibabacloud_alb20200616"),
    ("ess", "2014-08-28", "alibabacloud_ess20140828"),
    ("ess", "2022-02-22", "alibabacloud_ess20220222"),
    ("ram", "2015-05-01", "alibabacloud_ram20150501"),
    ("sts", "2015-04-01", "alibabacloud_sts20150401"),
    ("cms", "2019-01-01", "alibabacloud_cms20190101"),
    ("cr", "2018-12-01", "alibabacloud_cr20181201"),
    ("cr", "2016-06-07", "alibabacloud_cr20160607"),
    ("kms", "2016-01-20", "alibabacloud_kms20160120"),
]
# ECS has ~700 actions; only these families keep their parameter shapes (the rest keep their name, method
# and required list, so an unknown action is still told from a known one). Grow it when ngcx calls more.
ECS_SHAPED = re.compile(r"Instance|Image|SecurityGroup|Vpc|VSwitch|Region|Zone|Command|Invocation|"
                        r"AvailableResource|Tag|KeyPair|Disk|Snapshot|LaunchTemplate")
REQUIRED_LINE = re.compile(r"^\s*# This parameter is required\.\s*$")


def _hints(cls: type) -> dict[str, Any]:
    module = sys.modules[cls.__module__]
    namespace = dict(vars(module))
    package = cls.__module__.split(".")[0]
    namespace.setdefault("main_models", importlib.import_module(f"{package}.models"))
    return typing.get_type_hints(cls.__init__, globalns=namespace)


def _probe(hint: Any) -> Any:
    origin = typing.get_origin(hint)
    if origin in (list, typing.List):  # noqa: UP006 - the SDKs annotate with typing.List
        return [_probe(typing.get_args(hint)[0])]
    if origin in (dict, typing.Dict):  # noqa: UP006
        return {"k": "v"}
    if inspect.isclass(hint) and hasattr(hint, "to_map"):
        return hint()
    return "x"


def shape(hint: Any) -> Any:
    """'s' scalar, 'map', ['s'] repeat list, [{...}] struct list, {...} struct."""
    origin = typing.get_origin(hint)
    if origin in (list, typing.List):  # noqa: UP006
        return [shape(typing.get_args(hint)[0])]
    if origin in (dict, typing.Dict):  # noqa: UP006
        return "map"
    if inspect.isclass(hint) and hasattr(hint, "to_map"):
        return fields(hint)[0]
    return "s"


def fields(cls: type) -> tuple[dict[str, Any], list[str]]:
    """(wire name -> shape, required wire names) of one model class."""
    hints = {k: v for k, v in _hints(cls).items() if k != "return"}
    out: dict[str, Any] = {}
    wire_of: dict[str, str] = {}
    empty = cls().to_map()
    for attr, hint in hints.items():
        probe = cls()
        setattr(probe, attr, _probe(hint))
        written = [k for k, v in probe.to_map().items() if v is not None and v != empty.get(k)]
        if len(written) != 1:
            continue
        wire_of[attr] = written[0]
        out[written[0]] = shape(hint)
    required = sorted(wire_of[a] for a in _required_attrs(cls) if a in wire_of)
    return out, required


def _required_attrs(cls: type) -> list[str]:
    found = re.findall(r"validate_required\(self\.(\w+),", inspect.getsource(cls.validate))
    lines = inspect.getsource(cls.__init__).splitlines()
    for n, line in enumerate(lines):
        if REQUIRED_LINE.match(line) and n + 1 < len(lines):
            match = re.match(r"\s*self\.(\w+) = ", lines[n + 1])
            if match:
                found.append(match[1])
    return found


def _operations(client_source: str) -> dict[str, dict[str, Any]]:
    """Action -> {method, pathname, style, json: [wire names]} from the client's *_with_options bodies."""
    ops: dict[str, dict[str, Any]] = {}
    for body in re.split(r"\n    def ", client_source):
        head = body.split("(", 1)[0]
        if not head.endswith("_with_options") or head.endswith("_async"):
            continue
        action = re.search(r"action ?= ?'(\w+)'", body) or re.search(r"do_\w*request\('(\w+)'", body)
        if not action:
            continue
        method = (re.search(r"method ?= ?'(\w+)'", body)
                  or re.search(r"do_\w*request\('\w+', '[^']+', '\w+', '(\w+)'", body))
        path = re.search(r"pathname ?= ?f?'([^']*)'", body)
        style = re.search(r"style ?= ?'(\w+)'", body)
        json_names = re.findall(r"array_to_string_with_specified_style\(tmp_req\.\w+, '([^']+)', 'json'\)", body)
        ops[action[1]] = {"method": method[1] if method else "POST", "path": path[1] if path else "/",
                          "style": style[1] if style else "RPC", "json": json_names}
    return ops


def product(code: str, version: str, package: str) -> dict[str, Any]:
    client = importlib.import_module(f"{package}.client")
    models = importlib.import_module(f"{package}.models")
    source = inspect.getsource(client)
    rule = re.search(r"self\._endpoint_rule = '(\w*)'", source)
    endpoint_map = re.search(r"self\._endpoint_map = (\{.*?\})", source, re.S)
    actions: dict[str, Any] = {}
    for action, op in sorted(_operations(source).items()):
        entry: dict[str, Any] = {"method": op["method"]}
        if op["style"] != "RPC":
            entry["style"], entry["path"] = op["style"], op["path"]
        request = getattr(models, f"{action}Request", None)
        if request is not None:
            params, required = fields(request)
            for name in op["json"]:
                params[name] = "json"
            if code != "ecs" or ECS_SHAPED.search(action):
                entry["params"] = params
            else:
                entry["params"] = "unchecked"
            if required:
                entry["required"] = required
        else:
            entry["params"] = {}
        actions[action] = entry
    return {"package": f"{package.replace('_', '-')}=={metadata.version(package.replace('_', '-'))}",
            "endpoint_rule": rule[1] if rule else "regional",
            "endpoints": eval(endpoint_map[1]) if endpoint_map else {},  # noqa: S307 - a dict literal of the SDK
            "actions": actions}


def main() -> None:
    out: dict[str, Any] = {}
    for code, version, package in PACKAGES:
        out.setdefault(code, {})[version] = product(code, version, package)
    sys.stdout.write("# Generated by scripts/aliyun_models.py from Alibaba Cloud's v2 SDK packages; do not edit.\n")
    yaml.safe_dump(out, sys.stdout, sort_keys=True, default_flow_style=None, width=200)


if __name__ == "__main__":
    main()
