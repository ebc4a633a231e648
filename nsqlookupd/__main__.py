"""The `nsqlookupd` console script: Go nsqlookupd's command line, then the daemon."""

from nsqpy.daemon.main import run_daemon
from nsqpy.etcd import EtcdAuthError
from nsqpy.nsqlookupd.options import OptionsError, build_flags, options_from_values
from nsqpy.nsqlookupd.server import NSQLookupd


def main(argv: list[str] | None = None) -> None:
    run_daemon(
        "nsqlookupd",
        build_flags(),
        options_from_values,
        NSQLookupd,
        argv=argv,
        startup_errors=(EtcdAuthError,),
        option_errors=(OptionsError,),
    )


if __name__ == "__main__":
    main()
