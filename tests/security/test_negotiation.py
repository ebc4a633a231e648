"""IDENTIFY feature negotiation on the wire: TLS, snappy, deflate and the TLS policy
(docs/protocol.md §2.1, §2.10, §6.1), against the nsqd console script.

Every case negotiates with `NegotiatedConnection` (stdlib ssl, python-snappy, zlib on the client
side, see support.py), asserts what the IDENTIFY reply granted, checks that each upgrade was
confirmed by an `OK` through its new layer, publishes (PUB and MPUB) and consumes messages
through the negotiated layers on that same connection, and reads the connection's TLS and
compression fields back from /stats while it is still open. The bodies include one large
compressible body (several snappy chunks and TLS records) and one random one (snappy's
uncompressed chunks), so a codec that only works for small frames fails here.

The TLS policy is Go's (nsqd/protocol_v2.go, apps/nsqd/options.go, nsqd/nsqd.go):
`-tls-required=true` is TLSRequired (TCP needs TLS and the plain HTTP port answers every
request with 403 TLS_REQUIRED), `-tls-required=tcp-https` is TLSRequiredExceptHTTP (TCP needs
TLS, plain HTTP still serves), and a client auth policy implies TLSRequired.
"""

import json
import os
import ssl

import pytest

from nsqpy.common.command import encode_mpub, encode_pub, encode_sub
from nsqpy.common.frame import FRAME_TYPE_ERROR
from tests.security.support import (
    ConnectionClosed,
    NegotiatedConnection,
    client_stats,
    connection,
    http_get,
    http_url,
    https_url,
    running_nsqd,
)

BODIES = [
    b"hello over a negotiated connection",
    b"nsq! " * 40_000,  # 200 kB, compresses well: several snappy chunks and TLS records
    os.urandom(70_000),  # incompressible: snappy sends it as uncompressed chunks
    b"x",
]
BOTH_COMPRESSIONS = "E_IDENTIFY_FAILED cannot enable both deflate and snappy compression"
GO_REPLY_KEYS = [
    "max_rdy_count",
    "version",
    "max_msg_timeout",
    "msg_timeout",
    "tls_v1",
    "deflate",
    "deflate_level",
    "max_deflate_level",
    "snappy",
    "sample_rate",
    "auth_required",
    "output_buffer_size",
    "output_buffer_timeout",
]


def tls_required_error(command: str) -> str:
    return f"E_INVALID cannot {command} in current state (TLS required)"


# -- daemons (one per configuration, shared by the module's tests) ----------------------------


@pytest.fixture(scope="module")
def tls_nsqd(certs, tmp_path_factory):
    """TLS configured but not required; snappy and deflate on, deflate up to level 9."""
    flags = [*certs.tls_flags(), "-max-deflate-level=9"]
    with running_nsqd(tmp_path_factory.mktemp("tls"), *flags) as daemon:
        yield daemon


@pytest.fixture(scope="module")
def bare_nsqd(tmp_path_factory):
    """No TLS configuration, snappy and deflate switched off."""
    flags = ["-snappy=false", "-deflate=false"]
    with running_nsqd(tmp_path_factory.mktemp("bare"), *flags) as daemon:
        yield daemon


@pytest.fixture(scope="module")
def capped_nsqd(tmp_path_factory):
    with running_nsqd(tmp_path_factory.mktemp("capped"), "-max-deflate-level=3") as daemon:
        yield daemon


@pytest.fixture(scope="module")
def tls_required_nsqd(certs, tmp_path_factory):
    flags = [*certs.tls_flags(), "-tls-required=true"]
    with running_nsqd(tmp_path_factory.mktemp("required"), *flags) as daemon:
        yield daemon


@pytest.fixture(scope="module")
def tcp_https_nsqd(certs, tmp_path_factory):
    flags = [*certs.tls_flags(), "-tls-required=tcp-https"]
    with running_nsqd(tmp_path_factory.mktemp("tcp-https"), *flags) as daemon:
        yield daemon


