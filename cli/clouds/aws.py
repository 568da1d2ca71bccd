"""AWS API calls for deploy and push: the boto3 session the standard way, one call with ngcx's own retries.

Why not botocore's retries: boto3 fills a fresh ClientToken into every RunInstances *call*, so a
loop around calls (ours, or a user's script) that resends after a 5xx or a lost answer would make
a second billed instance. botocore's own retries of one call keep that call's token, but they
also resend non-idempotent calls (SendCommand runs a script twice) and hide what happened. So
every client is made with retries off (`total_max_attempts: 1`) and this module retries:
throttling (RequestLimitExceeded, Throttling...: the request was refused, nothing happened)
always; 5xx and lost answers only for calls that are safe to repeat (reads, stop/start/terminate,
and RunInstances, which always carries ngcx's own ClientToken, the same on every retry of one
attempt); full-jitter backoff until a deadline. Capacity errors (InsufficientInstanceCapacity,
HTTP 500; Unsupported for a type a zone lacks) become CapacityError for the failover in vm.py;
a rejected credential is one line that names where it came from, never the secret.

Credentials, region and endpoints as AWS users expect them, by boto3 itself: profiles
(AWS_PROFILE, ~/.aws/config and credentials, SSO, roles), the standard variables, and
AWS_ENDPOINT_URL / AWS_ENDPOINT_URL_<SERVICE> (EC2, SSM, ECR, STS, IAM). The region is --region,
else AWS_REGION, else AWS_DEFAULT_REGION or the profile's (botocore reads those two), else the
target's default. boto3 is an extra (`pip install 'ngcx[aws]'`), imported on first use.
"""

from __future__ import annotations

import os
import random
import threading
import time
from typing import Any

from ..core.errors import CapacityError, UserError

EXTRA_HINT = "install the AWS SDK: pip install 'ngcx[aws]'"
CREDENTIALS_HINT = ("set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE (see `aws configure list`), "
                    "or run `aws configure`")
# No stock for this type here (RunInstances, StartInstances): the next zone, then the next type may have some.
CAPACITY_CODES = frozenset({
    "InsufficientInstanceCapacity", "InsufficientHostCapacity", "InsufficientReservedInstanceCapacity",
    "InsufficientCapacity", "InsufficientCapacityOnHost", "Unsupported", "SpotMaxPriceTooLow",
    "MaxSpotInstanceCountExceeded", "InsufficientFreeAddressesInSubnet", "VcpuLimitExceeded",
    "InstanceLimitExceeded"})
# The request was refused before anything happened: always safe to send again.
THROTTLE_CODES = frozenset({"RequestLimitExceeded", "Throttling", "ThrottlingException", "TooManyRequestsException",
                            "RequestThrottled", "RequestThrottledException", "SlowDown", "PriorRequestNotComplete"})
# The service failed; the request may or may not have been carried out.
TRANSIENT_CODES = frozenset({"InternalError", "InternalFailure", "InternalServerError", "ServiceUnavailable",
                             "Unavailable", "RequestTimeout", "RequestTimeoutException"})
AUTH_CODES = frozenset({"AuthFailure", "UnrecognizedClientException", "InvalidClientTokenId", "SignatureDoesNotMatch",
                        "InvalidSignatureException", "IncompleteSignature", "MissingAuthenticationToken",
                        "MissingAuthenticationTokenException", "InvalidAccessKeyId", "ExpiredToken",
                        "ExpiredTokenException", "RequestExpired"})
DENIED_CODES = frozenset({"UnauthorizedOperation", "AccessDenied", "AccessDeniedException"})
BASE_BACKOFF_S, MAX_BACKOFF_S = 0.5, 20.0
CREDENTIAL_SOURCES = {"env": "the AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY variables",
                      "shared-credentials-file": "~/.aws/credentials", "config-file": "~/.aws/config",
                      "sso": "an SSO session", "assume-role": "an assumed role", "iam-role": "the instance's role",
                      "container-role": "the container's role", "assume-role-with-web-identity": "a web identity"}


class AwsError(UserError):
    """An API error that is neither capacity nor credentials; `code` lets callers react to it."""

    def __init__(self, code: str, status: int, message: str, hint: str | None = None) -> None:
        self.code, self.status = code, status
        super().__init__(message, hint=hint)


def boto3_module() -> Any:
    try:
        import boto3
    except ImportError:
        raise UserError("the AWS SDK (boto3) is not installed", hint=EXTRA_HINT) from None
    return boto3


