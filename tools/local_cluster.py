"""`make run`: nsqlookupd, nsqd and nsqadmin on localhost, their URLs printed, Ctrl-C stops all.
`make run-cluster` (`--replicated`): a 3-member etcd, two nsqlookupds (a master and a standby),
three nsqds in cluster mode and nsqadmin.

Each daemon is its own process started from this virtualenv's console scripts. If one of them
exits, the others are stopped and its exit status becomes ours, so a broken daemon is never
hidden behind a cluster that looks up; except a daemon of the replicated cluster (an etcd
member, an nsqlookupd, an nsqd), whose death is what the cluster is for: the runner says so
and goes on, and starts it again when asked (type `restart nsqd 2`, `restart etcd 1`,
`restart nsqlookupd 1`, or `restart 2` for nsqd 2, and Enter), or by itself `--restart-after`
seconds later. Ctrl-C (or SIGTERM) stops each daemon once, cleanly: nsqd writes the messages it
holds before it exits.

The data stays from one run to the next in `data/run/` (`data/cluster/` for the replicated
cluster) under the directory it is started from, the checkout for `make run`; `NSQPY_DATA`
names another directory.
"""

import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
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


# The replicated cluster's daemons that may die without the rest stopping.
REPLACEABLE = ("etcd", "nsqlookupd", "nsqd")
# How long the first nsqlookupd may take to become the master before the standby starts.
MASTER_WAIT = 20.0


@dataclass
class Daemon:
    name: str
    command: list[str]
    url: str
    # A daemon of the replicated cluster: it may die without the rest stopping.
    replaceable: bool = False
    number: int = 0
    process: subprocess.Popen | None = None
    # When it is to be started again (time.monotonic()), after it died.
    restart_at: float | None = None
    deaths: list[int] = field(default_factory=list)

    @property
    def kind(self) -> str:
        return os.path.basename(self.name)

    @property
    def label(self) -> str:
        return f"{self.kind} {self.number}" if self.number else self.kind

    def start(self) -> None:
        self.process = subprocess.Popen(self.command, start_new_session=True)
        self.restart_at = None


def _describe_exit(status: int) -> str:
    if status < 0:
        try:
            return f"killed by {signal.Signals(-status).name}"
        except ValueError:
            return f"killed by signal {-status}"
    return f"exited with status {status}"


def _read_commands(lines: "queue.Queue[str]", stream) -> None:
    for line in stream:
        lines.put(line.strip())


def run(
    daemons: list[tuple[str, list[str], str]],
    data_path: Path,
    *,
    replaceable_nsqds: bool = False,
    restart_after: float | None = None,
    commands=None,
) -> int:
    """Start `daemons` (console script, arguments, URL to print), wait until one of them exits
    or a SIGINT/SIGTERM arrives, then stop the rest once and wait for every one of them. With
    `replaceable_nsqds` (the replicated cluster), an etcd member, nsqlookupd or nsqd that
    exits is reported and left down until `restart <kind> <n>` (`restart <n>`: nsqd n) is
    read from `commands` (standard input by default), or `restart_after` seconds; and the
    first nsqlookupd is the master before the second one, its standby, starts.

    The children run in sessions of their own, so a terminal's Ctrl-C reaches this runner
    alone and each daemon gets exactly one SIGTERM from it: a second signal would find nsqd
    still writing its memory queues, and the runner does not hurry it.
    """
    stop_requested = threading.Event()

    def request_stop(_signum: int, _frame: object) -> None:
        stop_requested.set()

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, request_stop)

    requests: queue.Queue[str] = queue.Queue()
    if replaceable_nsqds:
        stream = sys.stdin if commands is None else commands
        threading.Thread(target=_read_commands, args=(requests, stream), daemon=True).start()
    running: list[Daemon] = []
    numbers: dict[str, int] = {}
    for name, args, url in daemons:
        given = any(arg.startswith("-data-path=") for arg in args)
        extra = [f"-data-path={data_path}"] if name == "nsqd" and not given else []
        program = name if os.path.isabs(name) else str(BIN / name)
        daemon = Daemon(name, [program, *args, *extra], url)
        if replaceable_nsqds and daemon.kind in REPLACEABLE:
            numbers[daemon.kind] = numbers.get(daemon.kind, 0) + 1
            daemon.replaceable, daemon.number = True, numbers[daemon.kind]
        running.append(daemon)
    failed: Daemon | None = None
    try:
        for daemon in running:
            if replaceable_nsqds and daemon.kind == "nsqlookupd" and daemon.number == 2:
                # The first one leads, so that its address is the master's (the docs' curl
                # commands name it); the second one is its standby.
                _wait_for_master(running[running.index(daemon) - 1].url, stop_requested)
            daemon.start()
            print(f"{daemon.label:<13} {daemon.url}", flush=True)
        print(f"nsqd data in {data_path}; Ctrl-C stops everything", flush=True)
        if replaceable_nsqds:
            again = f", or by itself after {restart_after:g} s" if restart_after else ""
            print(
                "an nsqd, an nsqlookupd or an etcd member may die (try kill -9): the cluster"
                " goes on; `restart nsqd <n>` (or `restart etcd <n>`, `restart nsqlookupd <n>`)"
                f" and Enter starts it again{again}",
                flush=True,
            )
        while failed is None and not stop_requested.wait(0.2):
            failed = _supervise(running, requests, restart_after)
    finally:
        for daemon in running:
            if daemon.process is not None and daemon.process.poll() is None:
                daemon.process.terminate()
        for daemon in running:
            if daemon.process is not None:
                daemon.process.wait()
    status = 0
    for daemon in running:
        code = daemon.process.returncode if daemon.process is not None else 0
        # etcd ends on the SIGTERM it was sent without a status of its own, and so does a
        # daemon stopped before it could take signals (it was only starting).
        stopped = daemon is not failed and code == -signal.SIGTERM
        if daemon.replaceable and daemon is not failed and daemon.restart_at is not None:
            continue  # reported when it died
        if code != 0 and not stopped:
            print(f"{daemon.label} exited with status {code}", file=sys.stderr)
            status = status or code
    return status


