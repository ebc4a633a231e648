"""Fixtures of the security tests: one set of trustme certificates for the whole session."""

import pytest

from tests.security.support import Certificates, make_certificates


@pytest.fixture(scope="session")
def certs(tmp_path_factory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("certs"))
