"""TURN credentials for VoIP (client-server spec, "Voice over IP"), from `[voip]`.

With a shared secret the credentials are the time-limited kind coturn's
`use-auth-secret` checks: the username is `<expiry unix time>:<user ID>` and the password
base64(HMAC-SHA1(secret, username)), so the TURN server needs no list of users. Without one,
a static username and password. Without URIs, nothing: clients then call without TURN.
The secret is never logged or sent.
"""

from __future__ import annotations

import base64
import hashlib
import hmac

from homeserver.config import VoipConfig
from homeserver.core.clock import now_ms


class TurnCredentials:
    def __init__(self, config: VoipConfig):
        self.config = config

    def for_user(self, user_id: str) -> dict:
        config = self.config
        lifetime = config.turn_user_lifetime
        if config.turn_uris and config.turn_shared_secret:
            username = f"{now_ms() // 1000 + lifetime}:{user_id}"
            mac = hmac.new(
                config.turn_shared_secret.encode("utf-8"), username.encode("utf-8"), hashlib.sha1
            )
            password = base64.b64encode(mac.digest()).decode("ascii")
        elif config.turn_uris and config.turn_username and config.turn_password:
            username, password = config.turn_username, config.turn_password
        else:
            return {}
        return {
            "username": username,
            "password": password,
            "ttl": lifetime,
            "uris": list(config.turn_uris),
        }
