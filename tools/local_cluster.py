"""`make run`: nsqlookupd, nsqd and nsqadmin on localhost, their URLs printed, Ctrl-C stops all.
`make run-cluster` (`--replicated`): etcd, nsqlookupd, three nsqds in cluster mode and nsqadmin.

Each daemon is its own process started from this virtualenv's console scripts. If one of them
exits, the others are stopped and its exit status becomes ours, so a broken daemon is never
hidden behind a cluster that looks up. Ctrl-C (or SIGTERM) stops each daemon once, cleanly: nsqd
writes the messages it holds before it exits.
"""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

BIN = Path(sys.executable).parent

DAEMONS = [
    (
        "nsqlookupd",
        ["-tcp-address=127.0.0.1:4160", "-http-address=127.0.0.1:4161"],
        "http://127.0.0.1:4161",
    ),
    (
        "nsqd",
        [
            "-tcp-address=127.0.0.1:4150",
            "-http-address=127.0.0.1:4151",
            "-lookupd-tcp-address=127.0.0.1:4160",
            "-broadcast-address=127.0.0.1",
        ],
        "tcp://127.0.0.1:4150  http://127.0.0.1:4151",
    ),
    (
        "nsqadmin",
        ["-http-address=127.0.0.1:4171", "-lookupd-http-address=127.0.0.1:4161"],
        "http://127.0.0.1:4171",
    ),
]


def run(daemons: list[tuple[str, list[str], str]], data_path: Path) -> int:
    """Start `daemons` (console script, arguments, URL to print), wait until one of them exits
    or a SIGINT/SIGTERM arrives, then stop the rest once and wait for every one of them.

    The children run in sessions of their own, so a terminal's Ctrl-C reaches this runner
    alone and each daemon gets exactly one SIGTERM from it: a second signal would find nsqd
    still writing its memory queues, and the runner does not hurry it.
    """
    stop_requested = threading.Event()

    def request_stop(_signum: int, _frame: object) -> None:
        stop_requested.set()

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, request_stop)

    processes: list[tuple[str, subprocess.Popen]] = []
    try:
        for name, args, url in daemons:
            given = any(arg.startswith("-data-path=") for arg in args)
            extra = [f"-data-path={data_path}"] if name == "nsqd" and not given else []
            program = name if os.path.isabs(name) else str(BIN / name)
            command = [program, *args, *extra]
            processes.append((name, subprocess.Popen(command, start_new_session=True)))
            print(f"{os.path.basename(name):<11} {url}", flush=True)
        print(f"nsqd data in {data_path}; Ctrl-C stops everything", flush=True)
        while not stop_requested.wait(0.2):
            if any(process.poll() is not None for _name, process in processes):
                break
    finally:
        for _name, process in processes:
            if process.poll() is None:
                process.terminate()
        for _name, process in processes:
            process.wait()
    status = 0
    for name, process in processes:
        # etcd ends on the SIGTERM it was sent without a status of its own.
        stopped = os.path.isabs(name) and process.returncode == -signal.SIGTERM
        if process.returncode != 0 and not stopped:
            print(f"{name} exited with status {process.returncode}", file=sys.stderr)
            status = status or process.returncode
    return status


def replicated_daemons(data_path: Path, etcd: str) -> list[tuple[str, list[str], str]]:
    """`make run-cluster`: etcd, nsqlookupd as the cluster's master, three nsqds that replicate
    partitions between them (docs/operations.md, "A replicated cluster"), and nsqadmin."""
    cluster = ["-cluster-leadership-addresses=http://127.0.0.1:2379", "-cluster-id=local"]
    daemons = [
        (
            etcd,
            [
                "--name=nsqpy-local",
                f"--data-dir={data_path / 'etcd'}",
                "--listen-client-urls=http://127.0.0.1:2379",
                "--advertise-client-urls=http://127.0.0.1:2379",
                "--listen-peer-urls=http://127.0.0.1:2380",
                "--initial-advertise-peer-urls=http://127.0.0.1:2380",
                "--initial-cluster=nsqpy-local=http://127.0.0.1:2380",
                "--log-level=warn",
            ],
            "http://127.0.0.1:2379 (etcd)",
        ),
        (
            "nsqlookupd",
            [
                "-tcp-address=127.0.0.1:4160",
                "-http-address=127.0.0.1:4161",
                "-broadcast-address=127.0.0.1",
                *cluster,
            ],
            "http://127.0.0.1:4161",
        ),
    ]
    for index in range(3):
        tcp, http, rpc = 4150 + 2 * index, 4151 + 2 * index, 4250 + index
        daemons.append(
            (
                "nsqd",
                [
                    f"-tcp-address=127.0.0.1:{tcp}",
                    f"-http-address=127.0.0.1:{http}",
                    f"-rpc-port=127.0.0.1:{rpc}",
                    "-lookupd-tcp-address=127.0.0.1:4160",
                    "-broadcast-address=127.0.0.1",
                    f"-node-id={index + 1}",
                    f"-data-path={data_path / f'nsqd{index + 1}'}",
                    *cluster,
                ],
                f"tcp://127.0.0.1:{tcp}  http://127.0.0.1:{http}",
            )
        )
    daemons.append(
        (
            "nsqadmin",
            ["-http-address=127.0.0.1:4171", "-lookupd-http-address=127.0.0.1:4161"],
            "http://127.0.0.1:4171",
        )
    )
    return daemons


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    data_path = Path(os.environ.get("NSQPY_DATA", tempfile.mkdtemp(prefix="nsqpy-")))
    if argv == ["--replicated"]:
        etcd = shutil.which("etcd")
        if etcd is None:
            print(
                "error: etcd not found: `make run-cluster` installs Debian's etcd-server",
                file=sys.stderr,
            )
            return 1
        for index in range(3):
            (data_path / f"nsqd{index + 1}").mkdir(parents=True, exist_ok=True)
        return run(replicated_daemons(data_path, etcd), data_path)
    if argv:
        print("usage: python -m tools.local_cluster [--replicated]", file=sys.stderr)
        return 2
    return run(DAEMONS, data_path)


if __name__ == "__main__":
    sys.exit(main())
