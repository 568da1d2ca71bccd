# ngcx host verify: on the deploy host, check an image's cosign signature and attestations before `docker run`.
# Run as `python3 - REF PUBLIC_KEY_PEM_FILE` (or python3 host_verify.py ...); prints REPOSITORY@DIGEST to run on
# success (exit 0), else one line `ngcx: image refused: ...` on stderr (exit 1).
# Standard library only, Python >= 3.6 (Alibaba Cloud Linux 3 ships 3.6), like recipes/deploy/role_login.py: a host
# needs nothing installed, so ECDSA P-256 verification (FIPS 186-4 section 6.4, curve P-256 of SEC 2) is done
# here in integers. The checks are ngcx.trust.verify's, which follow sigstore/cosign specs/SIGNATURE_SPEC.md
# (the .sig tag, the simple-signing payload, the base64 DER signature over SHA-256 of the payload) and cosign's
# attestation layout (the .att tag, DSSE envelopes signed over PAE, in-toto statements naming the digest).
# Why again on the host: the tag may move between ngcx's check and the host's pull; the host runs the digest it
# checked. Registry credentials are the ones `docker login` left in the host's docker config (role_login.py);
# nothing secret is printed. The public key is public: it travels with the host script.
import base64
import hashlib
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request

ACCEPT = ", ".join((
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.oci.image.index.v1+json",
))
SIMPLESIGNING = "application/vnd.dev.cosign.simplesigning.v1+json"
DSSE_LAYER = "application/vnd.dsse.envelope.v1+json"
INTOTO = "application/vnd.in-toto+json"
SIGNATURE_ANNOTATION = "dev.cosignproject.cosign/signature"
SLSA = "https://slsa.dev/provenance/v1"
NGCX_KINDS = (SLSA, "https://cyclonedx.org/bom")   # types ngcx attests: each must verify (an edit is refused)
TIMEOUT_S = 20

# P-256 (secp256r1), SEC 2 section 2.4.2
P = 0xFFFFFFFF00000001000000000000000000000000FFFFFFFFFFFFFFFFFFFFFFFF
A = P - 3
B = 0x5AC635D8AA3A93E7B3EBBD55769886BC651D06B0CC53B0F63BCE3C3E27D2604B
N = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551
G = (0x6B17D1F2E12C4247F8BCE6E563A440F277037D812DEB33A0F4A13945D898C296,
     0x4FE342E2FE1A7F9B8EE7EB4A7C0F9E162BCE33576B315ECECBB6406837BF51F5)
EC_PUBLIC_KEY_OID = bytes.fromhex("06072a8648ce3d0201")    # id-ecPublicKey
P256_OID = bytes.fromhex("06082a8648ce3d030107")          # prime256v1


class Refused(Exception):
    pass


# --- ECDSA P-256 verification in Jacobian coordinates ----------------------------------------------------------

def _double(pt):
    x, y, z = pt
    if not y:
        return (0, 1, 0)
    ysq = y * y % P
    s = 4 * x * ysq % P
    m = (3 * x * x + A * pow(z, 4, P)) % P
    nx = (m * m - 2 * s) % P
    ny = (m * (s - nx) - 8 * ysq * ysq) % P
    return (nx, ny, 2 * y * z % P)


def _add(p1, p2):
    if not p1[2]:
        return p2
    if not p2[2]:
        return p1
    x1, y1, z1 = p1
    x2, y2, z2 = p2
    z1s, z2s = z1 * z1 % P, z2 * z2 % P
    u1, u2 = x1 * z2s % P, x2 * z1s % P
    s1, s2 = y1 * z2s * z2 % P, y2 * z1s * z1 % P
    if u1 == u2:
        return _double(p1) if s1 == s2 else (0, 1, 0)
    h, r = (u2 - u1) % P, (s2 - s1) % P
    h2 = h * h % P
    h3 = h * h2 % P
    u1h2 = u1 * h2 % P
    nx = (r * r - h3 - 2 * u1h2) % P
    ny = (r * (u1h2 - nx) - s1 * h3) % P
    return (nx, ny, h * z1 * z2 % P)


def _affine_x(pt):
    if not pt[2]:
        return None
    zinv = pow(pt[2], P - 2, P)
    return pt[0] * zinv * zinv % P


def _on_curve(x, y):
    return 0 <= x < P and 0 <= y < P and (y * y - (x * x * x + A * x + B)) % P == 0


def ecdsa_p256_verify(public_point, der_signature, message):
    """True when der_signature is a valid ECDSA P-256 / SHA-256 signature of message by public_point (x, y)."""
    parsed = _der_signature(der_signature)
    if parsed is None:
        return False
    r, s = parsed
    if not (0 < r < N and 0 < s < N):
        return False
    e = int.from_bytes(hashlib.sha256(message).digest(), "big")
    w = pow(s, N - 2, N)
    u1, u2 = e * w % N, r * w % N
    g, q = (G[0], G[1], 1), (public_point[0], public_point[1], 1)
    gq = _add(g, q)
    acc = (0, 1, 0)
    for bit in range(256, -1, -1):   # Shamir's trick: u1*G + u2*Q in one pass
        acc = _double(acc)
        b1, b2 = (u1 >> bit) & 1, (u2 >> bit) & 1
        if b1 and b2:
            acc = _add(acc, gq)
        elif b1:
            acc = _add(acc, g)
        elif b2:
            acc = _add(acc, q)
    x = _affine_x(acc)
    return x is not None and x % N == r


