"""ECR's GetAuthorizationToken for Ec2Emulator: tokens that a client would cache and reuse, one per call.

Why apart: ECR is its own service on the wire (JSON protocol) and the one place credentials turn into a
registry password; it needs the session credentials IMDS hands out (aws_imds.py) and the role policies,
not the instances. moto's authorization token expired in 2015; expiresAt becomes now + 12 h. moto's
password is the same for everyone; each GetAuthorizationToken gets a password of its own instead (any works
on the test registry), recorded in `issued_tokens` and, with who got it, in `token_grants`.

ECR's proxyEndpoint names https://123456789012.dkr.ecr.REGION.amazonaws.com, which does not exist:
tests give the product the loopback registry instead (NGCX_ECR_ENDPOINT=127.0.0.1:5000 for pushes, a
RegistryRelay address for the machines), and a token's password works there only because that
registry has no auth (so `token_grants` says what each token would be allowed to pull).
"""

from __future__ import annotations

import base64
import json
import secrets
import time
from typing import Any

from .aws_ec2_machines import Ec2Machines
from .aws_imds import CredentialStore, resources_allowing, role_statements
from .aws_wire import WireRequest, WireResponse, access_key_of

ECR_TOKEN_SECONDS = 12 * 3600


class EcrTokens(Ec2Machines):
    """GetAuthorizationToken: a fresh password per call, valid 12 hours, recorded with its caller."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.issued_tokens: list[str] = []              # ECR passwords handed out (tests look for leaks)
        self.token_grants: list[dict[str, Any]] = []    # each ECR password: who got it, what it may pull
        self._credentials = CredentialStore()           # IMDS's session credentials (Ec2Emulator serves them)

    def _ecr_token(self, request: WireRequest) -> WireResponse:
        """ECR tokens are valid 12 hours (moto's expired in 2015, which a token cache would never reuse);
        each call gets its own password, recorded with its caller and what that caller may pull."""
        answer = self._forward(request)
        if not answer.ok:
            return answer
        document = json.loads(answer.body)
        session = self._credentials.get(access_key_of(request))
        caller = f"role:{session.role}" if session is not None else f"key:{access_key_of(request)}"
        pull = (resources_allowing(role_statements(self._need_upstream(), session.role), "ecr:BatchGetImage")
                if session is not None else ["*"])
        for data in document.get("authorizationData") or []:
            password = secrets.token_urlsafe(96)
            data["authorizationToken"] = base64.b64encode(f"AWS:{password}".encode()).decode()
            with self._lock:
                self.issued_tokens.append(password)
                self.token_grants.append({"token": password, "caller": caller, "pull": pull,
                                          "instance": session.instance_id if session is not None else None})
            expires = data.get("expiresAt")
            if isinstance(expires, int | float) and expires < time.time():
                data["expiresAt"] = time.time() + ECR_TOKEN_SECONDS
        return answer.with_body(json.dumps(document).encode())

    # --- instance profiles, IMDS, session callers ---------------------------------------------------------
