"""Alibaba Cloud API calls for deploy: credentials, endpoint, one call with ngcx's own retries.

Why not the SDK's retry: aliyun-python-sdk-core re-sends a RunInstances answered 5xx with a new
nonce and NO ClientToken (its `_add_request_client_token` is dead code, cloud-apis.md §3), which
can create a second billed instance. So the client is made with auto_retry=False and this module
retries — reads freely, writes only when they carry a ClientToken — with full-jitter backoff on
Throttling and 5xx until a deadline. Capacity errors (HTTP 403 NoStock, ZoneNotSupported, §5.1)
become CapacityError for the failover in aliyun.py; a wrong key or secret is one line without it.

Credentials the standard way: ALIBABA_CLOUD_ACCESS_KEY_ID / ALIBABA_CLOUD_ACCESS_KEY_SECRET, else
the `aliyun` CLI's ~/.aliyun/config.json (profile $ALIBABA_CLOUD_PROFILE or its `current`).
NGCX_ALIYUN_ECS_ENDPOINT=HOST:PORT points ECS, ACR, RAM, ALB and ESS calls at another server (tests: the
emulator in tests/emulators); plain http is used only for loopback, every other endpoint is https.
The SDKs are an extra (`pip install 'ngcx[aliyun]'`), imported on first use.
Issue 47: every request is checked against Alibaba's own API models before it leaves (checked(),
aliyun_models.py) and goes to the host the product's SDK endpoint data name (aliyun_models.endpoint:
ESS's main regions use the central ess.aliyuncs.com, RAM is global); what changed and why:
ALIYUN_API_NOTES.md beside this file.
"""

from __future__ import annotations

import ipaddress
import json
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.errors import CapacityError, UserError
from .aliyun_models import endpoint

EXTRA_HINT = "install the Alibaba Cloud SDKs: pip install 'ngcx[aliyun]'"
CAPACITY_CODES = {"OperationDenied.NoStock", "Zone.NotOnSale", "InvalidInstanceType.ZoneNotSupported",
                  "InvalidInstanceType.NotSupported", "InvalidResourceType.NotSupported", "InstanceType.Offline",
                  "CategoryNotSupported", "OperationDenied.ZoneNotAllowed"}
RETRY_CODES = {"Throttling", "Throttling.User", "Throttling.Api", "ServiceUnavailable", "InternalError",
               "UnknownError", "SDK.HttpError", "SDK.ServerUnreachable"}
AUTH_CODES = {"InvalidAccessKeyId.NotFound", "InvalidAccessKeyId.Inactive", "InvalidAccessKeySecret",
              "SignatureDoesNotMatch", "IncompleteSignature"}
BASE_BACKOFF_S, MAX_BACKOFF_S = 0.5, 20.0
ECS_VERSION, ALB_VERSION, ESS_VERSION, RAM_VERSION = "2014-05-26", "2020-06-16", "2022-02-22", "2015-05-01"
CR_VERSION, CR_PERSONAL_VERSION = "2018-12-01", "2016-06-07"
DEPLOY_NEEDS = ("; deploys also need cr:GetAuthorizationToken, ram:CreateRole/CreatePolicy/AttachPolicyToRole/"
                "ListPoliciesForRole and ram:PassRole")
ALB_NEEDS = ("; services also need alb:Create*/Get*/List*/Delete*, alb:AddServersToServerGroup, "
             "alb:RemoveServersFromServerGroup and alb:GetListenerHealthStatus")
ESS_NEEDS = ("; scaling groups also need ess:Create*/Describe*/Modify*/Delete*/Enable*, ess:CompleteLifecycleAction "
             "and ess:ListTagResources")


@dataclass(frozen=True)
class AliyunCredentials:
    access_key_id: str
    access_key_secret: str
    source: str                 # where they came from, for messages (never the secret itself)
    region: str | None = None   # the profile's region, when the config file names one

    def __repr__(self) -> str:  # a traceback or debug print must not show the secret
        return f"AliyunCredentials({self.access_key_id!r}, source={self.source!r})"


