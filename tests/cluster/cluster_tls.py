"""The cluster's mutual TLS for tests: a CA of the test's own and the identities it issues."""

import trustme


def write_identity(authority: trustme.CA, directory, name: str) -> tuple[str, str]:
    """A certificate `authority` issues to `name` (for 127.0.0.1) and its key, as files."""
    identity = authority.issue_cert(name, "127.0.0.1")
    cert, key = directory / f"{name}.pem", directory / f"{name}-key.pem"
    identity.cert_chain_pems[0].write_to_path(cert)
    identity.private_key_pem.write_to_path(key)
    return str(cert), str(key)


def cluster_tls_flags(cluster_ca: dict) -> tuple[str, ...]:
    """The nsqd flags of a node presenting the `cluster_ca` fixture's identity."""
    return (
        f"-cluster-tls-cert={cluster_ca['cert']}",
        f"-cluster-tls-key={cluster_ca['key']}",
        f"-cluster-tls-root-ca-file={cluster_ca['ca']}",
    )
