"""nsqd's side of discovery: one peer task per `--lookupd-tcp-address` (Go's lookup.go).

Each peer connects, sends the V1 magic and IDENTIFY, registers every topic and channel this
nsqd hosts, then sends REGISTER/UNREGISTER as topics and channels come and go and PINGs every
15 s. When the connection fails it reconnects with a growing delay and registers everything
again, so a restarted nsqlookupd learns the whole state back.

The REGISTER grammar follows the lookupd (docs/protocol.md §8 row 7): an nsqlookupd that reports a
Youzan ("HA") or nsqpy version gets the partitioned form `REGISTER t 0 [c]`; an official
nsqlookupd gets the classic `REGISTER t [c]`, which is the only form it parses correctly.
"""

import json
import logging
import urllib.parse
from collections import deque
from typing import TYPE_CHECKING, Protocol

import trio

from nsqpy import network
from nsqpy.common.lookup_protocol import (
    MAGIC_V1,
    LookupClientConnection,
    LookupResponseError,
    encode_identify,
    encode_ping,
    encode_register,
    encode_unregister,
)
from nsqpy.common.version import VERSION
from nsqpy.daemon.http_get import NSQ_V1_ACCEPT
from nsqpy.daemon.log import first_error
from nsqpy.nsqd.wakeup import Wakeup

if TYPE_CHECKING:
    from nsqpy.nsqd.options import Options


class LookupHost(Protocol):
    """What nsqlookupd is told of this nsqd (`NSQD`): who it is, and what it holds."""

    @property
    def options(self) -> "Options": ...

    @property
    def log(self) -> logging.Logger: ...

    @property
    def tcp_port(self) -> int: ...

    @property
    def http_port(self) -> int: ...

    @property
    def hostname(self) -> str: ...

    def registrations(self) -> list[tuple[str, str | None, int]]:
        """Each (topic, channel or None, partition) nsqlookupd must know."""


PING_INTERVAL = 15.0
RESPONSE_TIMEOUT = 5.0
CONNECT_TIMEOUT = 5.0
MAX_RECONNECT_DELAY = 5.0


