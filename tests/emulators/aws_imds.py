"""The instance metadata service (IMDSv2) of the AWS double, and the roles behind its credentials.

Why: a host launched with an instance profile gets its registry login from its *role*, not from a
secret the deploy hands it: a script on the host asks IMDS for the role's session credentials and
signs ECR GetAuthorizationToken with them. moto has no IMDS and accepts any credentials, so a test
could not tell a host that logs in through its role from one that carries a key. This module serves
IMDS over plain HTTP and issues session credentials that the harness (aws_ec2.Ec2Emulator, through
aws_wire.check_signature) then accepts only with their token and only before they expire; what a
role may do is read from moto's IAM (policy evaluation below).

The service (MetadataService, on `Ec2Emulator.metadata_address`), as AWS's on 169.254.169.254:

- `PUT /latest/api/token` with `X-aws-ec2-metadata-token-ttl-seconds: 1..21600` answers a token
  (and echoes the TTL header); a missing or bad TTL answers 400; a PUT carrying X-Forwarded-For 403
  (AWS refuses those, so an SSRF through a proxy cannot get a token).
- Every GET must carry `X-aws-ec2-metadata-token` with a valid, unexpired token that this same
  instance got (else 401). That is IMDSv1 off, as with `MetadataOptions.HttpTokens=required`; an
  instance whose HttpTokens moto keeps as `optional` (RunInstances without MetadataOptions, or
  ModifyInstanceMetadataOptions) also answers a GET without a token, and `HttpEndpoint=disabled`
  answers 403 to everything.
- The caller is the TCP source address: the private IP of a running instance the harness launched
  (its machine up). Anyone else, or an address two running instances share, gets 404.
- Paths: /latest/meta-data/{ami-id, instance-id, instance-type, local-ipv4, local-hostname, hostname,
  placement/availability-zone, placement/region, iam/info, iam/security-credentials/ (the role's name),
  iam/security-credentials/ROLE (the credentials JSON)}, /latest/dynamic/instance-identity/document,
  /latest/user-data, and meta-data/events/recommendations/rebalance and spot/instance-action once EC2 reclaims a
  spot instance (aws_refresh.py; 404 before, as AWS); a directory lists its entries. No profile (or a
  profile without a role): no iam/ at all (404). The profile and its role are read from moto at every
  request, so Associate / Replace / Disassociate through the API show at once.
- Credentials: {"Code": "Success", "LastUpdated", "Type": "AWS-HMAC", "AccessKeyId": "ASIA...",
  "SecretAccessKey", "Token", "Expiration"}, valid 6 hours; the same ones are served until 15 minutes
  before they expire (AWS: at least five), then new ones. Old ones stay valid until they expire, also
  after the role was replaced, as STS credentials do.

Role policies (the role's inline policies and its attached managed ones, read from moto's IAM at
every request): Allow / Deny, Action / NotAction, Resource / NotResource with `*` and `?` wildcards;
an explicit Deny wins. Conditions are not evaluated (a statement applies as if its condition held).
A request signed with session credentials is authorized against its role: ECR actions against the
repository ARN when the request names a repository, else (GetAuthorizationToken, every other
service) against `*`, so a statement limited to specific ARNs grants nothing outside ECR here.
sts:GetCallerIdentity needs no permission, as on AWS.

Limits: the hop limit (HttpPutResponseHopLimit) cannot be emulated; no IPv6 endpoint; tokens and
credentials live in the emulator's memory (a restarted emulator forgets them).
"""

from __future__ import annotations

import base64
import contextlib
import json
import re
import secrets
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self
from urllib.parse import unquote, urlsplit

from .aws_wire import (
    AwsError,
    SessionCredential,
    Upstream,
    WireRequest,
    WireResponse,
    child,
    child_text,
    items,
    local,
    new_request_id,
    parse_xml,
    path,
    xml_bytes,
)

