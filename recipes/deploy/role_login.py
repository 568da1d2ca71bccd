# ngcx role login: log this host in to its cloud's registry with the instance role's credentials.
# Included by host.sh.j2 and bake.sh.j2, run there as `python3 - CLOUD REGION API REGISTRY ACR_INSTANCE [...]`
# (five words per registry; ACR_INSTANCE may be empty).
# Standard library only, Python >= 3.6 (Alibaba Cloud Linux 3 ships 3.6): a host needs nothing installed.
# Why here and not in ngcx: the credentials exist only on the host (the metadata service answers the
# instance itself), so nothing ngcx sends to the cloud can be replayed as a registry login. Nothing
# secret is printed: errors name the step and the API's error code only; the registry password goes
# to `docker login --password-stdin` and nowhere else.
import base64
import datetime
import hashlib
import hmac
import json
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
import uuid

METADATA = {"aliyun": ("http://100.100.100.200", "X-aliyun-ecs-metadata-token",
                       "/latest/meta-data/ram/security-credentials/"),
            "aws": ("http://169.254.169.254", "X-aws-ec2-metadata-token",
                    "/latest/meta-data/iam/security-credentials/")}
TIMEOUT_S = 10
ECR_TARGET = "AmazonEC2ContainerRegistry_V20150921.GetAuthorizationToken"


class LoginError(Exception):
    pass


def call(url, method="GET", headers=None, data=None, proxy=True):
    """Body of the answer; an HTTP error becomes one line with the status and the API's error code."""
    handlers = [] if proxy else [urllib.request.ProxyHandler({})]   # the metadata service: never a proxy
    request = urllib.request.Request(url, data=data, method=method,
                                     headers=dict(headers or {}, **{"User-Agent": "ngcx-role-login"}))
    try:
        with urllib.request.build_opener(*handlers).open(request, timeout=TIMEOUT_S) as answer:
            return answer.read().decode()
    except urllib.error.HTTPError as exc:
        raise LoginError("HTTP %d %s" % (exc.code, error_code(exc.read()))) from None
    except (urllib.error.URLError, OSError) as exc:
        raise LoginError("unreachable (%s)" % getattr(exc, "reason", exc)) from None


def error_code(body):
    try:
        answer = json.loads(body.decode())
    except ValueError:
        return ""
    if not isinstance(answer, dict):
        return ""
    return str(answer.get("Code") or answer.get("__type") or answer.get("code") or "")


def role_credentials(cloud):
    """The attached role's temporary credentials, through the metadata service's token (hardened) mode."""
    base, header, path = METADATA[cloud]
    try:
        token = call(base + "/latest/api/token", "PUT", {header + "-ttl-seconds": "300"}, b"", proxy=False)
        roles = call(base + path, headers={header: token}, proxy=False).split()
        if not roles:
            raise LoginError("no role is attached to this instance")
        return json.loads(call(base + path + roles[0], headers={header: token}, proxy=False))
    except LoginError as exc:
        raise LoginError("the metadata service gave no role credentials: %s" % exc) from None


def quote(value):
    return urllib.parse.quote(str(value), safe="-_.~")


def utc():
    return datetime.datetime.now(datetime.timezone.utc)


def acr_login(region, api, instance, creds):
    """cr 2018-12-01 GetAuthorizationToken (Enterprise Edition), signed as Alibaba Cloud RPC v1 (HMAC-SHA1) with
    the STS token; without an instance, the Personal Edition's API (acr_personal_login)."""
    if not instance:
        return acr_personal_login(region, api, creds)
    params = {"Format": "JSON", "Version": "2018-12-01", "Action": "GetAuthorizationToken", "RegionId": region,
              "AccessKeyId": creds["AccessKeyId"], "SecurityToken": creds["SecurityToken"],
              "SignatureMethod": "HMAC-SHA1", "SignatureVersion": "1.0", "SignatureNonce": uuid.uuid4().hex,
              "Timestamp": utc().strftime("%Y-%m-%dT%H:%M:%SZ")}
    params["InstanceId"] = instance
    query = "&".join(quote(k) + "=" + quote(v) for k, v in sorted(params.items()))
    digest = hmac.new((creds["AccessKeySecret"] + "&").encode(), ("GET&%2F&" + quote(query)).encode(), hashlib.sha1)
    signature = base64.b64encode(digest.digest()).decode()
    answer = json.loads(call(api.rstrip("/") + "/?" + query + "&Signature=" + quote(signature)))
    return answer["TempUsername"], answer["AuthorizationToken"]


