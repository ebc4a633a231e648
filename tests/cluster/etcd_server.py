"""A real etcd server for a test: Debian's etcd-server 3.4 (`make etcd`) as a subprocess on
127.0.0.1, with a data directory of its own, and the failures a cluster test needs to cause
(`stop`, `kill`, `restart`, `pause`).

Ports: etcd 3.4 does accept port 0 in `--listen-client-urls` and logs the port it bound
("serving client traffic insecurely ... address 127.0.0.1:NNNNN"), but its gRPC-JSON
gateway then dials the configured address, 127.0.0.1:0, so every `/v3/` request fails with
"connection refused" (code 14) while /health still says true. So `EtcdServer` binds port 0
instead picks free ports below the kernel's ephemeral range (tests/support/ports.py), where no
connection's local port can take them, and passes the numbers to etcd; a `restart` reuses the
same ports, as a restarted member must. Another test could still bind such a port in between:
a first start that fails with "address already in use" is tried again on new ports.

The methods block (at most a few seconds, while etcd starts or stops). A trio test whose
other tasks must keep running meanwhile (a watch across a restart) calls them through
`trio.to_thread.run_sync`.
"""

import atexit
import base64
import http.client
import json
import os
import shutil
import signal
import ssl
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import trio

from nsqpy.etcd import WatchEvent
from tests.support.ports import restartable_port

