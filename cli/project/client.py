"""A small KServe v2 / Triton HTTP client for `ngcx test` and `ngcx run` of a project.

Why our own (stdlib http.client) instead of tritonclient: tritonclient is a test dependency, not
one of ngcx's, and the CLI needs only three calls: ready, metadata, infer. Inputs always travel
with Triton's binary tensor extension (BYTES elements as 4-byte little-endian length + bytes),
so an image's raw bytes and FP16 tensors arrive exactly as the user's client would send them.
"""

from __future__ import annotations

import http.client
import json
import struct
import time
from typing import Any
from urllib.parse import urlsplit

from ..core.errors import UserError


class InferError(Exception):
    """The server answered an inference with an error status: (status, message from {"error": ...})."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message


class Client:
    """One keep-alive connection to http(s)://HOST:PORT.

    key: the deployment's bearer key, sent on every request but the keyless health checks. Over
    https it is sent only on a connection whose certificate matches `pin` (core/tls.py); an https
    client without a pin may only ask health (a deploy polling a host whose certificate it does not
    know yet), so a key can never reach an unverified peer.

    verify: over https, check the server by the CA chain and its name instead (the default SSL context, which
    honours SSL_CERT_FILE): a service's balancer, which shows the user's own CA-signed certificate (issue 21),
    not a host's self-made one. A CA-verified connection may carry the key; an unpinned, unverified one never.
    """

    def __init__(self, url: str, timeout: float = 60.0, *, key: str | None = None, pin: str | None = None,
                 verify: bool = False) -> None:
        parts = urlsplit(url)
        self.url = url.rstrip("/")
        self.tls = parts.scheme == "https"
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or (443 if self.tls else 80)
        self.timeout = timeout
        self.key, self.pin, self.verify = key, pin, verify and pin is None
        self._conn: http.client.HTTPConnection | None = None

    def _connect(self) -> http.client.HTTPConnection:
        if not self.tls:
            return http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        from ..core.tls import PinnedHTTPSConnection, verified_connection

        if self.verify:
            return verified_connection(self.host, self.port, self.timeout)
        return PinnedHTTPSConnection(self.host, self.port, self.pin, self.timeout)

    def _auth(self, path: str, headers: dict[str, str]) -> dict[str, str]:
        """headers plus the bearer key, except on health paths (keyless) and TLS neither pinned nor CA-verified
        (never)."""
        if not self.key or path.startswith("/v2/health/") or path.endswith("/ready"):
            return headers
        if self.tls and self.pin is None and not self.verify:
            raise ValueError(f"refusing to send the key to {self.url}: its certificate is not pinned "
                             "(nor verified by a CA)")
        return {**headers, "Authorization": f"Bearer {self.key}"}

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _request(self, method: str, path: str, body: bytes | None = None,
                 headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        for attempt in (1, 2):                       # one retry when a kept-alive connection went stale
            if self._conn is None:
                self._conn = self._connect()
            try:
                self._conn.request(method, path, body=body, headers=self._auth(path, headers or {}))
                resp = self._conn.getresponse()
                data = resp.read()
                return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data
            except (ConnectionError, http.client.HTTPException):
                self.close()
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def status(self, method: str, path: str, *, with_key: bool = True) -> int:
        """The HTTP status of one request (the access checks: with and without the key)."""
        key, self.key = self.key, (self.key if with_key else None)
        try:
            return self._request(method, path)[0]
        finally:
            self.key = key

    def get(self, path: str) -> tuple[int, bytes]:
        """GET path with the key (only over pinned or CA-verified TLS, as every keyed call): (status, body).
        Any status comes back, not raised; a connection that failed or timed out is closed first."""
        try:
            status, _, data = self._request("GET", path)
        except OSError:
            self.close()                  # a timed-out answer may still arrive: never read it as the next one's
            raise
        return status, data

    def ready(self, model: str | None = None) -> bool:
        path = f"/v2/models/{model}/ready" if model else "/v2/health/ready"
        try:
            status, _, _ = self._request("GET", path)
        except OSError:
            self.close()
            return False
        return status == 200

    def metadata(self, model: str) -> dict[str, Any]:
        status, _, data = self._request("GET", f"/v2/models/{model}")
        if status != 200:
            raise InferError(status, _error_text(data))
        return json.loads(data)

    def infer(self, model: str, inputs: dict[str, Any]) -> dict[str, Any]:
        """inputs: name -> numpy array (object arrays of bytes for BYTES) -> outputs by name."""
        body, header_len = encode_request(inputs)
        status, headers, data = self._request(
            "POST", f"/v2/models/{model}/infer", body,
            {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(header_len)})
        if status != 200:
            raise InferError(status, _error_text(data))
        return decode_response(data, headers.get("inference-header-content-length"))


def _error_text(data: bytes) -> str:
    try:
        return str(json.loads(data).get("error", data[:200]))
    except (ValueError, AttributeError):
        return data[:200].decode("utf-8", "replace")


def datatype_of(arr: Any) -> str:
    from ngcx_runtime.engine import NUMPY_TO_KSERVE

    if arr.dtype == object or arr.dtype.kind in ("S", "U"):
        return "BYTES"
    return NUMPY_TO_KSERVE[arr.dtype.newbyteorder("=")]


def _tensor_bytes(arr: Any) -> bytes:
    import numpy as np

    if datatype_of(arr) == "BYTES":
        items = [x.encode() if isinstance(x, str) else bytes(x) for x in arr.reshape(-1)]
        return b"".join(struct.pack("<I", len(x)) + x for x in items)
    return np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<")).tobytes()


def encode_request(inputs: dict[str, Any]) -> tuple[bytes, int]:
    """(body, JSON header length): every input as binary data, every output asked for as binary."""
    blobs, entries = [], []
    for name, arr in inputs.items():
        blob = _tensor_bytes(arr)
        blobs.append(blob)
        entries.append({"name": name, "datatype": datatype_of(arr), "shape": list(arr.shape),
                        "parameters": {"binary_data_size": len(blob)}})
    header = json.dumps({"inputs": entries, "parameters": {"binary_data_output": True}}).encode()
    return header + b"".join(blobs), len(header)


def decode_response(data: bytes, header_len: str | None) -> dict[str, Any]:
    import numpy as np

    from ngcx_runtime.engine import KSERVE_TO_NUMPY

    n = int(header_len) if header_len else len(data)
    doc, offset, out = json.loads(data[:n]), n, {}
    for o in doc.get("outputs", []):
        shape, dtype = o["shape"], o["datatype"]
        size = (o.get("parameters") or {}).get("binary_data_size")
        if size is None:
            values = o["data"]
            out[o["name"]] = (np.array([v.encode() if isinstance(v, str) else v for v in values], dtype=object)
                              if dtype == "BYTES" else np.asarray(values, dtype=KSERVE_TO_NUMPY[dtype])).reshape(shape)
            continue
        raw = data[offset:offset + size]
        offset += size
        out[o["name"]] = (_split_bytes(raw) if dtype == "BYTES"
                          else np.frombuffer(raw, dtype=KSERVE_TO_NUMPY[dtype].newbyteorder("<"))).reshape(shape)
    return out


def _split_bytes(raw: bytes) -> Any:
    import numpy as np

    items, i = [], 0
    while i + 4 <= len(raw):
        (length,) = struct.unpack_from("<I", raw, i)
        items.append(raw[i + 4:i + 4 + length])
        i += 4 + length
    return np.array(items, dtype=object)


def wait_ready(client: Client, model: str, timeout: float, alive: Any = None) -> float:
    """Poll until the model is ready; seconds waited. alive() -> str|None says why to stop early."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if client.ready() and client.ready(model):
            return time.monotonic() - start
        why = alive() if alive else None
        if why:
            raise UserError(why)
        time.sleep(0.2)
    raise UserError(f"model {model!r} at {client.url} was not ready after {timeout:.0f} s",
                    hint="see its log with `docker logs`; a large model may need --ready-timeout")