@pytest.fixture(scope="module")
def require_verify_nsqd(certs, tmp_path_factory):
    """Client certificates signed by our CA required (which implies -tls-required)."""
    flags = [
        *certs.tls_flags(),
        "-tls-client-auth-policy=require-verify",
        f"-tls-root-ca-file={certs.ca}",
    ]
    with running_nsqd(tmp_path_factory.mktemp("require-verify"), *flags) as daemon:
        yield daemon


@pytest.fixture(scope="module")
def require_nsqd(certs, tmp_path_factory):
    """Some client certificate required (Go: tls.RequireAnyClientCert; here verified, see below)."""
    flags = [*certs.tls_flags(), f"-tls-root-ca-file={certs.ca}", "-tls-client-auth-policy=require"]
    with running_nsqd(tmp_path_factory.mktemp("require"), *flags) as daemon:
        yield daemon


# -- helpers ----------------------------------------------------------------------------------


def round_trip(conn: NegotiatedConnection, topic: str) -> None:
    """PUB and MPUB the bodies, then SUB and receive and FIN them, all on this connection."""
    conn.send(encode_pub(topic, BODIES[0]))
    conn.expect_ok()
    conn.send(encode_mpub(topic, BODIES[1:]))
    conn.expect_ok()
    conn.subscribe(topic, "negotiated", rdy=len(BODIES))
    messages = conn.read_messages(len(BODIES))
    assert [message.body for message in messages] == BODIES
    assert all(message.attempts == 1 for message in messages)
    conn.finish(messages)


def stats_url(daemon, certs) -> tuple[str, ssl.SSLContext | None]:
    """/stats over HTTPS where nsqd has it (plain HTTP may be refused), presenting the
    CA-signed client certificate (the HTTPS port has the same client auth policy)."""
    if "HTTPS" in daemon.addresses:
        return f"https://{daemon.addresses['HTTPS']}", certs.client_context(with_certificate="ca")
    return f"http://{daemon.addresses['HTTP']}", None


def connection_stats(daemon, certs, client_id: str) -> dict:
    """The connection's /stats entry; Go leaves the TLS fields empty on a plain one."""
    url, context = stats_url(daemon, certs)
    stats = client_stats(url, client_id, context)
    if stats["tls"]:
        assert stats["tls_cipher_suite"]
    else:
        assert stats["tls_cipher_suite"] == "" and stats["tls_version"] == ""
    return stats


def negotiated_round_trip(daemon, certs, client_id: str, context=None, **identify) -> dict:
    """Negotiate, round-trip the bodies; the IDENTIFY reply, the /stats entry taken while
    the connection is open, the layers confirmed by OK, and the bytes received below the
    compression layer ("wire") and after it ("plain")."""
    with connection(daemon.port("TCP")) as conn:
        reply = conn.negotiate(context, client_id=client_id, **identify)
        round_trip(conn, client_id)
        stats = connection_stats(daemon, certs, client_id)
        return {
            "reply": reply,
            "stats": stats,
            "upgrades": conn.upgrade_oks,
            "wire": conn.wire_bytes_received,
            "plain": conn.plain_bytes_received,
        }


def grants(reply: dict) -> dict:
    keys = ("tls_v1", "snappy", "deflate", "deflate_level", "max_deflate_level")
    return {key: reply[key] for key in keys}


def stats_fields(stats: dict) -> dict:
    return {key: stats[key] for key in ("tls", "tls_version", "snappy", "deflate")}


# -- every combination --------------------------------------------------------------------------


def test_plain_negotiation_grants_nothing_and_stays_plain(tls_nsqd, certs):
    result = negotiated_round_trip(tls_nsqd, certs, "plain")
    reply = result["reply"]
    assert list(reply) == GO_REPLY_KEYS
    assert grants(reply) == {
        "tls_v1": False,
        "snappy": False,
        "deflate": False,
        "deflate_level": 6,
        "max_deflate_level": 9,
    }
    assert reply["auth_required"] is False
    assert result["upgrades"] == []
    assert result["wire"] == result["plain"]
    assert stats_fields(result["stats"]) == {
        "tls": False,
        "tls_version": "",
        "snappy": False,
        "deflate": False,
    }


