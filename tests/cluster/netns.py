"""Real network faults for the cluster tests: every host in a network namespace of its own,
joined by veth pairs to a bridge in a namespace of the suite's own, and faults made with
nftables rules inside the namespaces (iproute2 and Debian's nftables, installed by `make
test`; root). Nothing is added to the host's own network: the addresses exist only inside
these namespaces, which the suite deletes afterwards.

Kernel faults: a cut (both ways, or one way), and random loss (`numgen random`). This kernel has
no `netem` qdisc (nor `fq`, nor nftables' `queue`), so latency is added in user space: each
nsqd's replication port is reached through a relay in its namespace
(`tests/cluster/delay_relay.py`) that holds every chunk for the delay its control file says.
"""

import os
import secrets
import shutil
import subprocess
from pathlib import Path

SUBNET = "10.77.0"


class NetworkUnavailable(AssertionError):
    """This machine cannot make the namespaces (not root, or no `ip`/`nft`)."""


def check_tools() -> None:
    missing = [tool for tool in ("ip", "nft") if shutil.which(tool) is None]
    if missing or os.geteuid() != 0:
        raise NetworkUnavailable(
            f"the network fault tests need root and iproute2 and nftables (missing: "
            f"{', '.join(missing) or 'root'}); `make test` installs iproute2 and nftables and"
            " runs as root"
        )


def _run(*args: str) -> str:
    done = subprocess.run(args, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


class Network:
    """Namespaces `<prefix>-<host>` on a bridge in `<prefix>-sw`, each host at
    `10.77.0.<n>`."""

    def __init__(self, hosts: list[str]) -> None:
        check_tools()
        self.prefix = "nq" + secrets.token_hex(3)
        self.switch = f"{self.prefix}-sw"
        self.addresses: dict[str, str] = {}
        self._namespaces: list[str] = []
        try:
            self._namespace(self.switch)
            _run("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
            _run("ip", "-n", self.switch, "link", "set", "br0", "up")
            for index, host in enumerate(hosts, start=2):
                self._add_host(host, f"{SUBNET}.{index}", index)
        except BaseException:
            self.close()
            raise

    def _namespace(self, name: str) -> None:
        _run("ip", "netns", "add", name)
        self._namespaces.append(name)
        _run("ip", "-n", name, "link", "set", "lo", "up")

    def _add_host(self, host: str, address: str, index: int) -> None:
        namespace = self.namespace(host)
        self._namespace(namespace)
        inside, outside = f"{self.prefix}i{index}", f"{self.prefix}o{index}"
        _run(
            "ip", "link", "add", inside, "netns", namespace,
            "type", "veth", "peer", "name", outside, "netns", self.switch,
        )  # fmt: skip
        _run("ip", "-n", namespace, "link", "set", inside, "name", "eth0")
        _run("ip", "-n", namespace, "addr", "add", f"{address}/24", "dev", "eth0")
        _run("ip", "-n", namespace, "link", "set", "eth0", "up")
        _run("ip", "-n", self.switch, "link", "set", outside, "master", "br0")
        _run("ip", "-n", self.switch, "link", "set", outside, "up")
        # Every host has its own table for the faults, empty until one is made.
        self.nft(host, "add table inet faults")
        for hook in ("input", "output"):
            self.nft(
                host, f"add chain inet faults {hook} {{ type filter hook {hook} priority 0; }}"
            )
        self.addresses[host] = address

    def namespace(self, host: str) -> str:
        return f"{self.prefix}-{host}"

    def prefix_for(self, host: str) -> tuple[str, ...]:
        """What runs a command inside `host`'s namespace."""
        return ("ip", "netns", "exec", self.namespace(host))

    def nft(self, host: str, rule: str) -> None:
        _run("ip", "netns", "exec", self.namespace(host), "nft", rule)

    # -- faults -------------------------------------------------------------------------------

    def cut(self, host: str, peers: list[str], *, inbound: bool = True, outbound: bool = True):
        """`host` stops hearing from `peers` (`inbound`) and/or reaching them (`outbound`):
        their packets are dropped in `host`'s namespace, established connections included."""
        for peer in peers:
            address = self.addresses[peer]
            if inbound:
                self.nft(host, f"add rule inet faults input ip saddr {address} drop")
            if outbound:
                self.nft(host, f"add rule inet faults output ip daddr {address} drop")

    def lose(self, host: str, percent: int) -> None:
        """`percent` of the packets `host` sends and receives are dropped, at random."""
        drop = f"numgen random mod 100 < {percent} drop"
        self.nft(host, f'add rule inet faults input iifname != "lo" {drop}')
        self.nft(host, f'add rule inet faults output oifname != "lo" {drop}')

    def heal(self, host: str) -> None:
        for hook in ("input", "output"):
            self.nft(host, f"flush chain inet faults {hook}")

    def close(self) -> None:
        for namespace in reversed(self._namespaces):
            # Processes still inside would keep nothing alive, but a veth left in the switch
            # namespace would: deleting the namespaces removes their interfaces.
            subprocess.run(["ip", "netns", "pids", namespace], capture_output=True)
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True)
        self._namespaces.clear()


def set_delay(control: Path, milliseconds: int) -> None:
    """What a delay relay (`tests/cluster/delay_relay.py`) reading `control` holds each chunk."""
    temporary = control.with_suffix(".tmp")
    temporary.write_text(str(milliseconds))
    temporary.replace(control)