def _supervise(
    running: list[Daemon], requests: "queue.Queue[str]", restart_after: float | None
) -> Daemon | None:
    """One look at the daemons: a replaceable nsqd that died is reported (and its restart
    scheduled); any other daemon that exited is returned, ending the run."""
    now = time.monotonic()
    for daemon in running:
        process = daemon.process
        if process is None or process.poll() is None:
            continue
        if not daemon.replaceable:
            return daemon
        if daemon.restart_at is None:
            daemon.deaths.append(process.returncode)
            daemon.restart_at = now + restart_after if restart_after else float("inf")
            when = (
                f"in {restart_after:g} s"
                if restart_after
                else f"with `restart {daemon.kind} {daemon.number}`"
            )
            print(
                f"{daemon.label} ({daemon.url}) {_describe_exit(process.returncode)}; the"
                f" cluster goes on without it; it starts again {when}",
                flush=True,
            )
    while True:
        try:
            line = requests.get_nowait()
        except queue.Empty:
            break
        words = line.split()
        if len(words) == 2 and words[0] == "restart" and words[1].isdigit():
            words = ["restart", "nsqd", words[1]]
        if len(words) == 3 and words[0] == "restart" and words[2].isdigit():
            kind, number = words[1], int(words[2])
            targets = [
                d for d in running if d.replaceable and d.kind == kind and d.number == number
            ]
            if not targets:
                print(f"no {kind} {number}", flush=True)
            for daemon in targets:
                if daemon.restart_at is None:
                    print(f"{daemon.label} is running", flush=True)
                else:
                    daemon.restart_at = now
        elif words:
            print("commands: restart nsqd|nsqlookupd|etcd <n> (restart <n>: nsqd <n>)", flush=True)
    for daemon in running:
        if daemon.restart_at is not None and daemon.restart_at <= now:
            daemon.start()
            print(f"{daemon.label} started again ({daemon.url})", flush=True)
    return None


# The etcd members: name, client port, peer port (etcd's own local examples' ports, moved
# together by --port-offset).
ETCD_MEMBERS = (
    ("nsqpy-local-1", 2379, 2380),
    ("nsqpy-local-2", 2479, 2480),
    ("nsqpy-local-3", 2579, 2580),
)
# The nsqlookupds: TCP and HTTP ports; the first is the master at start, the second its standby.
LOOKUPDS = ((4160, 4161), (4162, 4163))


