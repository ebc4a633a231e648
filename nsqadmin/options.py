"""nsqadmin's options: Go nsqadmin v1.3.0's flags, defaults and config keys.

The dataclass holds every default once; the flag table reads them from it, so `--help`,
`--config` and the server agree (`nsqadmin --help` prints the same flags as Go's, word for
word). Durations are float seconds. `options_from_values` makes the checks Go's
`nsqadmin.New` makes before it listens.
"""

import dataclasses
import ipaddress
import posixpath
from dataclasses import dataclass, field

from nsqpy.common.flags import Flag, FlagSet, Kind
from nsqpy.daemon.log import LOG_LEVELS
from nsqpy.daemon.main import standard_flags


@dataclass(frozen=True)
class Options:
    log_level: str = "info"
    log_prefix: str = "[nsqadmin] "
    verbose: bool = False  # deprecated, no effect

    http_address: str = "0.0.0.0:4171"
    base_path: str = "/"
    dev_static_dir: str = ""

    # Graphite and statsd naming: accepted for command-line compatibility; nsqpy draws its
    # charts from nsqd's /stats instead, so none of these is used.
    graphite_url: str = ""
    proxy_graphite: bool = False
    statsd_prefix: str = "nsq.%s"
    statsd_counter_format: str = "stats.counters.%s.count"
    statsd_gauge_format: str = "stats.gauges.%s"
    statsd_interval: float = 60.0

    lookupd_http_address: list[str] = field(default_factory=list)
    nsqd_http_address: list[str] = field(default_factory=list)

    http_client_connect_timeout: float = 2.0
    http_client_request_timeout: float = 5.0
    http_client_tls_insecure_skip_verify: bool = False
    http_client_tls_root_ca_file: str = ""
    http_client_tls_cert: str = ""
    http_client_tls_key: str = ""

    allow_config_from_cidr: str = "127.0.0.1/8"
    notification_http_endpoint: str = ""

    acl_http_header: str = "X-Forwarded-User"
    admin_user: list[str] = field(default_factory=list)

    def replace(self, **changes) -> "Options":
        return dataclasses.replace(self, **changes)

    def is_admin(self, user: str | None) -> bool:
        """Go's isAuthorizedAdminRequest: with no --admin-user everyone may act; otherwise
        only the users named, as the --acl-http-header (set by a proxy) says."""
        if not self.admin_user:
            return True
        return user is not None and user in self.admin_user


def build_flags(defaults: Options | None = None) -> FlagSet:
    d = defaults or Options()
    return FlagSet(
        "nsqadmin",
        [
            *standard_flags(d.log_level, d.log_prefix),
            Flag(
                "http-address",
                Kind.STRING,
                d.http_address,
                "<addr>:<port> to listen on for HTTP clients",
            ),
            Flag("base-path", Kind.STRING, d.base_path, "URL base path"),
            Flag("dev-static-dir", Kind.STRING, "", "(development use only)"),
            Flag("graphite-url", Kind.STRING, "", "graphite HTTP address"),
            Flag("proxy-graphite", Kind.BOOL, False, "proxy HTTP requests to graphite"),
            Flag(
                "statsd-counter-format",
                Kind.STRING,
                d.statsd_counter_format,
                "The counter stats key formatting applied by the implementation of statsd. If no formatting is desired, set this to an empty string.",
            ),
            Flag(
                "statsd-gauge-format",
                Kind.STRING,
                d.statsd_gauge_format,
                "The gauge stats key formatting applied by the implementation of statsd. If no formatting is desired, set this to an empty string.",
            ),
            Flag(
                "statsd-prefix",
                Kind.STRING,
                d.statsd_prefix,
                "prefix used for keys sent to statsd (%s for host replacement, must match nsqd)",
            ),
            Flag(
                "statsd-interval",
                Kind.DURATION,
                d.statsd_interval,
                "time interval nsqd is configured to push to statsd (must match nsqd)",
            ),
            Flag(
                "lookupd-http-address",
                Kind.STRING_LIST,
                (),
                "lookupd HTTP address (may be given multiple times)",
                config_key="nsqlookupd_http_addresses",
            ),
            Flag(
                "nsqd-http-address",
                Kind.STRING_LIST,
                (),
                "nsqd HTTP address (may be given multiple times)",
                config_key="nsqd_http_addresses",
            ),
            Flag(
                "http-client-connect-timeout",
                Kind.DURATION,
                d.http_client_connect_timeout,
                "timeout for HTTP connect",
            ),
            Flag(
                "http-client-request-timeout",
                Kind.DURATION,
                d.http_client_request_timeout,
                "timeout for HTTP request",
            ),
            Flag(
                "http-client-tls-insecure-skip-verify",
                Kind.BOOL,
                False,
                "configure the HTTP client to skip verification of TLS certificates",
            ),
            Flag(
                "http-client-tls-root-ca-file",
                Kind.STRING,
                "",
                "path to CA file for the HTTP client",
            ),
            Flag(
                "http-client-tls-cert",
                Kind.STRING,
                "",
                "path to certificate file for the HTTP client",
            ),
            Flag("http-client-tls-key", Kind.STRING, "", "path to key file for the HTTP client"),
            Flag(
                "allow-config-from-cidr",
                Kind.STRING,
                d.allow_config_from_cidr,
                "A CIDR from which to allow HTTP requests to the /config endpoint",
            ),
            Flag(
                "notification-http-endpoint",
                Kind.STRING,
                "",
                "HTTP endpoint (fully qualified) to which POST notifications of admin actions will be sent",
            ),
            Flag(
                "acl-http-header",
                Kind.STRING,
                d.acl_http_header,
                "HTTP header to check for authenticated admin users",
            ),
            Flag(
                "admin-user",
                Kind.STRING_LIST,
                (),
                "admin user (may be given multiple times; if specified, only these users will be able to perform privileged actions; acl-http-header is used to determine the authenticated user)",
                config_key="admin_users",
            ),
        ],
    )