class LookupPeer:
    def __init__(self, nsqd: LookupHost, address: str) -> None:
        self.nsqd = nsqd
        self.address = address
        self.info: dict = {}
        self.partitioned = False
        self.connected = False
        self._pending: deque[tuple[str, str, str | None, int]] = deque()
        self._wakeup = Wakeup()
        self.cancel_scope = trio.CancelScope()
        self._lost = False

    def notify(self, action: str, topic: str, channel: str | None, partition: int) -> None:
        """Queue REGISTER or UNREGISTER for the open connection (dropped while disconnected:
        the next connection registers the whole state anyway)."""
        if self.connected:
            self._pending.append((action, topic, channel, partition))
            self._wakeup.set()

    async def run(self) -> None:
        log = self.nsqd.log
        delay = 0.1
        with self.cancel_scope:
            while True:
                # `except*`: the session's idle wait is a nursery, whose errors come grouped.
                try:
                    await self._session()
                except* (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as group:
                    log.error("LOOKUPD(%s): error - %s", self.address, first_error(group))
                except* (LookupResponseError, ValueError, trio.TooSlowError) as group:
                    log.error("LOOKUPD(%s): bad response - %s", self.address, first_error(group))
                finally:
                    registered = self.connected
                    self.connected = False
                    self._pending.clear()
                if registered:
                    delay = 0.1  # it worked for a while: start the back-off afresh
                await trio.sleep(delay)
                delay = min(delay * 2, MAX_RECONNECT_DELAY)

    async def _session(self) -> None:
        """One connection's life, until it fails."""
        self._lost = False
        nsqd = self.nsqd
        host, _, port = self.address.rpartition(":")
        with trio.fail_after(CONNECT_TIMEOUT):
            stream = await network.current().connect(host.strip("[]"), int(port))
        async with stream:
            decoder = LookupClientConnection()
            await stream.send_all(MAGIC_V1)
            identify = {
                "version": VERSION,
                "tcp_port": nsqd.tcp_port,
                "http_port": nsqd.http_port,
                "hostname": nsqd.hostname,
                "broadcast_address": nsqd.options.broadcast_address,
                "distributed_id": f"{nsqd.options.broadcast_address}:{nsqd.tcp_port}:nsqpy",
            }
            reply = await self._command(stream, decoder, encode_identify(identify))
            if reply == b"E_INVALID":
                nsqd.log.info("LOOKUPD(%s): lookupd returned %s", self.address, reply)
                return
            self.info = json.loads(reply)
            version = str(self.info.get("version", ""))
            self.partitioned = "HA" in version or "nsqpy" in version
            nsqd.log.info("LOOKUPD(%s): peer info %s", self.address, go_peer_info(self.info))
            self.connected = True
            for topic, channel, partition in nsqd.registrations():
                register = self._encode("REGISTER", topic, channel, partition)
                await self._command(stream, decoder, register)
            next_ping = trio.current_time() + PING_INTERVAL
            while True:
                while self._pending:
                    action, topic, channel, partition = self._pending.popleft()
                    nsqd.log.info(
                        "LOOKUPD(%s): %s %s %s", self.address, action, topic, channel or ""
                    )
                    command = self._encode(action, topic, channel, partition)
                    await self._command(stream, decoder, command)
                if trio.current_time() >= next_ping:
                    await self._command(stream, decoder, encode_ping())
                    next_ping = trio.current_time() + PING_INTERVAL
                with trio.move_on_at(next_ping):
                    async with trio.open_nursery() as waiting:
                        # A lookupd that went away (restart) is noticed at once, not at the
                        # next PING, so everything is registered again without delay.
                        waiting.start_soon(self._wait_for_eof, stream, waiting.cancel_scope)
                        await self._wakeup.wait()
                        waiting.cancel_scope.cancel()
                if self._lost:
                    raise trio.BrokenResourceError("nsqlookupd closed the connection")

    async def _wait_for_eof(self, stream, scope: trio.CancelScope) -> None:
        """While idle nothing is owed to us, so any read result means the end: EOF, a reset,
        or bytes a lookupd should never send unasked."""
        try:
            await stream.receive_some(1)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        self._lost = True
        self._wakeup.set()
        scope.cancel()

    def _encode(self, action: str, topic: str, channel: str | None, partition: int) -> bytes:
        encode = encode_register if action == "REGISTER" else encode_unregister
        # An official nsqlookupd knows no partitions: it hears about the topic as a whole.
        return encode(topic, channel, partition if self.partitioned else None)

    async def _command(self, stream, decoder: LookupClientConnection, data: bytes) -> bytes:
        await stream.send_all(data)
        with trio.fail_after(RESPONSE_TIMEOUT):
            while True:
                data = await stream.receive_some(64 * 1024)
                if not data:
                    raise trio.BrokenResourceError("nsqlookupd closed the connection")
                replies = decoder.receive_data(data)
                if replies:
                    return replies[0]


class LookupPeers:
    """The set of peers, changed at run time by PUT /config/nsqlookupd_tcp_addresses."""

    def __init__(self, nsqd: LookupHost) -> None:
        self.nsqd = nsqd
        self.peers: dict[str, LookupPeer] = {}
        self._nursery: trio.Nursery | None = None

    async def run(self, addresses: list[str]) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self.set_addresses(addresses)
            await trio.sleep_forever()

    def set_addresses(self, addresses: list[str]) -> None:
        if self._nursery is None:
            return
        wanted = list(dict.fromkeys(addresses))
        for address in list(self.peers):
            if address not in wanted:
                self.peers.pop(address).cancel_scope.cancel()
        for address in wanted:
            if address not in self.peers:
                peer = LookupPeer(self.nsqd, address)
                self.peers[address] = peer
                self._nursery.start_soon(peer.run)

    def notify(
        self, action: str, topic: str, channel: str | None = None, partition: int = 0
    ) -> None:
        for peer in self.peers.values():
            peer.notify(action, topic, channel, partition)

    def http_addresses(self) -> list[str]:
        """Each connected lookupd's HTTP address, as its IDENTIFY answer gave it (Go's
        lookupdHTTPAddrs: broadcast_address and http_port; a lookupd without one is skipped)."""
        addresses = []
        for peer in self.peers.values():
            host = str(peer.info.get("broadcast_address") or "")
            if host and peer.info.get("http_port"):
                host = f"[{host}]" if ":" in host else host
                addresses.append(f"{host}:{peer.info['http_port']}")
        return addresses


async def topic_channels(addresses: list[str], topic: str, timeout: float) -> list[str]:
    """The union of the channels every lookupd at `addresses` knows for `topic` (`GET
    /channels?topic=`, Go's GetLookupdTopicChannels), asked all at once.

    LookupChannelsError, with the channels found, when some lookupd did not answer.
    """
    found: set[str] = set()
    errors: list[str] = []

    async def ask(address: str) -> None:
        url = f"http://{address}/channels?{urllib.parse.urlencode({'topic': topic})}"
        try:
            answer = await network.current().request(
                "GET", url, timeout=timeout, headers={"Accept": NSQ_V1_ACCEPT}
            )
            found.update(_channels_of(answer))
        except (OSError, ValueError, TypeError, KeyError) as error:
            errors.append(f"{address}: {error}")

    async with trio.open_nursery() as nursery:
        for address in addresses:
            nursery.start_soon(ask, address)
    channels = sorted(found)
    if errors:
        raise LookupChannelsError("; ".join(errors), channels)
    return channels


class LookupChannelsError(Exception):
    def __init__(self, message: str, channels: list[str]) -> None:
        super().__init__(message)
        self.channels = channels


def _channels_of(answer: network.HTTPAnswer) -> list[str]:
    document = json.loads(answer.ok_body())
    # An nsqlookupd older than 1.0 wraps its answer in {"status_code", "data"}.
    if "data" in document and "channels" not in document:
        document = document["data"]
    return [str(channel) for channel in document["channels"] or []]


def go_peer_info(info: dict) -> str:
    """nsqlookupd's IDENTIFY answer as Go nsqd logs it: its `peerInfo` struct with `%+v`."""

    def number(key: str) -> int:
        value = info.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else 0

    def text(key: str) -> str:
        value = info.get(key)
        return value if isinstance(value, str) else ""

    return (
        f"{{TCPPort:{number('tcp_port')} HTTPPort:{number('http_port')}"
        f" Version:{text('version')} BroadcastAddress:{text('broadcast_address')}}}"
    )