def acr_personal_login(region, api, creds):
    """cr 2016-06-07 GetAuthorizationToken: ROA `GET /tokens`, signed in headers (aliyun-python-sdk-core's ROA
    scheme: method, Accept, Content-MD5, Content-Type, Date, the x-acs-* headers, the path; key = the secret)."""
    headers = {"Accept": "application/json", "Date": utc().strftime("%a, %d %b %Y %H:%M:%S GMT"),
               "x-acs-signature-method": "HMAC-SHA1", "x-acs-signature-nonce": uuid.uuid4().hex,
               "x-acs-signature-version": "1.0", "x-acs-version": "2016-06-07", "x-acs-region-id": region,
               "x-acs-security-token": creds["SecurityToken"]}
    signed = "".join(k + ":" + headers[k] + "\n" for k in sorted(headers) if k.startswith("x-acs-"))
    to_sign = "GET\n" + headers["Accept"] + "\n\n\n" + headers["Date"] + "\n" + signed + "/tokens"
    digest = hmac.new(creds["AccessKeySecret"].encode(), to_sign.encode(), hashlib.sha1).digest()
    headers["Authorization"] = "acs %s:%s" % (creds["AccessKeyId"], base64.b64encode(digest).decode())
    data = json.loads(call(api.rstrip("/") + "/tokens", headers=headers)).get("data") or {}
    if not data.get("tempUserName") or not data.get("authorizationToken"):
        raise LoginError("the answer holds no token")
    return data["tempUserName"], data["authorizationToken"]


def ecr_login(region, api, creds):
    """ECR GetAuthorizationToken, signed with SigV4 and the session token; the token is base64 'AWS:password'."""
    body, now = b"{}", utc()
    amz_date, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
    headers = {"content-type": "application/x-amz-json-1.1", "host": urllib.parse.urlsplit(api).netloc,
               "x-amz-date": amz_date, "x-amz-security-token": creds["Token"], "x-amz-target": ECR_TARGET}
    signed = ";".join(sorted(headers))
    canonical = "\n".join(["POST", "/", "", "".join(k + ":" + headers[k] + "\n" for k in sorted(headers)), signed,
                           hashlib.sha256(body).hexdigest()])
    scope = "/".join((day, region, "ecr", "aws4_request"))
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = ("AWS4" + creds["SecretAccessKey"]).encode()
    for part in (day, region, "ecr", "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    headers["authorization"] = "AWS4-HMAC-SHA256 Credential=%s/%s, SignedHeaders=%s, Signature=%s" % (
        creds["AccessKeyId"], scope, signed, hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest())
    answer = json.loads(call(api.rstrip("/") + "/", "POST", headers, body))
    user, _, password = base64.b64decode(answer["authorizationData"][0]["authorizationToken"]).decode().partition(":")
    return user, password


def login(cloud, region, api, registry, instance, creds):
    try:
        if cloud == "aliyun":
            user, password = acr_login(region, api, instance, creds)
        else:
            user, password = ecr_login(region, api, creds)
    except LoginError as exc:
        raise LoginError("the registry's token API (%s) refused the role: %s" % (api, exc)) from None
    done = subprocess.run(["docker", "login", "--username", user, "--password-stdin", registry],
                          input=password.encode(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    if done.returncode != 0:
        raise LoginError("docker login to %s: %s" % (registry, done.stderr.decode(errors="replace")[-200:].strip()))


def main(argv):
    """Every registry named (5 words each), one line per failure; a failure does not stop the next login."""
    failed = []
    creds = role_credentials(argv[0])
    for at in range(0, len(argv) - 4, 5):
        try:
            login(*argv[at:at + 5], creds=creds)
        except LoginError as exc:
            failed.append(str(exc))
    if failed:
        raise LoginError("; ".join(failed))


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except LoginError as exc:
        sys.stderr.write("%s\n" % exc)
        sys.exit(1)