def credentials() -> AliyunCredentials:
    """Environment first (as the aliyun CLI and SDKs do), then ~/.aliyun/config.json."""
    ak, secret = os.environ.get("ALIBABA_CLOUD_ACCESS_KEY_ID"), os.environ.get("ALIBABA_CLOUD_ACCESS_KEY_SECRET")
    if ak and secret:
        return AliyunCredentials(ak, secret, "the ALIBABA_CLOUD_ACCESS_KEY_* variables")
    if ak or secret:
        missing = "ALIBABA_CLOUD_ACCESS_KEY_SECRET" if ak else "ALIBABA_CLOUD_ACCESS_KEY_ID"
        raise UserError(f"{missing} is not set (its partner is)", hint="set both, or neither to use ~/.aliyun")
    return _profile_credentials(Path.home() / ".aliyun" / "config.json")


def _profile_credentials(path: Path) -> AliyunCredentials:
    hint = "set ALIBABA_CLOUD_ACCESS_KEY_ID and ALIBABA_CLOUD_ACCESS_KEY_SECRET, or run `aliyun configure`"
    if not path.is_file():
        raise UserError("no Alibaba Cloud credentials: no ALIBABA_CLOUD_ACCESS_KEY_* variables and no "
                        f"{path}", hint=hint)
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UserError(f"{path} is not readable JSON ({type(exc).__name__})", hint=hint) from None
    wanted = os.environ.get("ALIBABA_CLOUD_PROFILE") or config.get("current") or "default"
    profiles = {p.get("name"): p for p in config.get("profiles", []) if isinstance(p, dict)}
    profile = profiles.get(wanted)
    if profile is None:
        raise UserError(f"{path} has no profile {wanted!r} (it has: {', '.join(map(str, profiles)) or 'none'})",
                        hint="set ALIBABA_CLOUD_PROFILE to one of them")
    ak, secret = profile.get("access_key_id"), profile.get("access_key_secret")
    if not ak or not secret:
        raise UserError(f"profile {wanted!r} in {path} has no access_key_id/access_key_secret "
                        f"(mode {profile.get('mode', '?')!r}; ngcx reads AK profiles)", hint=hint)
    return AliyunCredentials(ak, secret, f"profile {wanted!r} in {path}", profile.get("region_id"))