# What a session is made from: a session is reused only while these and the shared files (their mtime and size)
# are the same (tests change them within one process).
SESSION_INPUTS = ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_DEFAULT_REGION", "AWS_CONFIG_FILE",
                  "AWS_SHARED_CREDENTIALS_FILE", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                  "AWS_ENDPOINT_URL", "HOME")
_sessions = threading.local()


def session() -> Any:
    """A boto3 session as the AWS CLI would make it (AWS_PROFILE, the variables, ~/.aws), one per thread.

    Why kept: one `ngcx deploy --cloud aws` onto a running host made six (the region, then each region's
    clients), ~0.24 s of its run under cProfile, and each new session parses its clients' service models again
    (EC2's alone ~0.3 s). Why per thread: botocore sessions are not thread-safe, and service.py deploys
    replicas from a thread pool."""
    inputs = (*(os.environ.get(name) for name in SESSION_INPUTS), *map(_file_version, _shared_files()))
    kept = getattr(_sessions, "kept", None)
    if kept is not None and kept[0] == inputs:
        return kept[1]
    boto3 = boto3_module()
    from botocore.exceptions import ProfileNotFound

    try:
        made = boto3.Session()
    except ProfileNotFound as exc:
        raise UserError(f"AWS profile {exc.kwargs.get('profile')!r} (AWS_PROFILE) is not in ~/.aws/config or "
                        "~/.aws/credentials", hint="unset AWS_PROFILE or run `aws configure --profile NAME`") from None
    _sessions.kept = (inputs, made)
    return made


def _shared_files() -> tuple[str, str]:
    home = os.path.expanduser("~")
    return (os.environ.get("AWS_SHARED_CREDENTIALS_FILE") or os.path.join(home, ".aws", "credentials"),
            os.environ.get("AWS_CONFIG_FILE") or os.path.join(home, ".aws", "config"))


