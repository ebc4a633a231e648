"""The `nsqlookupd` console script: Go nsqlookupd's command line, then the daemon."""

import signal
import sys

import trio

from common.flags import ConfigError, load_config, merge
from common.log import setup_logger
from common.version import version_line
from nsqlookupd.options import OptionsError, build_flags, options_from_values
from nsqlookupd.server import NSQLookupd


def main(argv: list[str] | None = None) -> None:
    flags = build_flags()
    values, explicitly_set, _args = flags.parse_or_exit(sys.argv[1:] if argv is None else argv)
    if values["version"]:
        print(version_line("nsqlookupd"))
        return
    log = setup_logger("nsqlookupd", values["log_prefix"], values["log_level"])
    try:
        if values["config"]:
            values = merge(values, explicitly_set, load_config(values["config"]), flags)
        options = options_from_values(values)
    except (ConfigError, OptionsError) as error:
        log.critical("failed to instantiate nsqlookupd - %s", error)
        sys.exit(1)
    log = setup_logger("nsqlookupd", options.log_prefix, options.log_level)
    lookupd = NSQLookupd(options, log)
    try:
        trio.run(_run, lookupd)
    except* OSError as group:
        error: BaseException = group
        while isinstance(error, BaseExceptionGroup):
            error = error.exceptions[0]
        log.critical("%s", error)
        sys.exit(1)


async def _run(lookupd: NSQLookupd) -> None:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_stop_on_signal, lookupd)
        await lookupd.serve()
        nursery.cancel_scope.cancel()


async def _stop_on_signal(lookupd: NSQLookupd) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for _signal in signals:
            lookupd.shutdown()
            return


if __name__ == "__main__":
    main()
