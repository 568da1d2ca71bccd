# ngcx host verify: on the deploy host, check an image's cosign signature and attestations before `docker run`.
# Run as `python3 - REF PUBLIC_KEY_PEM_FILE` (or python3 host_verify.py ...); prints REPOSITORY@DIGEST to run on
# success (exit 0), else one line `ngcx: image refused: ...` on stderr (exit 1).
# Standard library only, Python >= 3.6 (Alibaba Cloud Linux 3 ships 3.6), like recipes/deploy/role_login.py, plus
# the openssl command the host script needs anyway for its TLS key pair: ECDSA P-256 is `openssl dgst -sha256
# -verify`, which keeps this program small enough to ride in the host script (user-data: 16 KB raw; a Cloud
# Assistant command: 18 KB base64-encoded; a pure-Python P-256 cost 1.3 KB of that, packed). The checks are
# ngcx.trust.verify's, which follow sigstore/cosign specs/SIGNATURE_SPEC.md (the .sig tag, the simple-signing
# payload, the base64 DER signature over SHA-256 of the payload) and cosign's attestation layout (the .att tag,
# DSSE envelopes signed over PAE, in-toto statements naming the digest).
# Why again on the host: the tag may move between ngcx's check and the host's pull; the host runs the digest it
# checked. Registry credentials are the ones `docker login` left in the host's docker config (role_login.py);
# nothing secret is printed. The public key is public: it travels with the host script.
import base64
import hashlib
import json
import os
import subprocess
import sys
import tempfile
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

class Refused(Exception):
    pass


# --- ECDSA P-256 through the host's openssl (the host script already needs it for its TLS key pair) -----------

def _openssl(args, data=None):
    done = subprocess.run(["openssl"] + args, input=data, stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # noqa: UP022 (3.6)
    return done.returncode, done.stdout


def public_point(pem_text):
    """A file holding the PEM public key, once openssl reads it as a P-256 key; Refused otherwise."""
    with tempfile.NamedTemporaryFile("w", suffix=".pem", delete=False) as handle:
        handle.write(pem_text)
    try:
        code, out = _openssl(["pkey", "-pubin", "-in", handle.name, "-noout", "-text"])
    except OSError:
        raise Refused("openssl is not installed on this host") from None
    if code != 0 or not (b"prime256v1" in out or b"P-256" in out):
        raise Refused("the public key is not an ECDSA P-256 PEM public key")
    return handle.name


def ecdsa_p256_verify(public_point, der_signature, message):
    """True when der_signature is a valid ECDSA P-256 / SHA-256 signature of message by the key file public_point."""
    with tempfile.NamedTemporaryFile("wb", suffix=".sig", delete=False) as handle:
        handle.write(der_signature)
    try:
        code, _out = _openssl(["dgst", "-sha256", "-verify", public_point, "-signature", handle.name], message)
    finally:
        os.unlink(handle.name)
    return code == 0


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
