"""nsqlookupd's registration database (Go's registration_db.go), with Youzan partitions.

A registration is `(category, key, subkey, partition)`: `("client", "", "", None)` for every
identified nsqd, `("topic", t, "", p)` and `("channel", t, c, p)` for what it hosts. The
partition is None for a classic peer's registrations (docs/protocol.md §8 row 7): those appear in
`/lookup`'s `producers` but never under `partitions`. Each registration maps peer ids (the
peer's remote address) to a Producer, which carries the per-registration tombstone.
"""

import time
from dataclasses import dataclass, field

ANY = "*"

Registration = tuple[str, str, str, int | None]


@dataclass(eq=False)
class PeerInfo:
    id: str
    remote_address: str
    hostname: str
    broadcast_address: str
    tcp_port: int
    http_port: int
    version: str
    distributed_id: str = ""
    partitioned: bool = False
    last_update: int = field(default_factory=time.time_ns)

    def official(self) -> dict:
        """Go's PeerInfo JSON (official nsqlookupd)."""
        return {
            "remote_address": self.remote_address,
            "hostname": self.hostname,
            "broadcast_address": self.broadcast_address,
            "tcp_port": self.tcp_port,
            "http_port": self.http_port,
            "version": self.version,
        }

    def as_json(self) -> dict:
        """The PEER object of `/lookup`: Youzan's keys (`id`, `distributed_id`) for Youzan-style
        peers, exactly the official keys for official nsqds."""
        if not self.partitioned:
            return self.official()
        return {"id": self.id, **self.official(), "distributed_id": self.distributed_id}


class Producer:
    __slots__ = ("peer", "tombstoned", "tombstoned_at")

    def __init__(self, peer: PeerInfo) -> None:
        self.peer = peer
        self.tombstoned = False
        self.tombstoned_at = 0.0  # time.time()

    def tombstone(self) -> None:
        self.tombstoned = True
        self.tombstoned_at = time.time()

    def is_tombstoned(self, lifetime: float) -> bool:
        return self.tombstoned and time.time() - self.tombstoned_at < lifetime


def _matches(registration: Registration, category: str, key: str, subkey: str) -> bool:
    return (
        registration[0] == category
        and (key == ANY or registration[1] == key)
        and (subkey == ANY or registration[2] == subkey)
    )


class RegistrationDB:
    def __init__(self) -> None:
        self.registrations: dict[Registration, dict[str, Producer]] = {}

    def add_registration(self, registration: Registration) -> None:
        self.registrations.setdefault(registration, {})

    def add_producer(self, registration: Registration, peer: PeerInfo) -> bool:
        """True if the peer was not registered there yet."""
        producers = self.registrations.setdefault(registration, {})
        if peer.id in producers:
            return False
        producers[peer.id] = Producer(peer)
        return True

    def remove_producer(self, registration: Registration, peer_id: str) -> tuple[bool, int]:
        """(removed, producers left), as Go's RemoveProducer."""
        producers = self.registrations.get(registration)
        if producers is None:
            return False, 0
        removed = producers.pop(peer_id, None) is not None
        return removed, len(producers)

    def remove_registration(self, registration: Registration) -> None:
        self.registrations.pop(registration, None)

    def find_registrations(
        self, category: str, key: str, subkey: str, partition: int | None | str = ANY
    ) -> list[Registration]:
        return [
            r
            for r in self.registrations
            if _matches(r, category, key, subkey) and (partition == ANY or r[3] == partition)
        ]

    def find_producers(
        self, category: str, key: str, subkey: str, partition: int | None | str = ANY
    ) -> list[Producer]:
        """Producers of the matching registrations, one per peer (Go de-duplicates too)."""
        seen: dict[str, Producer] = {}
        for registration in self.find_registrations(category, key, subkey, partition):
            for peer_id, producer in self.registrations[registration].items():
                seen.setdefault(peer_id, producer)
        return list(seen.values())

    def producers_of(self, registration: Registration) -> list[Producer]:
        return list(self.registrations.get(registration, {}).values())

    def registrations_of_peer(self, peer_id: str) -> list[Registration]:
        return [r for r, producers in self.registrations.items() if peer_id in producers]

    def topics(self) -> list[str]:
        return sorted({r[1] for r in self.registrations if r[0] == "topic"})

    def channels(self, topic: str, partition: int | None | str = ANY) -> list[str]:
        names = {r[2] for r in self.find_registrations("channel", topic, ANY, partition)}
        return sorted(names)


def active(producers: list[Producer], inactive_timeout: float, tombstone_lifetime: float):
    """Go's FilterByActive: drop producers not heard from within the timeout, and tombstoned."""
    now = time.time_ns()
    limit = inactive_timeout * 1e9
    return [
        p
        for p in producers
        if now - p.peer.last_update <= limit and not p.is_tombstoned(tombstone_lifetime)
    ]
