"""The `nsqadmin` console script: Go nsqadmin's command line, then the web UI until
SIGTERM/SIGINT."""

import asyncio
import signal
import sys

from nsqpy.common.flags import ConfigError, merge, read_config
from nsqpy.common.version import version_line
from nsqpy.daemon.log import setup_logger
from nsqpy.nsqadmin.options import OptionsError, build_flags, options_from_values
from nsqpy.nsqadmin.server import NSQAdmin


def main(argv: list[str] | None = None) -> None:
    flags = build_flags()
    values, explicitly_set, _args = flags.parse_or_exit(sys.argv[1:] if argv is None else argv)
    if values["version"]:
        print(version_line("nsqadmin"))
        return
    log = setup_logger("nsqadmin", values["log_prefix"], values["log_level"])
    try:
        if values["config"]:
            values = merge(values, explicitly_set, read_config(values["config"], flags), flags)
        options = options_from_values(values)
    except (ConfigError, OptionsError) as error:
        log.critical("failed to instantiate nsqadmin - %s", error)
        sys.exit(1)
    log = setup_logger("nsqadmin", options.log_prefix, options.log_level)
    admin = NSQAdmin(options, log)
    try:
        asyncio.run(_run(admin))
    except OSError as error:  # a listener that cannot bind, a TLS file that cannot be read
        log.critical("%s", error)
        sys.exit(1)


async def _run(admin: NSQAdmin) -> None:
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, admin.shutdown)
    await admin.serve()


if __name__ == "__main__":
    main()