def _der_signature(sig):
    """(r, s) from an ASN.1 DER ECDSA-Sig-Value, or None."""
    try:
        if sig[0] != 0x30 or sig[1] != len(sig) - 2:
            return None
        values, i = [], 2
        for _ in range(2):
            if sig[i] != 0x02:
                return None
            length = sig[i + 1]
            values.append(int.from_bytes(sig[i + 2:i + 2 + length], "big"))
            i += 2 + length
        return (values[0], values[1]) if i == len(sig) else None
    except IndexError:
        return None


def public_point(pem_text):
    """(x, y) of a PEM SubjectPublicKeyInfo holding an uncompressed P-256 point; Refused otherwise."""
    body = "".join(line for line in pem_text.strip().splitlines() if not line.startswith("-----"))
    try:
        der = base64.b64decode(body)
    except ValueError:
        der = b""
    if EC_PUBLIC_KEY_OID not in der or P256_OID not in der or len(der) < 65 or der[-65] != 4:
        raise Refused("the public key is not an ECDSA P-256 PEM public key")
    x, y = int.from_bytes(der[-64:-32], "big"), int.from_bytes(der[-32:], "big")
    if not _on_curve(x, y):
        raise Refused("the public key is not a point of P-256")
    return (x, y)


# --- the registry ----------------------------------------------------------------------------------------------

class Registry:
    def __init__(self, host, repository):
        self.host, self.repository = host, repository
        self.base = ("http://" if _plain_http(host) else "https://") + host
        self.auth = _docker_auth(host)
        self.token = None

    def get(self, path, accept=None):
        """(status, headers, body) of GET /v2/REPOSITORY/PATH, answering a Basic or Bearer challenge."""
        url = f"{self.base}/v2/{self.repository}/{path}"
        status, headers, body = self._open(url, accept, self._authorization())
        if status == 401:
            challenge = headers.get("WWW-Authenticate", "")
            if challenge.lower().startswith("bearer"):
                self.token = self._bearer(challenge)
            status, headers, body = self._open(url, accept, self._authorization(basic=not self.token))
        return status, headers, body

    def _authorization(self, basic=False):
        if self.token:
            return "Bearer " + self.token
        if basic and self.auth:
            return "Basic " + self.auth
        return None

    def _bearer(self, challenge):
        params = {}
        for part in challenge[len("bearer"):].split(","):
            key, _, value = part.strip().partition("=")
            params[key] = value.strip('"')
        realm = params.pop("realm", "")
        params.setdefault("scope", f"repository:{self.repository}:pull")
        if not realm:
            return None
        status, _headers, body = self._open(realm + "?" + urllib.parse.urlencode(params), None,
                                            "Basic " + self.auth if self.auth else None)
        if status != 200:
            return None
        doc = json.loads(body.decode())
        return doc.get("token") or doc.get("access_token")

    def _open(self, url, accept, authorization):
        request = urllib.request.Request(url)
        if accept:
            request.add_header("Accept", accept)
        if authorization:
            request.add_header("Authorization", authorization)
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S) as resp:
                return resp.status, resp.headers, resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.headers, exc.read()
        except (urllib.error.URLError, OSError) as exc:
            raise Refused(f"registry {self.host} is not reachable: {getattr(exc, 'reason', exc)}") from None

    def manifest(self, reference):
        status, headers, body = self.get("manifests/" + reference, ACCEPT)
        if status == 404:
            return None, None
        if status != 200:
            raise Refused(f"registry {self.host} answered HTTP {status} for {self.repository}:{reference}")
        digest = headers.get("Docker-Content-Digest") or "sha256:" + hashlib.sha256(body).hexdigest()
        return body, digest

    def blob(self, digest):
        """The blob's bytes when they hash to digest; else None (absent or edited)."""
        status, _headers, body = self.get("blobs/" + digest)
        if status != 200 or "sha256:" + hashlib.sha256(body).hexdigest() != digest:
            return None
        return body


def _plain_http(host):
    bare = host.rsplit(":", 1)[0] if not host.startswith("[") else host.split("]")[0] + "]"
    if bare in ("localhost", "[::1]") or bare.startswith("127."):
        return True
    try:
        with open("/etc/docker/daemon.json") as handle:
            insecure = json.load(handle).get("insecure-registries") or []
    except (OSError, ValueError):
        insecure = []
    extra = [h.strip() for h in os.environ.get("NGCX_INSECURE_REGISTRIES", "").split(",") if h.strip()]
    return host in insecure or bare in insecure or host in extra


