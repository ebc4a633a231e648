"""The `nsqd` console script: Go nsqd's command line, then the daemon until SIGTERM/SIGINT."""

import gc
import signal
import sys

import trio

from common.flags import ConfigError, load_config, merge
from common.log import setup_logger
from common.version import version_line
from nsqd.metadata import MetadataError
from nsqd.options import OptionsError, build_flags, options_from_values
from nsqd.server import NSQD


def main(argv: list[str] | None = None) -> None:
    flags = build_flags()
    values, explicitly_set, _args = flags.parse_or_exit(sys.argv[1:] if argv is None else argv)
    if values["version"]:
        print(version_line("nsqd"))
        return
    log = setup_logger("nsqd", values["log_prefix"], values["log_level"])
    try:
        if values["config"]:
            values = merge(values, explicitly_set, load_config(values["config"]), flags)
        options = options_from_values(values)
    except (ConfigError, OptionsError) as error:
        log.critical("failed to instantiate nsqd - %s", error)
        sys.exit(1)
    log = setup_logger("nsqd", options.log_prefix, options.log_level)
    # Queued messages are long-lived objects; the default gen-0 threshold of 700 makes the
    # collector rescan them constantly (about half of publish CPU, bench/RESULTS.md).
    gc.set_threshold(100_000, 50, 100)
    try:
        nsqd = NSQD(options, log)
    except OSError as error:  # a TLS certificate or key that cannot be loaded
        log.critical("failed to instantiate nsqd - %s", error)
        sys.exit(1)
    try:
        trio.run(_run, nsqd)
    except* MetadataError as group:
        log.critical("failed to load metadata - %s", _first_leaf(group))
        sys.exit(1)
    except* OSError as group:
        # A listener that cannot bind, a data path that cannot be created: one line, exit 1.
        log.critical("%s", _first_leaf(group))
        sys.exit(1)


def _first_leaf(group: BaseExceptionGroup) -> BaseException:
    error: BaseException = group
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    return error


async def _run(nsqd: NSQD) -> None:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_stop_on_signal, nsqd)
        await nsqd.serve()
        nursery.cancel_scope.cancel()


async def _stop_on_signal(nsqd: NSQD) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for _signal in signals:
            nsqd.shutdown()
            return


if __name__ == "__main__":
    main()
