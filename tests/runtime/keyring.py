"""Keys for the runtime tests: an admin key for the servers whose tests load and unload models
(model control is off by default: access.py), and the headers that send it."""

from __future__ import annotations

from ngcx_runtime.access import AccessConfig
from ngcx_runtime.keys import sha256_hex

ADMIN_KEY = "admin-key-for-the-tests-0123456789"
USER_KEY = "user-key-for-the-tests-9876543210"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
USER = {"Authorization": f"Bearer {USER_KEY}"}
GRPC_ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}          # gRPC metadata keys are lower case
GRPC_USER = {"authorization": f"Bearer {USER_KEY}"}
# model control on (explicit, with the admin key); every other endpoint stays open as before
CONTROL = AccessConfig(model_control="explicit", admin_key_sha256=(sha256_hex(ADMIN_KEY),))
# every endpoint but health needs a key (USER_KEY or ADMIN_KEY); model control explicit
KEYS = AccessConfig(auth_key_sha256=(sha256_hex(USER_KEY),), model_control="explicit",
                    admin_key_sha256=(sha256_hex(ADMIN_KEY),))