def replicated_daemons(data_path: Path, etcd: str) -> list[tuple[str, list[str], str]]:
    """`make run-cluster`: a 3-member etcd, two nsqlookupds (a master elected through etcd and
    a standby that takes over within the lease when it goes), three nsqds that replicate
    partitions between them (docs/operations.md, "A replicated cluster"), and nsqadmin; every
    nsqd and nsqadmin given both nsqlookupds, every cluster daemon all three etcd members."""
    endpoints = ",".join(f"http://127.0.0.1:{client}" for _name, client, _peer in ETCD_MEMBERS)
    cluster = [f"-cluster-leadership-addresses={endpoints}", "-cluster-id=local"]
    initial = ",".join(f"{name}=http://127.0.0.1:{peer}" for name, _client, peer in ETCD_MEMBERS)
    daemons = []
    for name, client, peer in ETCD_MEMBERS:
        daemons.append(
            (
                etcd,
                [
                    f"--name={name}",
                    f"--data-dir={data_path / name}",
                    f"--listen-client-urls=http://127.0.0.1:{client}",
                    f"--advertise-client-urls=http://127.0.0.1:{client}",
                    f"--listen-peer-urls=http://127.0.0.1:{peer}",
                    f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                    f"--initial-cluster={initial}",
                    "--initial-cluster-token=nsqpy-local",
                    "--log-level=warn",
                ],
                f"http://127.0.0.1:{client} (etcd)",
            )
        )
    for tcp, http in LOOKUPDS:
        daemons.append(
            (
                "nsqlookupd",
                [
                    f"-tcp-address=127.0.0.1:{tcp}",
                    f"-http-address=127.0.0.1:{http}",
                    "-broadcast-address=127.0.0.1",
                    *cluster,
                ],
                f"http://127.0.0.1:{http}",
            )
        )
    lookupd_tcp = [f"-lookupd-tcp-address=127.0.0.1:{tcp}" for tcp, _http in LOOKUPDS]
    for index in range(3):
        tcp, http, rpc = 4150 + 2 * index, 4151 + 2 * index, 4250 + index
        daemons.append(
            (
                "nsqd",
                [
                    f"-tcp-address=127.0.0.1:{tcp}",
                    f"-http-address=127.0.0.1:{http}",
                    f"-rpc-port=127.0.0.1:{rpc}",
                    *lookupd_tcp,
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
            [
                "-http-address=127.0.0.1:4171",
                *[f"-lookupd-http-address=127.0.0.1:{http}" for _tcp, http in LOOKUPDS],
            ],
            "http://127.0.0.1:4171",
        )
    )
    return daemons


def _wait_for_master(url: str, stop_requested: threading.Event) -> None:
    """Until the nsqlookupd at `url` says it is the master (at most MASTER_WAIT seconds: etcd
    may still be electing its own leader)."""
    deadline = time.monotonic() + MASTER_WAIT
    while time.monotonic() < deadline and not stop_requested.is_set():
        try:
            with urllib.request.urlopen(f"{url}/cluster/stats", timeout=1) as response:
                if json.loads(response.read()).get("is_master"):
                    return
        except (OSError, ValueError):
            pass
        time.sleep(0.1)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    replicated = "--replicated" in argv
    default = Path("data", "cluster" if replicated else "run")
    data_path = Path(os.environ.get("NSQPY_DATA") or default).resolve()
    data_path.mkdir(parents=True, exist_ok=True)
    restart_after = None
    offset = 0
    for arg in argv:
        if arg.startswith("--restart-after="):
            restart_after = float(arg.split("=", 1)[1])
        elif arg.startswith("--port-offset="):
            offset = int(arg.split("=", 1)[1])
        elif arg != "--replicated":
            print(
                "usage: python -m nsqpy.tools.local_cluster"
                " [--replicated [--restart-after=SECONDS]] [--port-offset=N]",
                file=sys.stderr,
            )
            return 2
    if replicated:
        etcd = shutil.which("etcd")
        if etcd is None:
            print(
                "error: etcd not found: `make run-cluster` installs Debian's etcd-server",
                file=sys.stderr,
            )
            return 1
        for index in range(3):
            (data_path / f"nsqd{index + 1}").mkdir(parents=True, exist_ok=True)
        daemons = shift_ports(replicated_daemons(data_path, etcd), offset)
        return run(daemons, data_path, replaceable_nsqds=True, restart_after=restart_after)
    return run(shift_ports(DAEMONS, offset), data_path)


def shift_ports(
    daemons: list[tuple[str, list[str], str]], offset: int
) -> list[tuple[str, list[str], str]]:
    """Every 127.0.0.1 port of the daemons' arguments and URLs moved up by `offset` (to run
    beside another cluster, or in the tests)."""
    if not offset:
        return daemons

    def shift(text: str) -> str:
        parts = text.split("127.0.0.1:")
        for index in range(1, len(parts)):
            digits = len(parts[index]) - len(parts[index].lstrip("0123456789"))
            port = int(parts[index][:digits])
            parts[index] = str(port + offset) + parts[index][digits:]
        return "127.0.0.1:".join(parts)

    return [(name, [shift(arg) for arg in args], shift(url)) for name, args, url in daemons]


if __name__ == "__main__":
    sys.exit(main())