def test_tls(tls_nsqd, certs):
    result = negotiated_round_trip(tls_nsqd, certs, "tls", certs.client_context(), tls_v1=True)
    assert grants(result["reply"])["tls_v1"] is True
    assert not result["reply"]["snappy"] and not result["reply"]["deflate"]
    assert result["upgrades"] == ["tls"]
    assert stats_fields(result["stats"]) == {
        "tls": True,
        "tls_version": "TLS1.3",
        "snappy": False,
        "deflate": False,
    }


def test_snappy(tls_nsqd, certs):
    result = negotiated_round_trip(tls_nsqd, certs, "snappy", snappy=True)
    assert result["reply"]["snappy"] is True
    assert not result["reply"]["tls_v1"] and not result["reply"]["deflate"]
    assert result["upgrades"] == ["snappy"]
    assert result["wire"] < result["plain"] / 2, "snappy did not compress"
    assert stats_fields(result["stats"]) == {
        "tls": False,
        "tls_version": "",
        "snappy": True,
        "deflate": False,
    }


@pytest.mark.parametrize("level", [1, 6, 9])
def test_deflate_at_level(tls_nsqd, certs, level):
    client_id = f"deflate-{level}"
    result = negotiated_round_trip(tls_nsqd, certs, client_id, deflate=True, deflate_level=level)
    assert grants(result["reply"]) == {
        "tls_v1": False,
        "snappy": False,
        "deflate": True,
        "deflate_level": level,
        "max_deflate_level": 9,
    }
    assert result["upgrades"] == ["deflate"]
    assert result["wire"] < result["plain"] / 2, "deflate did not compress"
    assert stats_fields(result["stats"]) == {
        "tls": False,
        "tls_version": "",
        "snappy": False,
        "deflate": True,
    }


def test_deflate_without_a_level_gets_6(tls_nsqd, certs):
    result = negotiated_round_trip(tls_nsqd, certs, "deflate-default", deflate=True)
    assert result["reply"]["deflate"] is True
    assert result["reply"]["deflate_level"] == 6


def test_deflate_level_above_the_maximum_is_capped(capped_nsqd, certs):
    result = negotiated_round_trip(
        capped_nsqd, certs, "deflate-capped", deflate=True, deflate_level=9
    )
    assert grants(result["reply"]) == {
        "tls_v1": False,
        "snappy": False,
        "deflate": True,
        "deflate_level": 3,
        "max_deflate_level": 3,
    }
    assert result["upgrades"] == ["deflate"]
    assert result["stats"]["deflate"] is True


def test_tls_and_snappy(tls_nsqd, certs):
    result = negotiated_round_trip(
        tls_nsqd, certs, "tls-snappy", certs.client_context(), tls_v1=True, snappy=True
    )
    assert grants(result["reply"])["tls_v1"] is True
    assert result["reply"]["snappy"] is True
    assert result["upgrades"] == ["tls", "snappy"]
    assert result["wire"] < result["plain"] / 2
    assert stats_fields(result["stats"]) == {
        "tls": True,
        "tls_version": "TLS1.3",
        "snappy": True,
        "deflate": False,
    }


def test_tls_and_deflate(tls_nsqd, certs):
    result = negotiated_round_trip(
        tls_nsqd,
        certs,
        "tls-deflate",
        certs.client_context(),
        tls_v1=True,
        deflate=True,
        deflate_level=9,
    )
    assert grants(result["reply"]) == {
        "tls_v1": True,
        "snappy": False,
        "deflate": True,
        "deflate_level": 9,
        "max_deflate_level": 9,
    }
    assert result["upgrades"] == ["tls", "deflate"]
    assert result["wire"] < result["plain"] / 2
    assert stats_fields(result["stats"]) == {
        "tls": True,
        "tls_version": "TLS1.3",
        "snappy": False,
        "deflate": True,
    }


