"""The version every daemon reports.

Clients and Go nsqadmin compare versions as semver, so the NSQ protocol level we implement is
the version and our own release rides along as semver build metadata (docs/design.md
§9); build metadata does not change semver precedence.
"""

import platform

from nsqpy import __version__ as PACKAGE_VERSION

NSQ_PROTOCOL_VERSION = "1.3.0"

VERSION = f"{NSQ_PROTOCOL_VERSION}+nsqpy.{PACKAGE_VERSION}"


def version_line(program: str) -> str:
    r"""The `--version` line, in exactly the shape of Go's `nsqd v1.3.0 (built w/go1.19.8)`.

    Test harnesses parse it with patterns written for Go's line; gnsq's is
    `(?P<name>[a-z]+) v(?P<version>[0-9]+\.[0-9]+\.[0-9]+)(?:-[a-z]+)?`
    `\(built w\/(?P<go_version>[a-z0-9.-]+)\)` (joined by a space). Semver build metadata
    after the version, or a space or a capital inside the parentheses, would break it, so our
    identity goes where Go names its toolchain, in those characters only:
    `nsqd v1.3.0 (built w/nsqpy-0.1.0-python3.11.7)`.
    """
    built_with = f"nsqpy-{PACKAGE_VERSION}-python{platform.python_version()}".lower()
    return f"{program} v{NSQ_PROTOCOL_VERSION} (built w/{built_with})"