def endpoint_override() -> tuple[str, int, str] | None:
    """(host, port, scheme) from NGCX_ALIYUN_ECS_ENDPOINT, or None for the SDK's own endpoints."""
    raw = os.environ.get("NGCX_ALIYUN_ECS_ENDPOINT", "").strip()
    if not raw:
        return None
    host, sep, port_text = raw.rpartition(":")
    if not sep or not port_text.isdigit() or not host or not 0 < int(port_text) < 65536:
        raise UserError(f"NGCX_ALIYUN_ECS_ENDPOINT={raw!r} is not HOST:PORT", hint="e.g. 127.0.0.1:8443")
    return host, int(port_text), "http" if _loopback(host) else "https"


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class Api:
    """One region's ECS (+ ACR token) API, called with ngcx's retry policy."""

    def __init__(self, region: str, creds: AliyunCredentials | None = None, deadline_s: float = 120.0) -> None:
        self.creds = creds or credentials()
        self.region = region
        self.deadline_s = deadline_s
        self.override = endpoint_override()
        self._client = self._make_client()

    def _make_client(self) -> Any:
        try:
            from aliyunsdkcore.client import AcsClient
        except ImportError:
            raise UserError("the Alibaba Cloud SDK (aliyun-python-sdk-core) is not installed",
                            hint=EXTRA_HINT) from None
        port = self.override[1] if self.override else 443
        client = AcsClient(self.creds.access_key_id, self.creds.access_key_secret, self.region, auto_retry=False,
                           max_retry_time=0, port=port, connect_timeout=5, timeout=30)
        client.append_user_agent("ngcx", "cli")   # names the caller in the cloud's logs (and the emulators' record)
        return client

    def ecs(self, action: str, params: dict[str, Any] | None = None, *, token: str | None = None,
            write: bool = False) -> dict[str, Any]:
        """Call ECS `action` (a typed aliyunsdkecs request); retried per the module docstring."""
        checked("ecs", ECS_VERSION, action, {**(params or {}), "ClientToken": token})

        def build() -> Any:
            request = _typed_request(action)
            for key, value in (params or {}).items():
                if value is not None:
                    request.add_query_param(key, _param(value))
            if token:
                request.add_query_param("ClientToken", token)
            return request
        return self._call(action, build, retry=not write or token is not None)

    def cr(self, action: str, params: dict[str, Any]) -> dict[str, Any]:
        """Container Registry Enterprise Edition (cr 2018-12-01) RPC, e.g. GetAuthorizationToken."""
        checked("cr", CR_VERSION, action, params)
        host = endpoint("cr", CR_VERSION, self.region)
        return self._call(action, lambda: _rpc(host, CR_VERSION, "cr", action, params), retry=True)

    def cr_personal(self, action: str, path: str) -> dict[str, Any]:
        """Container Registry Personal Edition (cr 2016-06-07, ROA: `GET /tokens` is GetAuthorizationToken)."""
        checked("cr", CR_PERSONAL_VERSION, action, {})
        host = endpoint("cr", CR_PERSONAL_VERSION, self.region)
        return self._call(action, lambda: _roa(host, CR_PERSONAL_VERSION, "cr", action, path), retry=True)

    def ram(self, action: str, params: dict[str, Any]) -> dict[str, Any]:
        """RAM (2015-05-01, global) RPC: the hosts' pull roles. Retried: a repeated create answers
        EntityAlreadyExists, which the caller treats as done."""
        checked("ram", RAM_VERSION, action, params)
        host = endpoint("ram", RAM_VERSION, self.region)     # global: ram.aliyuncs.com in every region
        return self._call(action, lambda: _rpc(host, RAM_VERSION, "Ram", action, params), retry=True)

    def alb(self, action: str, params: dict[str, Any] | None = None, *, token: str | None = None,
            write: bool = False) -> dict[str, Any]:
        """ALB (2020-06-16) RPC: services' load balancers (deploy/aliyun_alb.py). Dotted parameters
        (`Tag.1.Key`, `ZoneMappings.1.ZoneId`) as the API names them; writes retried only with a token."""
        checked("alb", ALB_VERSION, action, {**(params or {}), "ClientToken": token})

        host = endpoint("alb", ALB_VERSION, self.region)

        def build() -> Any:
            return _rpc(host, ALB_VERSION, "Alb", action,
                        {**(params or {}), "ClientToken": token})
        return self._call(action, build, retry=not write or token is not None, service="alb")

    def ess(self, action: str, params: dict[str, Any] | None = None, *, token: str | None = None,
            write: bool = False) -> dict[str, Any]:
        """Auto Scaling (ESS 2022-02-22, the version whose SDK is maintained; its plural spellings
        `ServerGroups.1.Port`, `Tags.1.Key`, ALIYUN_API_NOTES.md) RPC: services' scaling groups (deploy/aliyun/ess.py),
        at the host the SDK's endpoint data name (ess.aliyuncs.com for the main regions); writes retried only
        with a token (an action whose model has no ClientToken gets none: the check refuses it)."""
        checked("ess", ESS_VERSION, action, {**(params or {}), "ClientToken": token})
        host = endpoint("ess", ESS_VERSION, self.region)

        def build() -> Any:
            return _rpc(host, ESS_VERSION, "Ess", action, {**(params or {}), "ClientToken": token})
        return self._call(action, build, retry=not write or token is not None, service="ess")

    def _call(self, action: str, build: Any, retry: bool, service: str = "") -> dict[str, Any]:
        from aliyunsdkcore.acs_exception.exceptions import ClientException, ServerException

        deadline = time.monotonic() + self.deadline_s
        attempt = 0
        while True:
            request = build()
            self._route(request)
            try:
                return json.loads(self._client.do_action_with_exception(request))
            except ServerException as exc:
                code, status = exc.get_error_code(), exc.get_http_status()
                failure = self._server_failure(action, code, status, exc.get_error_msg(), service)
            except ClientException as exc:
                code, status = exc.get_error_code(), 0
                failure = UserError(f"Alibaba Cloud {action}: {exc.get_error_code()}: "
                                    f"{_scrub(str(exc.get_error_msg()), self.creds)[:200]}",
                                    hint="check the network or NGCX_ALIYUN_ECS_ENDPOINT")
            retryable = retry and (code in RETRY_CODES or status >= 500 or status == 0)
            attempt += 1
            pause = random.uniform(0, min(MAX_BACKOFF_S, BASE_BACKOFF_S * 2 ** attempt))  # full jitter
            if not retryable or time.monotonic() + pause > deadline:
                raise failure
            time.sleep(pause)

    def _route(self, request: Any) -> None:
        if self.override:
            host, _port, scheme = self.override
            request.set_endpoint(host)
            request.set_protocol_type(scheme)
        else:
            request.set_protocol_type("https")

    def _server_failure(self, action: str, code: str, status: int, message: str, service: str = "") -> Exception:
        if code in CAPACITY_CODES:
            return CapacityError(code, action)
        if code in AUTH_CODES:
            what = "access key ID" if code.startswith("InvalidAccessKeyId") else "access key secret"
            return UserError(f"Alibaba Cloud rejected the {what} ({code}) from {self.creds.source}",
                             hint="check the key pair in the Alibaba Cloud console (RAM > AccessKey)")
        if code == "Forbidden.RAM" or code.startswith("NoPermission"):
            also = {"alb": ALB_NEEDS, "ess": ESS_NEEDS}.get(service, DEPLOY_NEEDS)
            return AliyunError(code, status, f"Alibaba Cloud {action}: the RAM user of {self.creds.access_key_id} may "
                               f"not call it ({code})", hint=f"grant it {_permission(action, service)}{also}")
        clean = _scrub(message or "", self.creds).split(" server string to sign is")[0]
        return AliyunError(code, status, f"Alibaba Cloud {action} failed: {code} (HTTP {status}): {clean[:240]}")