ACCOUNT_ID = "123456789012"                 # moto's default account
CREDENTIAL_SECONDS = 6 * 3600               # what IMDS role credentials last
REFRESH_BEFORE_S = 15 * 60                  # new credentials this long before the old ones expire
TOKEN_TTL_MAX = 21600                       # IMDSv2 tokens: 1 second to 6 hours
TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
TOKEN_HEADER = "X-aws-ec2-metadata-token"
_PAGES = {400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed"}


def _stamp(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


# --- what moto knows about an instance: its state, metadata options, profile, role ------------------

@dataclass(frozen=True)
class Machine:
    """An instance the harness launched whose machine is up (aws_ec2 hands these over by address)."""

    id: str
    region: str
    zone: str
    instance_type: str
    image_id: str
    private_ip: str
    user_data: bytes = b""


@dataclass(frozen=True)
class Caller:
    """The instance behind a metadata request, as moto says it is now."""

    machine: Machine
    http_tokens: str           # "required" or "optional"
    http_endpoint: str         # "enabled" or "disabled"
    launch_time: str
    profile_arn: str           # "" without an instance profile
    role: str                  # "" without a role in that profile


def profile_name(arn: str) -> str:
    """arn:aws:iam::ACCOUNT:instance-profile/path/NAME -> NAME (a profile's name is its last segment)."""
    return arn.rpartition("/")[2] if ":instance-profile/" in arn else ""


def instance_item(upstream: Upstream, region: str, instance_id: str):
    """moto's DescribeInstances item for one instance (None when moto does not know it)."""
    root = parse_xml(upstream.ec2(region, "DescribeInstances", {"InstanceId.1": instance_id}).body)
    found = [i for r in items(root, "reservationSet") for i in items(r, "instancesSet")]
    return found[0] if found else None


def association_of(upstream: Upstream, region: str, instance_id: str) -> tuple[str, str] | None:
    """(association id, instance profile ARN) of the instance's live association, or None."""
    root = parse_xml(upstream.ec2(region, "DescribeIamInstanceProfileAssociations", {
        "Filter.1.Name": "instance-id", "Filter.1.Value.1": instance_id}).body)
    for item in items(root, "iamInstanceProfileAssociationSet"):
        if child_text(item, "state") in ("associating", "associated"):
            return child_text(item, "associationId"), child_text(path(item, "iamInstanceProfile"), "arn")
    return None


def association_by_id(upstream: Upstream, region: str, association_id: str) -> tuple[str, str] | None:
    """(instance id, profile ARN) of one association (filtered here: moto's id list is not relied on)."""
    root = parse_xml(upstream.ec2(region, "DescribeIamInstanceProfileAssociations", {}).body)
    for item in items(root, "iamInstanceProfileAssociationSet"):
        if child_text(item, "associationId") == association_id:
            return child_text(item, "instanceId"), child_text(path(item, "iamInstanceProfile"), "arn")
    return None


def _members(holder: ET.Element | None) -> list[ET.Element]:
    """The <member> children of an IAM list element."""
    return [m for m in holder if local(m.tag) == "member"] if holder is not None else []


def instance_profile(upstream: Upstream, name: str) -> tuple[str, str] | None:
    """(ARN, first role's name or "") of an instance profile, or None when IAM has none of that name."""
    if not name:
        return None
    answer = upstream.iam("GetInstanceProfile", {"InstanceProfileName": name})
    profile = path(parse_xml(answer.body), "GetInstanceProfileResult", "InstanceProfile") if answer.ok else None
    if profile is None:
        return None
    roles = _members(child(profile, "Roles"))
    return child_text(profile, "Arn"), (child_text(roles[0], "RoleName") if roles else "")


def caller_at(upstream: Upstream, candidates: list[Machine]) -> Caller | None:
    """The one running instance among those with the caller's address, with its options and role."""
    found: list[Caller] = []
    for machine in candidates:
        item = instance_item(upstream, machine.region, machine.id)
        if item is None or child_text(path(item, "instanceState"), "name") != "running":
            continue
        options = child(item, "metadataOptions")
        tokens = child_text(options, "httpTokens") if options is not None else ""
        endpoint = child_text(options, "httpEndpoint") if options is not None else ""
        association = association_of(upstream, machine.region, machine.id)
        arn = association[1] if association else ""
        profile = instance_profile(upstream, profile_name(arn)) if arn else None
        found.append(Caller(machine, tokens or "optional", endpoint or "enabled", child_text(item, "launchTime"),
                            arn, profile[1] if profile else ""))
    return found[0] if len(found) == 1 else None


# --- role policies ---------------------------------------------------------------------------------

def _document(text: str) -> dict[str, Any]:
    """A policy document as IAM returns it: URL-encoded JSON (AWS, moto's inline ones) or plain JSON."""
    for candidate in (text, unquote(text)):
        try:
            parsed = json.loads(candidate)
        except ValueError:
            continue
        return parsed if isinstance(parsed, dict) else {}
    return {}


def _statements(document: dict[str, Any]) -> list[dict[str, Any]]:
    found = document.get("Statement")
    found = [found] if isinstance(found, dict) else found if isinstance(found, list) else []
    return [s for s in found if isinstance(s, dict)]


def role_statements(upstream: Upstream, role: str) -> list[dict[str, Any]]:
    """Every statement of the role's inline and attached managed policies, as moto's IAM holds them now."""
    statements: list[dict[str, Any]] = []
    listed = path(parse_xml(upstream.iam("ListRolePolicies", {"RoleName": role}).body),
                  "ListRolePoliciesResult", "PolicyNames")
    for name in (m.text or "" for m in _members(listed)):
        answer = parse_xml(upstream.iam("GetRolePolicy", {"RoleName": role, "PolicyName": name}).body)
        result = path(answer, "GetRolePolicyResult") if answer is not None else None
        statements += _statements(_document(child_text(result, "PolicyDocument"))) if result is not None else []
    attached = path(parse_xml(upstream.iam("ListAttachedRolePolicies", {"RoleName": role}).body),
                    "ListAttachedRolePoliciesResult", "AttachedPolicies")
    for arn in (child_text(m, "PolicyArn") for m in _members(attached)):
        statements += _managed_statements(upstream, arn)
    return statements


def _managed_statements(upstream: Upstream, arn: str) -> list[dict[str, Any]]:
    policy = path(parse_xml(upstream.iam("GetPolicy", {"PolicyArn": arn}).body), "GetPolicyResult", "Policy")
    version = child_text(policy, "DefaultVersionId") if policy is not None else ""
    if not version:
        return []
    answer = parse_xml(upstream.iam("GetPolicyVersion", {"PolicyArn": arn, "VersionId": version}).body)
    found = path(answer, "GetPolicyVersionResult", "PolicyVersion") if answer is not None else None
    return _statements(_document(child_text(found, "Document"))) if found is not None else []


def _wildcard(pattern: str, value: str, fold: bool) -> bool:
    """IAM's matching: `*` any run, `?` one character; actions ignore case, resources do not."""
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(regex, value, re.IGNORECASE | re.DOTALL if fold else re.DOTALL) is not None


def _listed(value: Any) -> list[str]:
    return [value] if isinstance(value, str) else [v for v in value if isinstance(v, str)] if isinstance(
        value, list) else []


def _covers(statement: dict[str, Any], key: str, value: str, fold: bool) -> bool:
    """Whether Action (or NotAction, Resource/NotResource) of a statement covers the value."""
    if key in statement:
        return any(_wildcard(p, value, fold) for p in _listed(statement[key]))
    negated = "Not" + key
    return negated in statement and not any(_wildcard(p, value, fold) for p in _listed(statement[negated]))


def applies(statement: dict[str, Any], action: str, resource: str) -> bool:
    return _covers(statement, "Action", action, True) and _covers(statement, "Resource", resource, False)


def decide(statements: Iterable[dict[str, Any]], action: str, resource: str) -> str:
    """"deny" (an explicit Deny applies), "allow" (an Allow applies, no Deny) or "implicit" (none does)."""
    effects = {str(s.get("Effect")) for s in statements if applies(s, action, resource)}
    return "deny" if "Deny" in effects else "allow" if "Allow" in effects else "implicit"


def resources_allowing(statements: Iterable[dict[str, Any]], action: str) -> list[str]:
    """The Resource strings of the Allow statements whose actions cover `action` (a grant's scope)."""
    found = {r for s in statements if s.get("Effect") == "Allow" and _covers(s, "Action", action, True)
             for r in _listed(s.get("Resource", []))}
    return sorted(found)


def request_resource(request: WireRequest, region: str) -> str:
    """What a request acts on, for policy matching: an ECR repository's ARN, else `*`."""
    document = request.document if isinstance(request.document, dict) else {}
    name = document.get("repositoryName")
    if request.service == "ecr" and isinstance(name, str) and name:
        registry = document.get("registryId") or ACCOUNT_ID
        return f"arn:aws:ecr:{region}:{registry}:repository/{name}"
    return "*"


def authorize(upstream: Upstream, request: WireRequest, session: SessionCredential) -> None:
    """Raise AWS's refusal unless the session's role may do this (sts:GetCallerIdentity needs nothing)."""
    if not request.action or (request.service, request.action) == ("sts", "GetCallerIdentity"):
        return
    action, resource = f"{request.service}:{request.action}", request_resource(request, request.region)
    verdict = decide(role_statements(upstream, session.role), action, resource)
    if verdict != "allow":
        raise access_denied(request, session, action, resource, explicit=verdict == "deny")


def principal_arn(session: SessionCredential) -> str:
    return f"arn:aws:sts::{ACCOUNT_ID}:assumed-role/{session.role}/{session.instance_id}"


def access_denied(request: WireRequest, session: SessionCredential, action: str, resource: str,
                  explicit: bool) -> AwsError:
    """AWS's refusal in the service's own shape: JSON services AccessDeniedException (400), EC2
    UnauthorizedOperation (403), IAM/STS AccessDenied (403)."""
    why = ("with an explicit deny in an identity-based policy" if explicit
           else f"because no identity-based policy allows the {action} action")
    text = f"User: {principal_arn(session)} is not authorized to perform: {action} on resource: {resource} {why}"
    if request.protocol == "json":
        return AwsError(400, "AccessDeniedException", text)
    if request.service in ("ec2", ""):
        return AwsError(403, "UnauthorizedOperation", "You are not authorized to perform this operation. " + text)
    return AwsError(403, "AccessDenied", text)


def caller_identity(upstream: Upstream, session: SessionCredential) -> WireResponse:
    """sts:GetCallerIdentity of a role session: its assumed-role ARN (moto would name its default user)."""
    role = path(parse_xml(upstream.iam("GetRole", {"RoleName": session.role}).body), "GetRoleResult", "Role")
    role_id = child_text(role, "RoleId") or "AROA" + session.access_key_id[4:]
    body = ('<GetCallerIdentityResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/"><GetCallerIdentityResult>'
            f"<Arn>{principal_arn(session)}</Arn><UserId>{role_id}:{session.instance_id}</UserId>"
            f"<Account>{ACCOUNT_ID}</Account></GetCallerIdentityResult><ResponseMetadata><RequestId>"
            f"{new_request_id()}</RequestId></ResponseMetadata></GetCallerIdentityResponse>")
    return WireResponse(200, (("Content-Type", "text/xml"),), body.encode())


# --- instance profile associations (what moto gets wrong) ---------------------------------------------------

PROFILE_KEYS = ("IamInstanceProfile.Name", "IamInstanceProfile.Arn")


def check_profile(upstream: Upstream, params: dict[str, str]) -> None:
    """EC2's answer to a profile IAM does not have (moto answers IAM's NoSuchEntity 404)."""
    name, arn = params.get("IamInstanceProfile.Name", ""), params.get("IamInstanceProfile.Arn", "")
    if not name and not arn:
        return
    found = instance_profile(upstream, name or profile_name(arn))
    if found is None or (arn and found[0] != arn):
        field_name, value, what = ("arn", arn, "ARN") if arn else ("name", name, "name")
        raise AwsError(400, "InvalidParameterValue", f"Value ({value}) for parameter iamInstanceProfile.{field_name}"
                                                     f" is invalid. Invalid IAM Instance Profile {what}")


def replace_association(upstream: Upstream, region: str, params: dict[str, str]) -> WireResponse:
    """EC2 replaces with a new association id; moto keeps the id and DescribeInstances keeps the old profile,
    so: disassociate, associate, and answer the new association in Replace's shape."""
    association_id = params.get("AssociationId", "")
    current = association_by_id(upstream, region, association_id)
    if current is None:
        raise AwsError(400, "InvalidAssociationID.NotFound",
                       f"An invalid association-id of '{association_id}' was given")
    check_profile(upstream, params)
    upstream.ec2(region, "DisassociateIamInstanceProfile", {"AssociationId": association_id})
    profile = {k: v for k, v in params.items() if k in PROFILE_KEYS}
    answer = upstream.ec2(region, "AssociateIamInstanceProfile", {"InstanceId": current[0], **profile})
    root = parse_xml(answer.body) if answer.ok else None
    if root is None:
        return answer
    root.tag = root.tag.replace("AssociateIamInstanceProfile", "ReplaceIamInstanceProfileAssociation")
    return answer.with_body(xml_bytes(root))


# --- session credentials ------------------------------------------------------------------------------

class CredentialStore:
    """Session credentials per (instance, role): issued by IMDS, looked up by the harness's signature check."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_key: dict[str, SessionCredential] = {}
        self._current: dict[tuple[str, str], str] = {}

    def for_role(self, instance_id: str, role: str) -> SessionCredential:
        """The instance's current credentials for the role; new ones near expiry (the old stay valid)."""
        now = time.time()
        with self._lock:
            key = self._current.get((instance_id, role))
            current = self._by_key.get(key) if key else None
            if current is not None and current.expires - now > REFRESH_BEFORE_S:
                return current
            fresh = SessionCredential(
                "ASIA" + "".join(secrets.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ234567") for _ in range(16)),
                base64.b64encode(secrets.token_bytes(30)).decode(),
                "IQoJb3JpZ2luX2VjE" + base64.b64encode(secrets.token_bytes(600)).decode(),
                now + CREDENTIAL_SECONDS, role, instance_id, now)
            self._by_key[fresh.access_key_id] = fresh
            self._current[(instance_id, role)] = fresh.access_key_id
            return fresh

    def get(self, access_key_id: str) -> SessionCredential | None:
        with self._lock:
            return self._by_key.get(access_key_id)

    def expire_all(self) -> None:
        """Every credential issued so far expires now (the next IMDS read hands out new ones)."""
        with self._lock:
            past = time.time() - 1
            self._by_key = {k: replace(s, expires=past) for k, s in self._by_key.items()}

    def secrets(self) -> list[str]:
        with self._lock:
            return [v for s in self._by_key.values() for v in (s.secret, s.token)]


# --- the HTTP service --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()


def _page(status: int) -> Answer:
    """AWS's IMDS error pages are tiny HTML documents."""
    title = f"{status} - {_PAGES.get(status, 'Error')}"
    body = (f'<?xml version="1.0" encoding="iso-8859-1"?>\n<!DOCTYPE html PUBLIC "-//W3C//DTD XHTML 1.0 '
            f'Transitional//EN"\n\t"http://www.w3.org/TR/xhtml1/DTD/xhtml1-transitional.dtd">\n<html xmlns='
            f'"http://www.w3.org/1999/xhtml" xml:lang="en" lang="en">\n <head>\n  <title>{title}</title>\n </head>\n'
            f' <body>\n  <h1>{title}</h1>\n </body>\n</html>\n')
    return Answer(status, body.encode(), (("Content-Type", "text/html"),))


Tree = dict[str, Any]   # name -> Tree (a directory), str / bytes, or a callable producing one (a leaf)


class MetadataService:
    """IMDSv2 on (host, ephemeral port), answering each caller as the instance its address belongs to.

    `resolve(ip)` says which instance an address is (aws_ec2 asks moto); `credentials` issues role keys.
    """

    def __init__(self, host: str, resolve: Callable[[str], Caller | None], credentials: CredentialStore) -> None:
        self.resolve = resolve
        self.credentials = credentials
        self.errors: list[str] = []     # harness bugs (answered 500); a test asserts there are none
        self.notices: dict[str, dict[str, Any]] = {}   # instance id -> spot/, events/ trees (aws_refresh.py)
        self._tokens: dict[str, tuple[str, float]] = {}   # token -> (instance id, monotonic expiry)
        self._lock = threading.Lock()
        self._server = _MetadataServer((host, 0), _MetadataHandler)
        self._server.service = self
        self._thread: threading.Thread | None = None

    def start(self) -> Self:
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.1},
                                        name="aws-imds", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            with contextlib.suppress(RuntimeError):
                self._thread.join(5)

    @property
    def address(self) -> str:
        host, port = self._server.server_address[:2]
        return f"{host}:{port}"

    # --- one request -------------------------------------------------------------------------------

    def answer(self, method: str, target: str, headers: Any, client_ip: str) -> Answer:
        """Everything but the socket: who asks, whether the token holds, what the path names."""
        if method not in ("GET", "PUT"):
            return _page(405)
        caller = self.resolve(client_ip)
        if caller is None:
            return _page(404)
        if caller.http_endpoint == "disabled":
            return _page(403)
        if method == "PUT":
            return self._put(target, headers, caller)
        sent = headers.get(TOKEN_HEADER)
        if sent is not None and not self._valid(sent, caller.machine.id):
            return _page(401)
        if sent is None and caller.http_tokens != "optional":
            return _page(401)
        return self._get(urlsplit(target).path, caller)

    def _put(self, target: str, headers: Any, caller: Caller) -> Answer:
        if urlsplit(target).path.rstrip("/") != "/latest/api/token":
            return _page(405)
        if headers.get("X-Forwarded-For") is not None:
            return _page(403)
        ttl = (headers.get(TTL_HEADER) or "").strip()
        if not ttl.isdigit() or not 1 <= int(ttl) <= TOKEN_TTL_MAX:
            return _page(400)
        token = "AQAEA" + base64.urlsafe_b64encode(secrets.token_bytes(36)).decode().rstrip("=")
        with self._lock:
            now = time.monotonic()
            self._tokens = {t: v for t, v in self._tokens.items() if v[1] > now}
            self._tokens[token] = (caller.machine.id, now + int(ttl))
        return Answer(200, token.encode(), (("Content-Type", "text/plain"), (TTL_HEADER, ttl)))

    def _valid(self, token: str, instance_id: str) -> bool:
        with self._lock:
            held = self._tokens.get(token.strip())
        return held is not None and held[0] == instance_id and held[1] > time.monotonic()

    def _get(self, url_path: str, caller: Caller) -> Answer:
        node: Any = {"latest": self._tree(caller)}
        for part in (unquote(p) for p in url_path.split("/") if p):
            if not isinstance(node, dict) or part not in node:
                return _page(404)
            node = node[part]
        if isinstance(node, dict):
            listing = "\n".join(name + "/" if isinstance(sub, dict) else name for name, sub in node.items())
            return Answer(200, listing.encode(), (("Content-Type", "text/plain"),))
        value = node() if callable(node) else node
        body = value if isinstance(value, bytes) else str(value).encode()
        return Answer(200, body, (("Content-Type", "text/plain"),))

    def _tree(self, caller: Caller) -> Tree:
        machine = caller.machine
        host = f"ip-{machine.private_ip.replace('.', '-')}." + (
            "ec2.internal" if machine.region == "us-east-1" else f"{machine.region}.compute.internal")
        meta: Tree = {"ami-id": machine.image_id, "hostname": host, "instance-id": machine.id,
                      "instance-type": machine.instance_type, "local-hostname": host, "local-ipv4": machine.private_ip,
                      "placement": {"availability-zone": machine.zone, "region": machine.region},
                      "services": {"domain": "amazonaws.com", "partition": "aws"}}
        meta.update(self.notices.get(machine.id, {}))   # a reclaim's rebalance recommendation / interruption
        if caller.role:
            meta["iam"] = {"info": lambda: self._info(caller),
                           "security-credentials": {caller.role: lambda: self._credentials(caller)}}
        latest: Tree = {"dynamic": {"instance-identity": {"document": lambda: self._identity(caller)}},
                        "meta-data": meta}
        if machine.user_data:
            latest["user-data"] = machine.user_data
        return latest

    def _credentials(self, caller: Caller) -> str:
        issued = self.credentials.for_role(caller.machine.id, caller.role)
        return json.dumps({"Code": "Success", "LastUpdated": _stamp(issued.issued), "Type": "AWS-HMAC",
                           "AccessKeyId": issued.access_key_id, "SecretAccessKey": issued.secret,
                           "Token": issued.token, "Expiration": _stamp(issued.expires)}, indent=2)

    @staticmethod
    def _info(caller: Caller) -> str:
        return json.dumps({"Code": "Success", "LastUpdated": _stamp(time.time()),
                           "InstanceProfileArn": caller.profile_arn,
                           "InstanceProfileId": "AIPA" + caller.machine.id[2:].upper()}, indent=2)

    @staticmethod
    def _identity(caller: Caller) -> str:
        machine = caller.machine
        return json.dumps({"accountId": ACCOUNT_ID, "architecture": "x86_64", "availabilityZone": machine.zone,
                           "billingProducts": None, "devpayProductCodes": None, "marketplaceProductCodes": None,
                           "imageId": machine.image_id, "instanceId": machine.id, "instanceType": machine.instance_type,
                           "kernelId": None, "pendingTime": caller.launch_time, "privateIp": machine.private_ip,
                           "ramdiskId": None, "region": machine.region, "version": "2017-09-30"}, indent=2)


class _MetadataServer(ThreadingHTTPServer):
    daemon_threads = True
    service: MetadataService


class _MetadataHandler(BaseHTTPRequestHandler):
    server: _MetadataServer
    protocol_version = "HTTP/1.1"

    def _serve(self) -> None:
        length = self.headers.get("Content-Length") or "0"
        if length.isdigit() and int(length):
            self.rfile.read(min(int(length), 1 << 20))
        service = self.server.service
        try:
            answer = service.answer(self.command, self.path, self.headers, self.client_address[0])
        except Exception as exc:  # a harness bug: kept for the test, a 500 for the client
            service.errors.append(f"IMDS {self.command} {self.path[:100]}: {type(exc).__name__}: {exc}"[:500])
            answer = Answer(500, b"Internal Server Error", (("Content-Type", "text/plain"),))
        try:
            self.send_response(answer.status)
            for key, value in answer.headers:
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(answer.body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(answer.body)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    do_GET = do_PUT = do_POST = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = _serve

    def log_message(self, format: str, *args: Any) -> None:
        """Silent, as the API proxy is."""
