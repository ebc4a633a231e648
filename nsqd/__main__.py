"""The `nsqd` console script: Go nsqd's command line, then the daemon until SIGTERM/SIGINT."""

import gc
import logging

from nsqpy.daemon.main import run_daemon
from nsqpy.etcd import EtcdAuthError
from nsqpy.nsqd.data_path import DataPathError
from nsqpy.nsqd.metadata import MetadataError
from nsqpy.nsqd.options import Options, OptionsError, build_flags, options_from_values
from nsqpy.nsqd.server import NSQD


def _build(options: Options, log: logging.Logger) -> NSQD:
    # Queued messages are long-lived objects; the default gen-0 threshold of 700 makes the
    # collector rescan them constantly (about half of publish CPU, bench/RESULTS.md).
    gc.set_threshold(100_000, 50, 100)
    return NSQD(options, log)


def main(argv: list[str] | None = None) -> None:
    run_daemon(
        "nsqd",
        build_flags(),
        options_from_values,
        _build,
        argv=argv,
        startup_errors=(MetadataError, DataPathError, EtcdAuthError),
        option_errors=(OptionsError,),
    )


if __name__ == "__main__":
    main()