@pytest.mark.parametrize("tls_v1", [False, True], ids=["plain", "tls-requested"])
def test_both_compressions_are_refused(tls_nsqd, tls_v1):
    # Go refuses before it sends the reply, so the error comes in clear even with tls_v1.
    with connection(tls_nsqd.port("TCP")) as conn:
        frame = conn.identify(snappy=True, deflate=True, tls_v1=tls_v1)
        assert (frame.frame_type, frame.data) == (FRAME_TYPE_ERROR, BOTH_COMPRESSIONS.encode())
        conn.expect_closed()


def test_disabled_compressions_are_not_granted_and_the_connection_stays_plain(bare_nsqd, certs):
    result = negotiated_round_trip(
        bare_nsqd, certs, "disabled", snappy=True, deflate=True, deflate_level=9
    )
    # Both requested but neither enabled: no conflict, nothing granted; Go's level is then
    # the default 6 (a requested level only counts when deflate is granted).
    assert grants(result["reply"]) == {
        "tls_v1": False,
        "snappy": False,
        "deflate": False,
        "deflate_level": 6,
        "max_deflate_level": 6,
    }
    assert result["upgrades"] == []
    assert result["wire"] == result["plain"]
    assert stats_fields(result["stats"]) == {
        "tls": False,
        "tls_version": "",
        "snappy": False,
        "deflate": False,
    }


@pytest.mark.parametrize("feature", ["snappy", "deflate"])
def test_a_disabled_compression_is_not_granted(bare_nsqd, certs, feature):
    result = negotiated_round_trip(bare_nsqd, certs, f"only-{feature}", **{feature: True})
    assert result["reply"][feature] is False
    assert result["upgrades"] == []
    assert result["wire"] == result["plain"]


def test_tls_requested_from_an_nsqd_without_tls_is_not_granted(bare_nsqd, certs):
    result = negotiated_round_trip(bare_nsqd, certs, "no-tls-config", tls_v1=True)
    assert result["reply"]["tls_v1"] is False
    assert result["upgrades"] == []
    assert result["stats"]["tls"] is False


# -- client certificates ----------------------------------------------------------------------


def tls_handshake_fails(daemon, context: ssl.SSLContext) -> None:
    """IDENTIFY grants TLS, but the handshake (or, under TLS 1.3, the first read after it,
    where the server's alert arrives) fails, and no OK ever comes through."""
    with connection(daemon.port("TCP")) as conn:
        frame = conn.identify(tls_v1=True)
        assert json.loads(frame.data)["tls_v1"] is True
        with pytest.raises((ssl.SSLError, ConnectionClosed, ConnectionResetError)):
            conn.start_tls(context)


def test_require_verify_refuses_a_client_without_certificate(require_verify_nsqd, certs):
    tls_handshake_fails(require_verify_nsqd, certs.client_context())


def test_require_verify_refuses_a_certificate_from_an_unknown_ca(require_verify_nsqd, certs):
    tls_handshake_fails(require_verify_nsqd, certs.client_context(with_certificate="stranger"))


def test_require_verify_accepts_a_ca_signed_certificate(require_verify_nsqd, certs):
    context = certs.client_context(with_certificate="ca")
    result = negotiated_round_trip(require_verify_nsqd, certs, "verified", context, tls_v1=True)
    assert result["upgrades"] == ["tls"]
    assert result["stats"]["tls"] is True


def test_a_client_auth_policy_implies_tls_required(require_verify_nsqd):
    with connection(require_verify_nsqd.port("TCP")) as conn:
        conn.send(encode_sub("t", "c"))
        conn.expect_error(tls_required_error("SUB"))


def test_require_refuses_a_client_without_certificate(require_nsqd, certs):
    tls_handshake_fails(require_nsqd, certs.client_context())