def _file_version(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(os.path.expanduser(path))
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


def default_region(sess: Any | None = None) -> str | None:
    """AWS_REGION, else what botocore resolves (AWS_DEFAULT_REGION, the profile's region), else None."""
    return os.environ.get("AWS_REGION") or (sess or session()).region_name or None


class Api:
    """One region's AWS clients, called with ngcx's retry policy (module docstring)."""

    def __init__(self, region: str, deadline_s: float = 120.0, sess: Any | None = None) -> None:
        self.session = sess or session()
        self.region = region
        self.deadline_s = deadline_s
        self._clients: dict[str, Any] = {}

    def client(self, service: str) -> Any:
        """A client with botocore's retries off; AWS_ENDPOINT_URL(_SERVICE) is applied by boto3 itself."""
        if service not in self._clients:
            from botocore.config import Config

            config = Config(retries={"mode": "standard", "total_max_attempts": 1}, connect_timeout=5,
                            read_timeout=60, user_agent_extra="ngcx")
            self._clients[service] = self.session.client(service, region_name=self.region, config=config)
        return self._clients[service]

    def call(self, service: str, operation: str, *, idempotent: bool = True, capacity: bool = False,
             where: str = "", **params: Any) -> dict[str, Any]:
        """client(service).operation(**params), retried per the module docstring.

        idempotent: the call may be repeated after a 5xx or a lost answer (reads, and writes whose
        repetition changes nothing: stop, start, terminate, RunInstances with a ClientToken).
        capacity: capacity codes become CapacityError(code, where) instead of an error line.
        """
        from botocore.exceptions import BotoCoreError, ClientError
        from botocore.parsers import ResponseParserError

        method = getattr(self.client(service), operation)
        deadline = time.monotonic() + self.deadline_s
        attempt = 0
        while True:
            try:
                return method(**params)
            except ClientError as exc:
                code, status, message = _error_fields(exc)
                failure: Exception = self._failure(service, operation, code, status, message, capacity, where)
                retryable = code in THROTTLE_CODES or (idempotent and (code in TRANSIENT_CODES or status >= 500))
                if capacity and code in CAPACITY_CODES:
                    retryable = False
            except BotoCoreError as exc:
                failure, retryable = self._transport_failure(service, operation, exc, idempotent)
            except ResponseParserError:   # a proxy's or load balancer's HTML page instead of AWS's answer
                failure = AwsError("UnparsableResponse", 0, f"AWS {_pascal(operation)}: the answer was not AWS's "
                                   "(a proxy or gateway error page?)")
                retryable = idempotent
            attempt += 1
            pause = random.uniform(0, min(MAX_BACKOFF_S, BASE_BACKOFF_S * 2 ** attempt))  # full jitter
            if not retryable or time.monotonic() + pause > deadline:
                raise failure
            time.sleep(pause)

    def pages(self, service: str, operation: str, key: str, **params: Any) -> list[Any]:
        """Every item under `key` across NextToken pages (each page one retried call)."""
        found: list[Any] = []
        token = None
        while True:
            answer = self.call(service, operation, **params, **({"NextToken": token} if token else {}))
            found += answer.get(key) or []
            token = answer.get("NextToken")
            if not token:
                return found

    def partition(self) -> str:
        """aws, aws-cn, aws-us-gov: ARNs of AWS managed policies name it."""
        return self.session.get_partition_for_region(self.region) or "aws"

    # ---------------------------------------------------------------- errors

    def _failure(self, service: str, operation: str, code: str, status: int, message: str, capacity: bool,
                 where: str) -> Exception:
        if capacity and code in CAPACITY_CODES:
            return CapacityError(code, where or operation)
        if code in AUTH_CODES:
            return UserError(f"AWS rejected the credentials ({code}) from {self.source()}", hint=_auth_hint(code))
        if code in DENIED_CODES:
            return AwsError(code, status, f"AWS {_pascal(operation)}: the credentials from {self.source()} may not "
                            f"call it ({code})", hint=f"grant {service}:{_pascal(operation)} to that identity")
        clean = self.scrub(message.split("Encoded authorization failure message:")[0].strip())
        return AwsError(code, status, f"AWS {_pascal(operation)} failed: {code} (HTTP {status}): {clean[:240]}")

    def _transport_failure(self, service: str, operation: str, exc: Exception, idempotent: bool
                           ) -> tuple[Exception, bool]:
        from botocore.exceptions import (
            ConnectTimeoutError,
            EndpointConnectionError,
            NoCredentialsError,
            PartialCredentialsError,
        )

        if isinstance(exc, NoCredentialsError):
            return UserError("no AWS credentials found (no AWS_ACCESS_KEY_ID, no profile in ~/.aws, no role)",
                             hint=CREDENTIALS_HINT), False
        if isinstance(exc, PartialCredentialsError):
            return UserError(f"AWS credentials are incomplete: {self.scrub(str(exc))[:200]}",
                             hint=CREDENTIALS_HINT), False
        never_sent = isinstance(exc, EndpointConnectionError | ConnectTimeoutError)
        failure = UserError(f"AWS {_pascal(operation)}: {type(exc).__name__}: {self.scrub(str(exc))[:200]}",
                            hint=f"check the network, a proxy, or AWS_ENDPOINT_URL(_{service.upper()})")
        return failure, never_sent or idempotent

    def source(self) -> str:
        """Where the credentials came from, and the key's last 4 characters (as `aws configure list`)."""
        try:
            creds = self.session.get_credentials()
        except Exception:  # resolving them failed already: the message names the call that failed
            creds = None
        if creds is None:
            return "nowhere (none found)"
        where = CREDENTIAL_SOURCES.get(getattr(creds, "method", ""), getattr(creds, "method", "") or "boto3")
        profile = self.session.profile_name
        if profile and profile != "default" and where.startswith("~"):
            where = f"profile {profile!r} in {where}"
        return f"{where} (key ****{(creds.access_key or '')[-4:]})"

    def scrub(self, text: str) -> str:
        """AWS messages do not echo secrets; a transport error's text might carry anything, so scrub."""
        try:
            creds = self.session.get_credentials()
        except Exception:
            return text
        for secret in (getattr(creds, "secret_key", None), getattr(creds, "token", None)):
            if secret:
                text = text.replace(secret, "***")
        return text


def _error_fields(exc: Any) -> tuple[str, int, str]:
    error = exc.response.get("Error") or {}
    status = int((exc.response.get("ResponseMetadata") or {}).get("HTTPStatusCode") or 0)
    return str(error.get("Code") or "Unknown"), status, str(error.get("Message") or "")


def _auth_hint(code: str) -> str:
    if code in ("ExpiredToken", "ExpiredTokenException"):
        return "the session token expired: refresh it (aws sso login, or new STS credentials)"
    if code == "RequestExpired":
        return "this machine's clock is off by more than 5 minutes; sync it"
    return "check the key pair (IAM > Users > Security credentials) or the profile; " + CREDENTIALS_HINT


def _pascal(operation: str) -> str:
    """run_instances -> RunInstances (the name the API, IAM policies and error messages use)."""
    return "".join(part.capitalize() for part in operation.split("_"))
