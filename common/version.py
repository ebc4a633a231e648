"""The version every daemon reports.

Clients and Go nsqadmin compare versions as semver, so the NSQ protocol level we implement is
the version and our own release rides along as semver build metadata (DESIGN.md, "Version
string"); build metadata does not change semver precedence.
"""

import platform
from importlib.metadata import PackageNotFoundError, version

NSQ_PROTOCOL_VERSION = "1.3.0"

try:
    PACKAGE_VERSION = version("nsqpy")
except PackageNotFoundError:  # running from a source tree that was never installed
    PACKAGE_VERSION = "0.0.0"

VERSION = f"{NSQ_PROTOCOL_VERSION}+nsqpy.{PACKAGE_VERSION}"


def version_line(daemon: str) -> str:
    """The `--version` line in the shape tools parse.

    `nsqd v1.3.0+nsqpy.0.1.0 (built w/python3.11.7)`, like Go's `nsqd v1.3.0 (built w/go1.19.8)`.
    """
    return f"{daemon} v{VERSION} (built w/python{platform.python_version()})"
