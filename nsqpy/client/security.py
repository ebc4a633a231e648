"""How a client proves itself to nsqd: TLS and the AUTH secret, with go-nsq's option names.

One `Security` value serves every way a client reaches nsqd. Over TCP it asks for TLS in
IDENTIFY (`tls_v1`), upgrades the socket when nsqd grants it and sends `AUTH <secret>` when
nsqd answers `auth_required`. Over HTTP it carries the secret as `Authorization: Bearer
<secret>` (what nsqd's routes behind `--auth-http-address` read) and, when an nsqd run with
`--tls-required` answers its plain port with `TLS_REQUIRED` and the `https_port`, goes there.

It is a frozen dataclass of strings and booleans, so it pickles: the Spark connector ships it
to executors, each of which builds its own `ssl.SSLContext` once (`context()`).
"""

import functools
import json
import ssl
from dataclasses import dataclass

__all__ = ["NO_SECURITY", "TLS_VERSIONS", "Security", "SecurityError", "SecurityMismatch"]

# go-nsq's tls_min_version names.
TLS_VERSIONS = {
    "tls1.0": ssl.TLSVersion.TLSv1,
    "tls1.1": ssl.TLSVersion.TLSv1_1,
    "tls1.2": ssl.TLSVersion.TLSv1_2,
    "tls1.3": ssl.TLSVersion.TLSv1_3,
}


class SecurityError(ValueError):
    """Settings that cannot make a TLS context (an unreadable CA file, a key that does not
    match its certificate, an unknown TLS version); the text is go-nsq's where it has one."""


class SecurityMismatch(ConnectionError):
    """nsqd and the client disagree: TLS asked for and not granted, or AUTH required and no
    secret given. A ConnectionError, so that callers that reconnect log it and go on."""


@dataclass(frozen=True)
class Security:
    """go-nsq's TLS options and `auth_secret`. The TLS files are used only with `tls_v1`,
    as in go-nsq."""

    tls_v1: bool = False
    tls_root_ca_file: str = ""
    tls_cert: str = ""
    tls_key: str = ""
    tls_insecure_skip_verify: bool = False
    tls_min_version: str = ""
    auth_secret: str = ""

    def __post_init__(self) -> None:
        if self.tls_min_version and self.tls_min_version not in TLS_VERSIONS:
            raise SecurityError(f"ERROR: {self.tls_min_version} is not a tls version")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise SecurityError("ERROR: tls_cert and tls_key must be given together")

    def context(self) -> ssl.SSLContext | None:
        """The TLS context for nsqd (None without `tls_v1`), built once per process."""
        return _context(self) if self.tls_v1 else None

    def https_context(self) -> ssl.SSLContext:
        """The context for an HTTPS URL: this one, or the system's defaults without TLS
        settings."""
        return self.context() or _default_context()

    def check(self) -> "Security":
        """Build the context now, so that a bad file is reported before any connection."""
        self.context()
        return self

    def http_headers(self) -> dict[str, str]:
        if not self.auth_secret:
            return {}
        return {"Authorization": f"Bearer {self.auth_secret}"}


NO_SECURITY = Security()


@functools.lru_cache(maxsize=16)
def _context(security: Security) -> ssl.SSLContext:
    try:
        context = ssl.create_default_context(cafile=security.tls_root_ca_file or None)
    except (OSError, ssl.SSLError) as error:
        raise SecurityError(
            f"ERROR: failed to read custom Certificate Authority file {error}"
        ) from None
    if security.tls_insecure_skip_verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if security.tls_cert:
        try:
            context.load_cert_chain(security.tls_cert, security.tls_key)
        except (OSError, ssl.SSLError) as error:
            raise SecurityError(f"ERROR: failed to load tls_cert/tls_key - {error}") from None
    if security.tls_min_version:
        context.minimum_version = TLS_VERSIONS[security.tls_min_version]
    return context


@functools.lru_cache(maxsize=1)
def _default_context() -> ssl.SSLContext:
    return ssl.create_default_context()


def auth_to_send(address: str, identify_reply: dict, secret: str) -> str | None:
    """What to send as `AUTH` after IDENTIFY, as go-nsq does: nothing when nsqd's answer does
    not ask for it, the secret when it does; SecurityMismatch when it does and none was
    given."""
    if not identify_reply.get("auth_required"):
        return None
    if not secret:
        raise SecurityMismatch(f"nsqd {address} requires AUTH and no auth secret was given")
    return secret


def tls_required_port(status: int, body: bytes) -> int | None:
    """The HTTPS port of nsqd's `TLS_REQUIRED` answer (403 on the plain port of an nsqd run
    with `--tls-required`), else None."""
    if status != 403 or b"TLS_REQUIRED" not in body:
        return None
    try:
        port = json.loads(body).get("https_port")
    except (ValueError, AttributeError):
        return None
    return port if isinstance(port, int) and port > 0 else None