def _docker_auth(host):
    """The base64 user:password `docker login` stored for host (no credential helpers on a deploy host)."""
    folder = os.environ.get("DOCKER_CONFIG") or os.path.join(os.path.expanduser("~"), ".docker")
    try:
        with open(os.path.join(folder, "config.json")) as handle:
            auths = json.load(handle).get("auths") or {}
    except (OSError, ValueError):
        return None
    for name in (host, "https://" + host, "http://" + host):
        if (auths.get(name) or {}).get("auth"):
            return auths[name]["auth"]
    return None


# --- the checks (ngcx.trust.verify's) -----------------------------------------------------------------------

def split_ref(ref):
    """HOST/REPOSITORY[:TAG|@DIGEST] -> (host, repository, tag or digest)."""
    name, _, digest = ref.partition("@")
    host, _, path = name.partition("/")
    if not path:
        raise Refused(f"{ref!r} names no registry host")
    tag = "latest"
    if ":" in path.rsplit("/", 1)[-1]:
        path, _, tag = path.rpartition(":")
    return host, path, digest or tag


def check(ref, pem_text):
    """REPOSITORY@DIGEST of ref when its signature and attestations verify with the key; Refused(line) otherwise."""
    point = public_point(pem_text)
    host, repository, reference = split_ref(ref)
    registry = Registry(host, repository)
    _body, digest = registry.manifest(reference)
    if digest is None:
        raise Refused(f"{ref}: not found in the registry")
    hex_digest = digest.split(":", 1)[1]
    _check_signature(registry, digest, point)
    _check_attestations(registry, digest, hex_digest, point)
    return f"{host}/{repository}@{digest}"


def _layers(registry, tag, media_type):
    body, _digest = registry.manifest(tag)
    if body is None:
        return []
    return [d for d in json.loads(body.decode()).get("layers") or [] if d.get("mediaType") == media_type]


def _check_signature(registry, digest, point):
    tag = digest.replace(":", "-") + ".sig"
    layers = _layers(registry, tag, SIMPLESIGNING)
    if not layers:
        raise Refused(f"no signature for {digest} (nothing at tag {tag})")
    other = None
    for layer in layers:
        payload = registry.blob(layer.get("digest", ""))
        try:
            sig = base64.b64decode((layer.get("annotations") or {}).get(SIGNATURE_ANNOTATION, ""))
        except ValueError:
            continue
        if payload is None or not ecdsa_p256_verify(point, sig, payload):
            continue
        try:
            claimed = json.loads(payload.decode())["critical"]["image"]["docker-manifest-digest"]
        except (ValueError, KeyError, TypeError):
            claimed = None
        if claimed == digest:
            return
        other = claimed
    if other:
        raise Refused(f"signed digest differs: the signature is for {other}, the registry serves {digest}")
    raise Refused("signature does not match the key (signed by another key, or the signature was replaced)")


def _check_attestations(registry, digest, hex_digest, point):
    tag = digest.replace(":", "-") + ".att"
    verified = []
    for layer in _layers(registry, tag, DSSE_LAYER):
        kind = (layer.get("annotations") or {}).get("predicateType", "?")
        raw = registry.blob(layer.get("digest", ""))
        statement = _open_envelope(raw, point) if raw is not None else None
        if statement is None:
            if kind in NGCX_KINDS:
                raise Refused(f"attestation edited: {kind} does not verify with the key")
            continue
        subjects = [(s.get("digest") or {}).get("sha256") for s in statement.get("subject") or []]
        if hex_digest not in subjects or statement.get("predicateType") != kind:
            raise Refused(f"attestation {kind} is about another image, not {digest}")
        verified.append(kind)
    if SLSA not in verified:
        raise Refused(f"no {SLSA} attestation for {digest} (nothing at tag {tag})")


def _open_envelope(raw, point):
    try:
        env = json.loads(raw.decode())
        body = base64.b64decode(env["payload"])
        kind = env["payloadType"]
        if kind != INTOTO:
            return None
        signed = b"DSSEv1 " + str(len(kind)).encode() + b" " + kind.encode() + b" " + str(len(body)).encode() + \
            b" " + body
        if not any(ecdsa_p256_verify(point, base64.b64decode(s.get("sig", "")), signed)
                   for s in env.get("signatures") or []):
            return None
        statement = json.loads(body.decode())
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    return statement if isinstance(statement, dict) else None


def main(argv):
    if len(argv) != 2:
        print("usage: host_verify.py REF PUBLIC_KEY_PEM_FILE", file=sys.stderr)
        return 2
    try:
        with open(argv[1]) as handle:
            pem_text = handle.read()
        print(check(argv[0], pem_text))
    except Refused as exc:
        print(f"ngcx: image refused: {argv[0]}: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"ngcx: image refused: cannot read the public key {argv[1]}: {exc.strerror}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