def test_require_checks_the_certificate_against_the_root_ca(require_nsqd, certs):
    # Go's "require" is tls.RequireAnyClientCert: a certificate must be sent and is not
    # verified. Python's ssl module cannot take a certificate without verifying it, so
    # nsqpy's "require" verifies it against --tls-root-ca-file (a documented difference):
    # one from a CA nsqd does not know is refused, a CA-signed one is accepted.
    tls_handshake_fails(require_nsqd, certs.client_context(with_certificate="stranger"))
    context = certs.client_context(with_certificate="ca")
    result = negotiated_round_trip(require_nsqd, certs, "known", context, tls_v1=True)
    assert result["upgrades"] == ["tls"]
    assert result["stats"]["tls"] is True


# -- TLS required --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "command, data",
    [
        ("SUB", encode_sub("t", "c")),
        ("PUB", encode_pub("t", b"body")),
        ("MPUB", encode_mpub("t", [b"a", b"b"])),
        ("NOP", b"NOP\n"),
    ],
)
def test_tls_required_refuses_plain_commands(tls_required_nsqd, command, data):
    with connection(tls_required_nsqd.port("TCP")) as conn:
        conn.send(data)
        conn.expect_error(tls_required_error(command))


def test_tls_required_refuses_commands_after_an_identify_without_tls(tls_required_nsqd):
    with connection(tls_required_nsqd.port("TCP")) as conn:
        reply = conn.negotiate()
        assert reply["tls_v1"] is False
        conn.send(encode_pub("t", b"body"))
        conn.expect_error(tls_required_error("PUB"))


@pytest.mark.parametrize("compression", [{}, {"snappy": True}], ids=["tls", "tls-snappy"])
def test_tls_required_serves_after_identify_tls(tls_required_nsqd, certs, compression):
    client_id = "required-" + "-".join(compression) if compression else "required"
    result = negotiated_round_trip(
        tls_required_nsqd, certs, client_id, certs.client_context(), tls_v1=True, **compression
    )
    assert result["upgrades"] == ["tls", *compression]
    assert result["stats"]["tls"] is True


def test_tcp_https_requires_tls_on_tcp(tcp_https_nsqd, certs):
    with connection(tcp_https_nsqd.port("TCP")) as conn:
        conn.send(encode_pub("t", b"body"))
        conn.expect_error(tls_required_error("PUB"))
    result = negotiated_round_trip(
        tcp_https_nsqd, certs, "tcp-https", certs.client_context(), tls_v1=True
    )
    assert result["stats"]["tls"] is True


# -- HTTPS ---------------------------------------------------------------------------------------


def test_https_ping(tls_nsqd, certs):
    reply = http_get(https_url(tls_nsqd, "/ping"), certs.client_context())
    assert (reply.status, reply.body) == (200, b"OK")
    # TLS is optional here, so plain HTTP serves too.
    reply = http_get(http_url(tls_nsqd, "/ping"))
    assert (reply.status, reply.body) == (200, b"OK")


def test_tls_required_true_answers_plain_http_with_403(tls_required_nsqd, certs):
    https_port = tls_required_nsqd.port("HTTPS")
    for path in ("/ping", "/stats?format=json", "/pub?topic=t"):
        reply = http_get(http_url(tls_required_nsqd, path))
        assert reply.status == 403, (path, reply)
        assert reply.body == f'{{"message": "TLS_REQUIRED", "https_port": {https_port}}}'.encode()
    reply = http_get(https_url(tls_required_nsqd, "/ping"), certs.client_context())
    assert (reply.status, reply.body) == (200, b"OK")


def test_tls_required_tcp_https_still_serves_plain_http(tcp_https_nsqd, certs):
    # tcp-https is Go's TLSRequiredExceptHTTP: only TCP clients must use TLS.
    reply = http_get(http_url(tcp_https_nsqd, "/ping"))
    assert (reply.status, reply.body) == (200, b"OK")
    reply = http_get(https_url(tcp_https_nsqd, "/ping"), certs.client_context())
    assert (reply.status, reply.body) == (200, b"OK")
