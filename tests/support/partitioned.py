"""nsqlookupds and nsqds as processes, with partitioned topics created through nsqlookupd (no
etcd): what the smart client adapters are tested against."""

import json
import urllib.error
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from nsqpy.client.blocking import http_json, http_request
from tests.harness import DaemonProcess, start_nsqd, start_nsqlookupd
from tests.support.polling import poll

DEADLINE = 10.0


class Cluster:
    """nsqlookupds and nsqds as subprocesses; every nsqd registers with every lookupd."""

    def __init__(
        self, root: Path, *, lookupds: int = 2, nsqds: int = 2, nsqd_flags: tuple[str, ...] = ()
    ) -> None:
        self.nsqd_flags = nsqd_flags
        self.lookupds = [start_nsqlookupd("-broadcast-address=127.0.0.1") for _ in range(lookupds)]
        self.data_paths = [root / f"nsqd{index}" for index in range(nsqds)]
        for path in self.data_paths:
            path.mkdir()
        with ThreadPoolExecutor(max_workers=nsqds) as pool:
            self.nsqds = list(pool.map(self._start_nsqd, self.data_paths))
        for lookupd in self.lookupds:
            poll(lambda lookupd=lookupd: len(self.nodes(lookupd)) == nsqds, timeout=DEADLINE)

    def _start_nsqd(self, data_path: Path) -> DaemonProcess:
        lookupds = [f"-lookupd-tcp-address={lookupd.addresses['TCP']}" for lookupd in self.lookupds]
        return start_nsqd(data_path, *lookupds, "-broadcast-address=127.0.0.1", *self.nsqd_flags)

    def close(self) -> None:
        for daemon in [*self.nsqds, *self.lookupds]:
            daemon.kill()

    @property
    def lookupd_addresses(self) -> list[str]:
        return [lookupd.addresses["HTTP"] for lookupd in self.lookupds]

    @staticmethod
    def nodes(lookupd: DaemonProcess) -> list[dict]:
        return http_json(lookupd.addresses["HTTP"], "/nodes")["producers"]

    def running_lookupds(self) -> list[DaemonProcess]:
        return [lookupd for lookupd in self.lookupds if lookupd.process.poll() is None]

    def stop_nsqd(self, index: int) -> None:
        assert self.nsqds[index].stop() == 0

    def restart_nsqd(self, index: int) -> None:
        """Start it again on its data path (on new ports: clients must look it up again)."""
        self.nsqds[index] = self._start_nsqd(self.data_paths[index])

    def tcp_address(self, index: int) -> str:
        return self.nsqds[index].addresses["TCP"]

    def create_topic(
        self, topic: str, *, partitions: int = 4, channels: tuple[str, ...] = ("c",), **flags: str
    ) -> dict[int, int]:
        """Create a partitioned topic and its channels; partition -> the index of its nsqd,
        once every lookupd lists all partitions (as writable, when there are channels)."""
        lookupd = self.running_lookupds()[0]
        http_request(
            lookupd.addresses["HTTP"],
            "/topic/create",
            method="POST",
            topic=topic,
            partition_num=str(partitions),
            replicator="1",
            **flags,
        )
        owners: dict[int, int] = {}
        for index, nsqd in enumerate(self.nsqds):
            for partition in self.partition_stats(index, topic):
                owners[partition] = index
                for channel in channels:
                    http_request(
                        nsqd.addresses["HTTP"],
                        "/channel/create",
                        method="POST",
                        topic=topic,
                        channel=channel,
                        partition=str(partition),
                    )
        assert sorted(owners) == list(range(partitions))
        access = "w" if channels else "r"
        for lookupd in self.running_lookupds():
            poll(
                lambda lookupd=lookupd: len(listed(lookupd, topic, access)) == partitions,
                timeout=DEADLINE,
            )
        return owners

    def publish_tagged(self, topic: str, owners: dict[int, int]) -> None:
        """On each partition of an ext topic: a0 b0 a1 b1 a2 b2 (`a<partition>-<n>`), each
        with its Youzan tag (`##client_dispatch_tag`)."""
        for partition, index in owners.items():
            http = self.nsqds[index].addresses["HTTP"]
            for n in range(3):
                for tag in ("a", "b"):
                    http_request(
                        http,
                        "/pub_ext",
                        method="POST",
                        topic=topic,
                        partition=str(partition),
                        ext=json.dumps({"##client_dispatch_tag": tag}),
                        body=f"{tag}{partition}-{n}".encode(),
                    )

    def partition_stats(self, index: int, topic: str) -> dict[int, dict]:
        """topic_partition -> the /stats of that partition, on nsqd `index`."""
        stats = http_json(self.nsqds[index].addresses["HTTP"], "/stats", format="json", topic=topic)
        return {t["topic_partition"]: t for t in stats.get("topics") or []}

    def ready_counts(self, topic: str, channel: str) -> dict[int, list[int]]:
        """partition -> the RDY count of each client of `channel` there."""
        counts: dict[int, list[int]] = {}
        for index in range(len(self.nsqds)):
            for partition, stats in self.partition_stats(index, topic).items():
                for channel_stats in stats["channels"]:
                    if channel_stats["channel_name"] == channel:
                        clients = channel_stats["clients"]
                        counts[partition] = [client["ready_count"] for client in clients]
        return counts

    def message_counts(self, topic: str) -> dict[int, int]:
        """partition -> messages it received, over every running nsqd."""
        counts: dict[int, int] = {}
        for index, nsqd in enumerate(self.nsqds):
            if nsqd.process.poll() is None:
                for partition, stats in self.partition_stats(index, topic).items():
                    counts[partition] = stats["message_count"]
        return counts


def listed(lookupd: DaemonProcess, topic: str, access: str) -> dict:
    """/lookup?access=`access`'s partitions on this lookupd ({} while it has none)."""
    try:
        document = http_json(lookupd.addresses["HTTP"], "/lookup", topic=topic, access=access)
    except urllib.error.HTTPError as error:
        if error.code == 404:
            return {}
        raise
    return document.get("partitions") or {}