class OptionsError(ValueError):
    """Options nsqadmin refuses at start (Go: `failed to instantiate nsqadmin - ...`)."""


def normalize_base_path(path: str) -> str:
    """Go's normalizeBasePath: "/" when empty, a leading slash, then path.Clean."""
    if not path:
        return "/"
    if not path.startswith("/"):
        path = "/" + path
    cleaned = posixpath.normpath(path)
    # posixpath keeps a leading "//" (POSIX allows it to mean something); Go's Clean does not.
    return "/" + cleaned.lstrip("/")


def _check_address(flag: str, address: str) -> None:
    """Go resolves each address with net.ResolveTCPAddr; we check the host:port shape."""
    text = address.split("://", 1)[1] if "://" in address else address
    _host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise OptionsError(
            f"failed to resolve --{flag} ({address}) - address {text}: missing port in address"
        )


def options_from_values(values: dict) -> Options:
    """Options from parsed flag values (after the config merge), validated as Go's New."""
    known = {f.name for f in dataclasses.fields(Options)}
    options = Options(**{key: value for key, value in values.items() if key in known})
    if options.log_level not in LOG_LEVELS:
        raise OptionsError(f"invalid log level {options.log_level!r}")
    if not options.nsqd_http_address and not options.lookupd_http_address:
        raise OptionsError("--nsqd-http-address or --lookupd-http-address required")
    if options.nsqd_http_address and options.lookupd_http_address:
        raise OptionsError("use --nsqd-http-address or --lookupd-http-address not both")
    if options.http_client_tls_cert and not options.http_client_tls_key:
        raise OptionsError("--http-client-tls-key must be specified with --http-client-tls-cert")
    if options.http_client_tls_key and not options.http_client_tls_cert:
        raise OptionsError("--http-client-tls-cert must be specified with --http-client-tls-key")
    for address in options.lookupd_http_address:
        _check_address("lookupd-http-address", address)
    for address in options.nsqd_http_address:
        _check_address("nsqd-http-address", address)
    if options.allow_config_from_cidr:
        try:
            ipaddress.ip_network(options.allow_config_from_cidr, strict=False)
        except ValueError as error:
            raise OptionsError(
                f"failed to parse --allow-config-from-cidr ({options.allow_config_from_cidr})"
                f" - {error}"
            ) from None
    return options.replace(
        base_path=normalize_base_path(options.base_path),
        lookupd_http_address=list(options.lookupd_http_address),
        nsqd_http_address=list(options.nsqd_http_address),
        admin_user=list(options.admin_user),
    )