ETCD = "/usr/bin/etcd"
START_ATTEMPTS = 3
# How often readiness is polled while etcd starts.
POLL_INTERVAL = 0.02
# A restarted member leads again only after an election timeout (1-2 s at etcd's default
# 1000 ms); a member that is a cluster of its own has no peer to miss heartbeats from, so a
# short one only makes restarts fast (~0.2 s instead of ~1.5 s).
HEARTBEAT_INTERVAL_MS = 25
ELECTION_TIMEOUT_MS = 250
# The members of a 3-member cluster (`EtcdCluster`) do miss each other: a member stopped or
# killed is noticed after the election timeout, which also bounds how long the cluster goes
# without a leader. Shorter than etcd's default (100 / 1000 ms) so that tests of a leader's
# loss run in seconds, long enough that two cores under a whole test suite rarely starve a
# leader into a needless election (etcd's guide: election timeout >= 10 x the heartbeat).
CLUSTER_HEARTBEAT_INTERVAL_MS = 50
CLUSTER_ELECTION_TIMEOUT_MS = 600


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago, outside the ephemeral range so that
    no connection takes it while etcd restarts (see the module docstring)."""
    return restartable_port()


class EtcdServer:
    """One etcd member, a cluster of its own, on 127.0.0.1.

    `directory` holds its data (`data/`) and log (`etcd.log`, appended across restarts);
    a new temporary one, removed by `close`, when None. Use it as a context manager, or
    call `start` and `close`.
    """

    def __init__(
        self,
        directory: str | os.PathLike | None = None,
        *,
        name: str = "test",
        tls: "EtcdTLS | None" = None,
        cluster: "EtcdCluster | None" = None,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        # With `tls`: clients reach it over HTTPS and must present a certificate its CA
        # signed (etcd's --client-cert-auth).
        self.tls = tls
        # A member of `cluster` (its ports chosen by the cluster), or a cluster of its own.
        self.cluster = cluster
        # etcd flags of the test's own (`--auth-token-ttl=1`).
        self.extra_args = extra_args
        self._owns_directory = directory is None
        self.directory = Path(directory or tempfile.mkdtemp(prefix="etcd-test-"))
        self.name = name
        self.client_port = 0
        self.peer_port = 0
        self.process: subprocess.Popen | None = None
        self.paused = False

    def __enter__(self) -> "EtcdServer":
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def client_url(self) -> str:
        """The URL an EtcdClient connects to, e.g. "http://127.0.0.1:40123"."""
        scheme = "https" if self.tls else "http"
        return f"{scheme}://127.0.0.1:{self.client_port}"

    def enable_auth(self, user: str, password: str) -> None:
        """etcd's auth on, with `user` (given the root role) and `password`: from now on
        every request needs a token for them."""
        for path, body in (
            ("/v3/auth/role/add", {"name": "root"}),
            ("/v3/auth/user/add", {"name": user, "password": password}),
            ("/v3/auth/user/grant", {"user": user, "role": "root"}),
            ("/v3/auth/enable", {}),
        ):
            status, answer = self._post(path, body)
            assert status == 200, (path, answer)

    @property
    def data_dir(self) -> Path:
        return self.directory / "data"

    @property
    def log_path(self) -> Path:
        return self.directory / "etcd.log"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self, timeout: float = 15.0) -> "EtcdServer":
        """Start etcd (on new ports the first time, on the same ones afterwards) and return
        once it answers a read through the JSON gateway."""
        if not os.access(ETCD, os.X_OK):
            raise RuntimeError(f"{ETCD} not installed: `make etcd` installs Debian's etcd-server")
        if self.running:
            raise RuntimeError(f"etcd is already running on {self.client_url}")
        first = self.client_port == 0
        if self.cluster is not None:
            # The cluster chose the ports and waits for its members together: one member
            # answers only once a majority runs.
            self._spawn()
            return self
        for attempt in range(START_ATTEMPTS if first else 1):
            if first:
                self.client_port, self.peer_port = free_port(), free_port()
            self._spawn()
            try:
                self.wait_ready(timeout)
                return self
            except _PortTaken:
                if attempt == START_ATTEMPTS - 1 or not first:
                    raise
        raise AssertionError("unreachable")

    def wait_ready(self, timeout: float = 15.0) -> None:
        """Poll a linearizable range through the gateway (what clients use; /health answers
        before the gateway works) until it answers, the process exits, or `timeout`."""
        deadline = time.monotonic() + timeout
        while not self._answers():
            if self.process is None or self.process.poll() is not None:
                status = self.process.returncode if self.process else None
                log = self.log_tail()
                if "address already in use" in log:
                    raise _PortTaken(log)
                raise RuntimeError(f"etcd exited with status {status} while starting:\n{log}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"etcd did not answer within {timeout:g} s:\n{self.log_tail()}")
            time.sleep(POLL_INTERVAL)

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM (etcd's graceful shutdown); waits for the exit and returns its status."""
        return self._signal_and_wait(signal.SIGTERM, timeout)

    def kill(self) -> int | None:
        """SIGKILL: a crash; waits for the exit and returns its status."""
        return self._signal_and_wait(signal.SIGKILL, 15.0)

    def restart(self, timeout: float = 15.0) -> "EtcdServer":
        """Stop (if running), then start again on the same data directory and ports."""
        self.stop()
        self.start(timeout)
        if self.cluster is not None:
            self.cluster.wait_ready(timeout)
        return self

    def pause(self) -> None:
        """SIGSTOP: etcd keeps its sockets but answers nothing, as a hung or partitioned
        member; leases keep their expiry time and may expire once it resumes. Returns once
        the process is stopped (signals are delivered asynchronously)."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)
        self.paused = True
        self._wait_for_state(stopped=True)

    def resume(self) -> None:
        """SIGCONT after `pause`; returns once the process runs again."""
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)
        self.paused = False
        self._wait_for_state(stopped=False)

    def _wait_for_state(self, stopped: bool, timeout: float = 5.0) -> None:
        # /proc/PID/stat's third field: "T" while stopped by a signal.
        stat = Path(f"/proc/{self.process.pid}/stat")
        deadline = time.monotonic() + timeout
        while (stat.read_text().rsplit(")", 1)[1].split()[0] == "T") != stopped:
            if time.monotonic() > deadline:
                raise TimeoutError(f"etcd did not {'stop' if stopped else 'resume'} in time")
            time.sleep(0.001)

    def close(self) -> None:
        """Kill etcd and remove its directory if this server created it."""
        self.kill()
        if self._owns_directory:
            shutil.rmtree(self.directory, ignore_errors=True)

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def _spawn(self) -> None:
        client = self.client_url
        peer = f"http://127.0.0.1:{self.peer_port}"
        initial_cluster = f"{self.name}={peer}"
        timing = [
            f"--heartbeat-interval={HEARTBEAT_INTERVAL_MS}",
            f"--election-timeout={ELECTION_TIMEOUT_MS}",
        ]
        if self.cluster is not None:
            initial_cluster = self.cluster.initial_cluster
            timing = [
                f"--heartbeat-interval={CLUSTER_HEARTBEAT_INTERVAL_MS}",
                f"--election-timeout={CLUSTER_ELECTION_TIMEOUT_MS}",
                f"--initial-cluster-token={self.cluster.token}",
            ]
        tls = []
        if self.tls is not None:
            tls = [
                f"--cert-file={self.tls.cert}",
                f"--key-file={self.tls.key}",
                f"--trusted-ca-file={self.tls.ca}",
                "--client-cert-auth",
            ]
        self.directory.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [
                    ETCD,
                    f"--name={self.name}",
                    f"--data-dir={self.data_dir}",
                    f"--listen-client-urls={client}",
                    f"--advertise-client-urls={client}",
                    f"--listen-peer-urls={peer}",
                    f"--initial-advertise-peer-urls={peer}",
                    f"--initial-cluster={initial_cluster}",
                    *timing,
                    *self.extra_args,
                    "--logger=zap",
                    "--log-outputs=stderr",
                    "--log-level=warn",
                    *tls,
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
        self.paused = False
        # A test run that ends without closing the server (interrupted) must not leave etcd
        # running on a shared machine.
        atexit.register(self._kill_at_exit)

    def _signal_and_wait(self, sig: int, timeout: float) -> int | None:
        process = self.process
        if process is None:
            return None
        if process.poll() is None:
            process.send_signal(sig)
            if self.paused:
                # A stopped process handles SIGTERM only once it runs again.
                process.send_signal(signal.SIGCONT)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
                raise TimeoutError(f"etcd did not exit within {timeout:g} s of {sig!r}") from None
        self.paused = False
        atexit.unregister(self._kill_at_exit)
        return process.returncode

    def _kill_at_exit(self) -> None:
        if self.running:
            self.process.kill()

    def put(self, key: str, value: bytes) -> None:
        """Write a key as a foreign writer would (what a test makes a daemon meet)."""
        status, answer = self._post(
            "/v3/kv/put",
            {
                "key": base64.b64encode(key.encode()).decode(),
                "value": base64.b64encode(value).decode(),
            },
        )
        assert status == 200, answer

    def leases_under(self, prefix: str) -> list[int]:
        """The leases the keys under `prefix` are on."""
        raw = prefix.encode()
        end = raw[:-1] + bytes([raw[-1] + 1])
        status, answer = self._post(
            "/v3/kv/range",
            {"key": base64.b64encode(raw).decode(), "range_end": base64.b64encode(end).decode()},
        )
        assert status == 200, answer
        return [int(kv["lease"]) for kv in answer.get("kvs", []) if kv.get("lease")]

    def revoke(self, lease: int) -> None:
        """Revoke a lease, as etcd itself does when it expires (or, on 3.4.23, when a paused
        leader runs again: etcd-io/etcd#15247)."""
        status, answer = self._post("/v3/lease/revoke", {"ID": str(lease)})
        assert status == 200, answer

    def member_status(self) -> dict | None:
        """etcd's own status of this member (`/v3/maintenance/status`): its ID (`header`'s
        `member_id`) and the leader's (`leader`); None when it does not answer."""
        try:
            status, answer = self._post("/v3/maintenance/status", {})
        except OSError:
            return None
        return answer if status == 200 else None

    def _answers(self) -> bool:
        try:
            status, answer = self._post("/v3/kv/range", {"key": base64.b64encode(b"\0").decode()})
        except OSError:
            return False
        # With auth on, a read without a token is refused: etcd answers, so it is up.
        return status == 200 or "user name is empty" in str(answer)

    def _post(self, path: str, body: dict) -> tuple[int, dict]:
        if self.tls is None:
            connection = http.client.HTTPConnection("127.0.0.1", self.client_port, timeout=1.0)
        else:
            connection = http.client.HTTPSConnection(
                "127.0.0.1", self.client_port, timeout=1.0, context=self.tls.client_context()
            )
        try:
            connection.request("POST", path, json.dumps(body))
            response = connection.getresponse()
            data = response.read()
            try:
                return response.status, json.loads(data)
            except ValueError:
                return response.status, {"raw": data.decode("latin-1")}
        finally:
            connection.close()


@dataclass(frozen=True)
class EtcdTLS:
    """etcd's certificate and key, the CA that signed them and the clients' certificates,
    and a client certificate and key that CA signed."""

    cert: str
    key: str
    ca: str
    client_cert: str
    client_key: str

    def daemon_flags(self, password: str, user: str = "root") -> tuple[str, ...]:
        """A daemon's flags for this etcd: its client certificate, the CA, and etcd's user."""
        return (
            f"-cluster-leadership-tls-cert={self.client_cert}",
            f"-cluster-leadership-tls-key={self.client_key}",
            f"-cluster-leadership-tls-root-ca-file={self.ca}",
            f"-cluster-leadership-username={user}",
            f"-cluster-leadership-password={password}",
        )

    def client_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=self.ca)
        context.load_cert_chain(self.client_cert, self.client_key)
        return context

    @classmethod
    def make(cls, directory: Path) -> "EtcdTLS":
        """A CA of its own (trustme) and the certificates: etcd's for 127.0.0.1."""
        import trustme

        directory.mkdir(parents=True, exist_ok=True)
        authority = trustme.CA()
        server = authority.issue_cert("127.0.0.1", "localhost")
        client = authority.issue_cert("nsqpy-cluster-client")
        files = {
            "ca": directory / "etcd-ca.pem",
            "cert": directory / "etcd.pem",
            "key": directory / "etcd-key.pem",
            "client_cert": directory / "etcd-client.pem",
            "client_key": directory / "etcd-client-key.pem",
        }
        authority.cert_pem.write_to_path(files["ca"])
        server.cert_chain_pems[0].write_to_path(files["cert"])
        server.private_key_pem.write_to_path(files["key"])
        client.cert_chain_pems[0].write_to_path(files["client_cert"])
        client.private_key_pem.write_to_path(files["client_key"])
        return cls(**{name: str(path) for name, path in files.items()})