class AliyunError(UserError):
    """An API error that is neither capacity nor credentials; `code` lets callers react to it."""

    def __init__(self, code: str, status: int, message: str, hint: str | None = None) -> None:
        self.code, self.status = code, status
        super().__init__(message, hint=hint)


def checked(product: str, version: str, action: str, params: dict[str, Any]) -> None:
    """Refuse, before it leaves, a request the official models say the API refuses (aliyun_models.py): a
    misspelled parameter fails fast, in tests and for users, instead of being ignored by the cloud."""
    from .aliyun_models import check

    if os.environ.get("NGCX_ALIYUN_MODEL_CHECK") == "off":    # the models lag a new API parameter: see the notes
        return
    problem = check(product, version, action, {k: v for k, v in params.items() if v is not None})
    if problem is not None:
        raise AliyunError(problem.code, problem.status, f"ngcx built a request Alibaba Cloud refuses: {product} "
                          f"{version} {action}: {problem.line()}", hint="this is a bug in ngcx: please report it")


def _permission(action: str, service: str = "") -> str:
    """The RAM action a call needs, named as policies name it."""
    if service:
        return f"{service}:{action}"
    ram = ("Role", "Polic")
    return f"ram:{action}" if any(word in action for word in ram) and "Instance" not in action else f"ecs:{action}"


def _typed_request(action: str) -> Any:
    import importlib

    try:
        module = importlib.import_module(f"aliyunsdkecs.request.v20140526.{action}Request")
    except ImportError:
        raise UserError("the Alibaba Cloud ECS SDK (aliyun-python-sdk-ecs) is not installed or lacks "
                        f"{action}", hint=EXTRA_HINT) from None
    return getattr(module, f"{action}Request")()


def _rpc(domain: str, version: str, product: str, action: str, params: dict[str, Any]) -> Any:
    """A POSTed CommonRequest (the products ngcx calls without a typed SDK); None values are left out."""
    from aliyunsdkcore.request import CommonRequest

    request = CommonRequest(domain=domain, version=version, action_name=action, product=product)
    request.set_method("POST")
    for key, value in params.items():
        if value is not None:
            request.add_query_param(key, _param(value))
    return request


def _roa(domain: str, version: str, product: str, action: str, path: str) -> Any:
    """A GET ROA CommonRequest (cr 2016-06-07's /tokens); the core SDK signs it with ROA's HMAC-SHA1 scheme."""
    from aliyunsdkcore.request import CommonRequest

    request = CommonRequest(domain=domain, version=version, action_name=action, product=product, uri_pattern=path)
    request.set_method("GET")
    request.add_header("Content-Type", "application/json")
    return request


def _param(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, dict)):
        return json.dumps(value)
    return str(value)


def _scrub(text: str, creds: AliyunCredentials) -> str:
    return text.replace(creds.access_key_secret, "***") if creds.access_key_secret else text


def tag_params(tags: dict[str, str]) -> dict[str, str]:
    """{'ngcx:owner': 'x'} -> {'Tag.1.Key': 'ngcx:owner', 'Tag.1.Value': 'x'} (N = 1..20)."""
    out: dict[str, str] = {}
    for n, (key, value) in enumerate(sorted(tags.items()), start=1):
        out[f"Tag.{n}.Key"], out[f"Tag.{n}.Value"] = key, value
    return out
