"""Alibaba Cloud ROA requests (a path per action, signed in headers) for the emulators: ACR Personal Edition.

Why: with no ACR Enterprise instance (NGCX_ACR_INSTANCE_ID unset, the default) the registry's temporary login comes
from Container Registry's Personal Edition API, cr 2016-06-07, whose GetAuthorizationToken is ROA: `GET /tokens`
(alibabacloud-cr20160607's client: pathname '/tokens', method GET, style ROA), not the RPC `/?Action=` of the
Enterprise Edition (issue 47). The CLI sends it through aliyun-python-sdk-core's ROA CommonRequest and the host's
role login signs it by hand; this gateway checks what both send, as the real one does.

The ROA signature (aliyun-python-sdk-core auth/composer/roa_signature_composer.py): StringToSign = METHOD \\n
Accept \\n Content-MD5 \\n Content-Type \\n Date \\n, then every `x-acs-*` header lower-cased and sorted as
`name:value\\n`, then the path and its query sorted (`?k=v&...`, values as sent, unencoded); Authorization
`acs <AccessKeyId>:<Base64(HMAC-SHA1(secret, StringToSign))>` (the key is the secret alone, no trailing '&'); an STS
key sends its token in `x-acs-security-token`. Errors: the same codes and statuses as RPC, in a JSON body.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from collections.abc import Callable
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import parse_qsl

from .aliyun_models_check import model_problem, record_request
from .aliyun_rpc import TIMESTAMP_SKEW_S, ApiError, Reply, RpcService, new_request_id

RoaAction = Callable[[dict[str, str]], dict[str, Any]]


def roa_string_to_sign(method: str, path: str, query: dict[str, str], headers: dict[str, str]) -> str:
    """What the SDK signs (headers lower-cased by the caller)."""
    lines = [method.upper(), headers.get("accept", ""), headers.get("content-md5", ""),
             headers.get("content-type", ""), headers.get("date", "")]
    canonical = "".join(f"{k}:{v}\n" for k, v in sorted(headers.items()) if k.startswith("x-acs-"))
    resource = path + ("?" + "&".join(f"{k}={v}" if v != "" else k for k, v in sorted(query.items())) if query else "")
    return "\n".join(lines) + "\n" + canonical + resource


def roa_signature(string_to_sign: str, secret: str) -> str:
    return base64.b64encode(hmac.new(secret.encode(), string_to_sign.encode(), hashlib.sha1).digest()).decode()


class RoaGateway(RpcService):
    """RpcService plus ROA routes: `roa[(METHOD, path)] = (product, version, action, handler)`; the handler gets
    the query plus AccessKeyId (the caller), as RPC handlers get their parameters."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.roa: dict[tuple[str, str], tuple[str, str, str, RoaAction]] = {}

    def _other_path(self, method: str, path: str, query: str, headers: dict[str, str]) -> Reply:
        request_id = new_request_id()
        route = self.roa.get((method.upper(), path))
        if route is None:
            return self._not_found()
        product, version, action, handler = route
        params = dict(parse_qsl(query, keep_blank_values=True))
        try:
            access_key = self._verify_roa(method, path, params, headers)
            if headers.get("x-acs-version") != version:
                raise ApiError(400, "InvalidVersion", "Specified parameter Version is not valid.")
            record_request(product, {"Version": version, "Action": action, **params}, headers.get("user-agent", ""))
            problem = model_problem(product, version, action, params)
            if problem is not None:
                raise ApiError(problem.status, problem.code, problem.message)
            payload = self._perform(action, handler, {**params, "AccessKeyId": access_key})
        except ApiError as error:
            body = {"requestId": request_id, "code": error.code, "message": error.message,
                    "Code": error.code, "Message": error.message}
            return Reply(error.http_status, json.dumps(body).encode(), "application/json;charset=utf-8", request_id)
        return Reply(200, json.dumps(payload).encode(), "application/json;charset=utf-8", request_id)

    def _verify_roa(self, method: str, path: str, query: dict[str, str], headers: dict[str, str]) -> str:
        """The caller's AccessKeyId, or the ApiError the real gateway answers (as aliyun_rpc.verify, for ROA)."""
        scheme, _, credential = headers.get("authorization", "").partition(" ")
        access_key, _, signature = credential.partition(":")
        if scheme != "acs" or not access_key or not signature or not headers.get("date"):
            raise ApiError(400, "IncompleteSignature", "The request signature does not conform to Aliyun standards.")
        secret = self.access_keys.get(access_key)
        if secret is None and self.temporary_keys is not None:
            secret = self.temporary_keys(access_key, headers.get("x-acs-security-token", ""))
        if secret is None:
            raise ApiError(404, "InvalidAccessKeyId.NotFound")
        sts = roa_string_to_sign(method, path, query, headers)
        if not hmac.compare_digest(roa_signature(sts, secret), signature):
            raise ApiError(400, "SignatureDoesNotMatch", f"Specified signature is not matched with our calculation. "
                           f"server string to sign is:{sts}")
        try:
            skew = abs(time.time() - parsedate_to_datetime(headers["date"]).timestamp())
        except (TypeError, ValueError):
            raise ApiError(400, "InvalidTimeStamp.Format") from None
        if skew > TIMESTAMP_SKEW_S:
            raise ApiError(400, "InvalidTimeStamp.Expired")
        with self._lock:
            if not self._nonces.use(access_key, headers.get("x-acs-signature-nonce", ""), time.time()):
                raise ApiError(400, "SignatureNonceUsed")
        return access_key