def summary(events: list[WatchEvent]) -> list[tuple[str, str, bytes]]:
    """A watch's events as (kind, key, value), for comparing."""
    return [(event.kind, event.kv.key, event.kv.value) for event in events]


async def take(watch, count: int) -> list[WatchEvent]:
    """The next `count` events of `watch` (within 5 s)."""
    with trio.fail_after(5):
        return [await anext(watch) for _ in range(count)]


class EtcdCluster:
    """Three (or `size`) etcd members on 127.0.0.1, one cluster: the control plane's etcd as
    production runs it, and what a test can do to its members one at a time (`members[i]`:
    pause, kill, restart, as for `EtcdServer`) or all at once.

    Every member's ports are chosen before the first starts (each member names the others'
    peer URLs), outside the ephemeral range; a first start that loses a port to another
    process is tried again on new ones. `client_urls` is every member's, comma-separated, as
    the daemons' `--cluster-leadership-addresses` take them.
    """

    def __init__(self, directory: str | os.PathLike | None = None, *, size: int = 3) -> None:
        self._owns_directory = directory is None
        self.directory = Path(directory or tempfile.mkdtemp(prefix="etcd-cluster-"))
        self.token = f"nsqpy-test-{os.getpid()}-{id(self)}"
        self.members = [
            EtcdServer(self.directory / f"member{index}", name=f"member{index}", cluster=self)
            for index in range(size)
        ]

    def __enter__(self) -> "EtcdCluster":
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def initial_cluster(self) -> str:
        return ",".join(
            f"{member.name}=http://127.0.0.1:{member.peer_port}" for member in self.members
        )

    @property
    def client_urls(self) -> str:
        return ",".join(member.client_url for member in self.members)

    # What a daemon's --cluster-leadership-addresses takes, as for one EtcdServer.
    client_url = client_urls

    def start(self, timeout: float = 20.0) -> "EtcdCluster":
        for attempt in range(START_ATTEMPTS):
            for member in self.members:
                member.client_port, member.peer_port = free_port(), free_port()
            for member in self.members:
                member.start()
            try:
                self.wait_ready(timeout)
                return self
            except _PortTaken:
                for member in self.members:
                    member.kill()
                    shutil.rmtree(member.directory, ignore_errors=True)
                if attempt == START_ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")

    def wait_ready(self, timeout: float = 20.0) -> None:
        """Until every running member answers a linearizable read (so the cluster has a
        leader, and each running member knows it)."""
        deadline = time.monotonic() + timeout
        for member in self.members:
            if member.process is None or member.paused:
                continue
            member.wait_ready(max(deadline - time.monotonic(), 0.1))

    def leader(self, timeout: float = 20.0) -> EtcdServer:
        """The member the running members agree leads, once they do."""
        deadline = time.monotonic() + timeout
        while True:
            seen = {}
            for member in self.members:
                if member.running and not member.paused:
                    status = member.member_status()
                    if status is not None:
                        seen[member.name] = (
                            int(status["header"]["member_id"]),
                            int(status["leader"]),
                        )
            leaders = {leader for _own, leader in seen.values()}
            if len(leaders) == 1 and seen:
                (leader,) = leaders
                for member in self.members:
                    if member.name in seen and seen[member.name][0] == leader:
                        return member
            if time.monotonic() > deadline:
                raise TimeoutError(f"the etcd members do not agree on a leader: {seen}")
            time.sleep(POLL_INTERVAL)

    def pause_all(self) -> None:
        for member in self.members:
            member.pause()

    def resume_all(self) -> None:
        for member in self.members:
            member.resume()

    def kill_all(self) -> None:
        for member in self.members:
            member.kill()

    def start_all(self, timeout: float = 20.0) -> None:
        """Start every member that is not running (after `kill_all`), then wait for them."""
        for member in self.members:
            if not member.running:
                member.start()
        self.wait_ready(timeout)

    def close(self) -> None:
        for member in self.members:
            member.kill()
        if self._owns_directory:
            shutil.rmtree(self.directory, ignore_errors=True)

    def log_tails(self, lines: int = 15) -> str:
        return "\n".join(f"{member.name}:\n{member.log_tail(lines)}" for member in self.members)


class _PortTaken(RuntimeError):
    """etcd could not bind a port chosen by free_port: another process took it meanwhile."""
