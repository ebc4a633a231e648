"""Who may use an HTTP route (docs/operations.md, "Securing a cluster").

A route that needs something declares a `Need` for each request: a permission (`publish`,
`subscribe` or `admin`, as an auth server grants them; `cluster`, which only the cluster's own
callers hold) and the topic and channel it is needed on. The request's credential is the
secret of an `Authorization: Bearer <secret>` header. The cluster secret (`--cluster-secret`,
the same on every nsqd and nsqlookupd of a cluster) holds every permission; any other secret is
asked of the auth servers as TCP's AUTH asks them (with the client's address, and over HTTPS
its certificate's common name), and their answer is kept for its TTL, so that only the first
request of a client in each TTL waits for them.

Answers, in Go's HTTP API form: 401 `AUTH_REQUIRED` without a credential, `AUTH_FAILED` when
no auth server answered usably, `UNAUTHORIZED` when it granted nothing; 403 `FORBIDDEN` when
what it granted does not cover the request.
"""

import hmac
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from nsqpy.daemon.auth import AuthError, AuthState, ip_of, query_any
from nsqpy.daemon.http_server import Request, Response, first_param, parse_query, v1_response

if TYPE_CHECKING:
    import logging

# How many credentials' answers are kept at once; past it, the expired ones go first.
CACHE_SIZE = 10_000
# How many query strings' needs each route keeps.
NEED_CACHE_SIZE = 1024
# `Authorization` header's scheme, compared case-insensitively (RFC 9110 §11.1).
_BEARER = "bearer "


@dataclass(frozen=True, slots=True)
class Need:
    """What a request needs: `permission` on `topic` and `channel` (None: any)."""

    permission: str
    topic: str | None = None
    channel: str | None = None


# The need of a request to a route; None: the route is open to everyone.
NeedOf = Callable[[Request], Need | None]


def need_of(permission: str, scope: str) -> NeedOf:
    """The need of `permission` on the request's `topic` parameter ("topic"), its `topic`
    and `channel` ("channel"), or on none ("node": any topic). A parameter not given is
    needed as ""; the route answers its own error once allowed."""
    if scope == "node":
        node_need = Need(permission)
        return lambda request: node_need

    # Clients repeat the same query string (a publisher its topic's): its need is kept.
    known: dict[str, Need] = {}

    def need(request: Request) -> Need:
        query = request.query_string
        found = known.get(query)
        if found is None:
            params = parse_query(query)
            topic = first_param(params, "topic") or ""
            channel = first_param(params, "channel") or "" if scope == "channel" else None
            found = Need(permission, topic, channel)
            if len(known) >= NEED_CACHE_SIZE:
                known.clear()
            known[query] = found
        return found

    return need


class _Pending:
    """The verdict on a request whose credential's answer must first be asked for."""


PENDING = _Pending()


def bearer_secret(request: Request) -> str | None:
    """The secret of the request's `Authorization: Bearer` header, if any."""
    value = request.headers.get("authorization")
    if value is None or not value[:7].lower() == _BEARER:
        return None
    return value[7:].strip()


class HTTPAccess:
    """The verdicts on requests to routes with a `Need`, for one daemon."""

    def __init__(
        self,
        *,
        auth_addresses: list[str],
        timeout: float,
        cluster_secrets: list[str],
        log: "logging.Logger",
        realm: str,
    ) -> None:
        self.auth_addresses = auth_addresses
        self.timeout = timeout
        self.cluster_secrets = [secret.encode() for secret in cluster_secrets]
        self.log = log
        self.realm = realm
        self._states: dict[tuple[str, str, bool, str], AuthState] = {}
        # The same answers by what a connection's requests repeat (the header as sent, the
        # client's address and port, the certificate's name): found without parsing either.
        self._recent: dict[tuple[str, str, str], AuthState] = {}

    def is_cluster(self, secret: str) -> bool:
        """Whether `secret` is the cluster's (or the node's own workers')."""
        given = secret.encode()
        return any(hmac.compare_digest(given, known) for known in self.cluster_secrets)

    def _key(self, request: Request, secret: str) -> tuple[str, str, bool, str]:
        return (secret, ip_of(request.remote), request.tls, request.common_name)

    def verdict(self, request: Request, need: Need) -> Response | _Pending | None:
        """None: allowed; PENDING: the auth servers must be asked first (`ask`); else the
        refusal."""
        recent = self._recent.get(_recent_key(request))
        if recent is not None and not recent.is_expired():
            return _judge(recent, need)
        secret = bearer_secret(request)
        if not secret:
            response = v1_response(401, "AUTH_REQUIRED")
            response.headers.append(("WWW-Authenticate", f'Bearer realm="{self.realm}"'))
            return response
        if self.cluster_secrets and self.is_cluster(secret):
            return None
        if need.permission == "cluster" or not self.auth_addresses:
            return v1_response(403, "FORBIDDEN")
        state = self._states.get(self._key(request, secret))
        if state is None or state.is_expired():
            return PENDING
        self._remember(request, state)
        return _judge(state, need)

    def _remember(self, request: Request, state: AuthState) -> None:
        if len(self._recent) >= CACHE_SIZE:
            self._recent.clear()
        self._recent[_recent_key(request)] = state

    async def ask(self, request: Request, need: Need) -> Response | None:
        """The verdict on a PENDING request, once the auth servers answered about its
        credential (kept for the answer's TTL); 401 `AUTH_FAILED` when none could."""
        secret = bearer_secret(request) or ""
        key = self._key(request, secret)
        try:
            state = await query_any(
                self.auth_addresses, key[1], key[2], secret, key[3], self.timeout
            )
        except AuthError as error:
            # As for TCP, the auth server's error goes to the log, not to the client.
            self.log.error("HTTP: %s - auth failed - %s", request.remote, error)
            return v1_response(401, "AUTH_FAILED")
        if len(self._states) >= CACHE_SIZE:
            self._states = {k: s for k, s in self._states.items() if not s.is_expired()}
            if len(self._states) >= CACHE_SIZE:
                self._states.clear()
        self._states[key] = state
        self._remember(request, state)
        return _judge(state, need)


def _recent_key(request: Request) -> tuple[str, str, str]:
    return (request.headers.get("authorization", ""), request.remote, request.common_name)


def cluster_route_needs(
    routes: "tuple[tuple[str, str], ...]", cluster_secret: str, admins_otherwise: bool
) -> dict[tuple[str, str], NeedOf]:
    """The needs of the routes the cluster calls itself: the cluster secret's when there is
    one, else `admin` when the daemon guards its routes (`admins_otherwise`), else none."""
    if cluster_secret:
        return {route: need_of("cluster", "node") for route in routes}
    if admins_otherwise:
        return {route: need_of("admin", "node") for route in routes}
    return {}


def _judge(state: AuthState, need: Need) -> Response | None:
    if not state.authorizations:
        return v1_response(401, "UNAUTHORIZED")
    if not state.grants(need.permission, need.topic, need.channel):
        return v1_response(403, "FORBIDDEN")
    return None
