"""AUTH against `--auth-http-address` servers (Go's internal/auth, docs/protocol.md §2.2).

nsqd (for TCP's AUTH and its HTTP routes) and nsqlookupd (for its operations) ask
`GET /auth?remote_ip=&tls=&secret=&common_name=` of the auth servers in random order until one
answers, keep the authorizations for their `ttl` seconds, and match topics and channels
against their regular expressions (unanchored, as Go's MatchString). Anything that goes wrong
while asking denies: an unreachable auth server never lets a client in.

Besides Go's `subscribe` and `publish`, an authorization may grant `admin`: the HTTP routes
that change a node or the cluster (docs/operations.md, "Securing a cluster"). Go nsqd refuses
an answer naming it, so an auth server shared with Go nsqds grants it only to identities that
never AUTH on them.
"""

import random
import re
import time
import urllib.parse
from dataclasses import dataclass, field

import trio

from nsqpy.daemon.http_get import get_json

# What an authorization may grant.
PERMISSIONS = ("subscribe", "publish", "admin")


class AuthError(Exception):
    """The auth servers could not be asked, or answered something unusable."""


@dataclass
class Authorization:
    topic: str
    channels: list[str]
    permissions: list[str]

    def is_allowed(self, topic: str, channel: str) -> bool:
        """Go's IsAllowed: a PUB (no channel) needs `publish`, and its empty channel name
        must match a channel pattern too; a SUB needs `subscribe`."""
        return self.grants("subscribe" if channel else "publish", topic, channel)

    def grants(self, permission: str, topic: str | None, channel: str | None) -> bool:
        """`permission` on `topic` (None: any topic) and `channel` (None: any channel, which
        takes at least one channel pattern, except for `admin`)."""
        if permission not in self.permissions:
            return False
        try:
            if topic is not None and not re.search(self.topic, topic):
                return False
            if channel is None:
                return permission == "admin" or bool(self.channels)
            return any(re.search(pattern, channel) for pattern in self.channels)
        except re.error:
            return False


@dataclass
class AuthState:
    identity: str = ""
    identity_url: str = ""
    expires: float = 0.0
    authorizations: list[Authorization] = field(default_factory=list)

    def __post_init__(self) -> None:
        # `grants`' answers by (permission, topic, channel): an HTTP client asks the same
        # ones. Not a field: `dataclasses.asdict` hands the state to other workers without it.
        self._granted: dict[tuple[str, str | None, str | None], bool] = {}

    def is_expired(self) -> bool:
        return time.monotonic() >= self.expires

    def is_allowed(self, topic: str, channel: str) -> bool:
        return any(a.is_allowed(topic, channel) for a in self.authorizations)

    def grants(self, permission: str, topic: str | None, channel: str | None) -> bool:
        key = (permission, topic, channel)
        granted = self._granted.get(key)
        if granted is None:
            granted = any(a.grants(permission, topic, channel) for a in self.authorizations)
            if len(self._granted) >= 1024:
                self._granted.clear()
            self._granted[key] = granted
        return granted

    @classmethod
    def from_dict(cls, fields: dict) -> "AuthState":
        """The state `dataclasses.asdict` gave (handed to another `--workers` process;
        `expires` is on the machine's monotonic clock, which every process shares)."""
        return cls(
            identity=fields["identity"],
            identity_url=fields["identity_url"],
            expires=fields["expires"],
            authorizations=[Authorization(**entry) for entry in fields["authorizations"]],
        )


def ip_of(remote: str) -> str:
    """The address part of `host:port` (IPv6 without its brackets), as Go's AUTH sends it."""
    return remote.rsplit(":", 1)[0].strip("[]")


def _auth_url(address: str, remote_ip: str, tls: bool, secret: str, common_name: str) -> str:
    # Go's url.Values.Encode sorts the keys; a full URL gets `?query` appended as it is.
    query = urllib.parse.urlencode(
        {
            "common_name": common_name,
            "remote_ip": remote_ip,
            "secret": secret,
            "tls": "true" if tls else "false",
        }
    )
    if address.startswith(("http://", "https://")):
        return f"{address}?{query}"
    return f"http://{address}/auth?{query}"


def _query_one(url: str, timeout: float) -> AuthState:
    try:
        status, document = get_json(url, timeout)
    except (OSError, ValueError) as error:
        raise AuthError(f"{url}: {error}") from error
    if status != 200:
        raise AuthError(f"got response {status} from {url}")
    try:
        authorizations = [
            Authorization(
                str(item["topic"]),
                [str(c) for c in item.get("channels") or []],
                [str(p) for p in item.get("permissions") or []],
            )
            for item in document.get("authorizations") or []
        ]
        _validate(authorizations, int(document.get("ttl", 0)))
        return AuthState(
            identity=str(document.get("identity", "")),
            identity_url=str(document.get("identity_url", "")),
            expires=time.monotonic() + float(document.get("ttl", 0)),
            authorizations=authorizations,
        )
    except (TypeError, KeyError, AttributeError, ValueError) as error:
        raise AuthError(f"{url}: invalid response - {error}") from error


def _validate(authorizations: list[Authorization], ttl: int) -> None:
    """Go's QueryAuthd refuses what it could not apply: unknown permissions (`admin` is
    nsqpy's), patterns that do not compile, a TTL that is not positive."""
    for authorization in authorizations:
        for permission in authorization.permissions:
            if permission not in PERMISSIONS:
                raise AuthError(f"unknown permission {permission}")
        for pattern in (authorization.topic, *authorization.channels):
            try:
                re.compile(pattern)
            except re.error as error:
                raise AuthError(f"unable to compile {pattern!r} {error}") from None
    if ttl <= 0:
        raise AuthError(f"invalid TTL {ttl} (must be >0)")


async def query_any(
    addresses: list[str],
    remote_ip: str,
    tls: bool,
    secret: str,
    common_name: str,
    timeout: float,
) -> AuthState:
    """The first auth server (in random order) that answers; AuthError if none does."""
    errors = []
    for address in random.sample(addresses, len(addresses)):
        url = _auth_url(address, remote_ip, tls, secret, common_name)
        try:
            return await trio.to_thread.run_sync(_query_one, url, timeout)
        except AuthError as error:
            errors.append(str(error))
    raise AuthError("; ".join(errors) or "no auth server")
