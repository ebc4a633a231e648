"""TLS for nsqd: the server context from `--tls-*` options, and the details /stats shows.

Go's policies map onto the stdlib ssl module: `--tls-client-auth-policy=require-verify`
demands a client certificate signed by `--tls-root-ca-file`; `require` demands a certificate
too (Python's ssl cannot take a certificate without checking it, so it is checked against the
root CA file when one is given, else against the system's).
"""

import ssl

import trio

from nsqpy.nsqd.options import Options

_MIN_VERSIONS = {
    "ssl3.0": ssl.TLSVersion.TLSv1,  # SSLv3 cannot be enabled in modern OpenSSL
    "tls1.0": ssl.TLSVersion.TLSv1,
    "tls1.1": ssl.TLSVersion.TLSv1_1,
    "tls1.2": ssl.TLSVersion.TLSv1_2,
    "tls1.3": ssl.TLSVersion.TLSv1_3,
}


def server_context(options: Options) -> ssl.SSLContext | None:
    """None when TLS is not configured (no certificate and key)."""
    if not (options.tls_cert and options.tls_key):
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.minimum_version = _MIN_VERSIONS[options.tls_min_version]
    except ValueError:
        context.minimum_version = ssl.TLSVersion.TLSv1_2
    if options.tls_min_version in ("ssl3.0", "tls1.0", "tls1.1"):
        # Old protocol versions need OpenSSL's lowest security level to be negotiable.
        context.set_ciphers("DEFAULT:@SECLEVEL=0")
    context.load_cert_chain(options.tls_cert, options.tls_key)
    if options.tls_client_auth_policy:
        context.verify_mode = ssl.CERT_REQUIRED
        if options.tls_root_ca_file:
            context.load_verify_locations(options.tls_root_ca_file)
        else:
            context.load_default_certs(ssl.Purpose.CLIENT_AUTH)
    elif options.tls_root_ca_file:
        # Go's ClientAuth defaults to VerifyClientCertIfGiven when a root CA is set.
        context.verify_mode = ssl.CERT_OPTIONAL
        context.load_verify_locations(options.tls_root_ca_file)
    return context


def cluster_contexts(options: Options) -> tuple[ssl.SSLContext | None, ssl.SSLContext | None]:
    """The replication links' mutual TLS (`--cluster-tls-*`): a server context that demands a
    certificate the cluster's CA signed, and a client context that presents this node's and
    trusts only that CA. Any certificate the CA signed is a member: the CA is the cluster's
    own, so names are not checked (peers are known by IP and port). (None, None) without
    them."""
    if not options.cluster_tls_cert:
        return None, None
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.minimum_version = ssl.TLSVersion.TLSv1_2
    server.load_cert_chain(options.cluster_tls_cert, options.cluster_tls_key)
    server.verify_mode = ssl.CERT_REQUIRED
    server.load_verify_locations(options.cluster_tls_root_ca_file)
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client.minimum_version = ssl.TLSVersion.TLSv1_2
    client.check_hostname = False
    client.verify_mode = ssl.CERT_REQUIRED
    client.load_verify_locations(options.cluster_tls_root_ca_file)
    client.load_cert_chain(options.cluster_tls_cert, options.cluster_tls_key)
    return server, client


_VERSION_NAMES = {
    "TLSv1": "TLS1.0",
    "TLSv1.1": "TLS1.1",
    "TLSv1.2": "TLS1.2",
    "TLSv1.3": "TLS1.3",
}


def connection_details(ssl_object: ssl.SSLObject | trio.SSLStream) -> dict:
    """The TLS fields of Go's client stats for a finished handshake (a trio.SSLStream
    answers the same questions as the SSLObject it wraps)."""
    cipher = ssl_object.cipher()
    return {
        "tls_version": _VERSION_NAMES.get(ssl_object.version() or "", ssl_object.version() or ""),
        "tls_cipher_suite": cipher[0] if cipher else "",
        "tls_negotiated_protocol": ssl_object.selected_alpn_protocol() or "",
        "tls_negotiated_protocol_is_mutual": True,
    }
