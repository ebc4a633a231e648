"""Notifications of admin actions: with --notification-http-endpoint, every action taken
through nsqadmin (UI or API) is POSTed there as JSON in Go nsqadmin's AdminAction shape
(nsqadmin/notify.go), from a background task so that an action never waits on it."""

import asyncio
import base64
import binascii
import logging
import socket
import time

import aiohttp
from aiohttp import web

from nsqpy.common.goformat import go_json

_QUEUE_LIMIT = 1000  # past this many unsent notifications, new ones are dropped (and logged)


def basic_auth_user(request: web.Request) -> str:
    """The user of an `Authorization: Basic` header, as Go's basicAuthUser reads it."""
    scheme, _, credentials = request.headers.get("Authorization", "").partition(" ")
    if scheme != "Basic" or not credentials:
        return ""
    try:
        decoded = base64.b64decode(credentials, validate=True).decode("utf-8", "replace")
    except (binascii.Error, ValueError):
        return ""
    user, sep, _password = decoded.partition(":")
    return user if sep else ""


def admin_action(
    action: str, topic: str, channel: str, node: str, request: web.Request, now: float | None = None
) -> dict:
    """Go's AdminAction: channel, node and user are left out when empty (omitempty)."""
    scheme = "https" if request.secure or request.headers.get("X-Scheme") == "https" else "http"
    url = f"{scheme}://{request.host}{request.raw_path}"
    peer = request.transport.get_extra_info("peername") if request.transport else None
    remote_ip = ""
    if peer:  # Go's req.RemoteAddr: host:port, an IPv6 host in brackets
        host = f"[{peer[0]}]" if ":" in peer[0] else peer[0]
        remote_ip = f"{host}:{peer[1]}"
    notification: dict[str, str | int] = {"action": action, "topic": topic}
    if channel:
        notification["channel"] = channel
    if node:
        notification["node"] = node
    notification["timestamp"] = int(time.time() if now is None else now)
    user = basic_auth_user(request)
    if user:
        notification["user"] = user
    notification.update(
        remote_ip=remote_ip,
        user_agent=request.headers.get("User-Agent", ""),
        url=url,
        via=socket.gethostname(),
    )
    return notification


class Notifier:
    """Sends queued notifications one after another, each with the HTTP client timeouts."""

    def __init__(
        self, endpoint: str, session: aiohttp.ClientSession | None, log: logging.Logger
    ) -> None:
        self.endpoint = endpoint
        self.session = session
        self.log = log
        self._queue: asyncio.Queue[dict] = asyncio.Queue(_QUEUE_LIMIT)

    @property
    def enabled(self) -> bool:
        return bool(self.endpoint)

    def notify(self, notification: dict) -> None:
        if not self.enabled:
            return
        try:
            self._queue.put_nowait(notification)
        except asyncio.QueueFull:
            self.log.error("notification queue full - dropped %s", go_json(notification).decode())

    async def run(self) -> None:
        """The sender loop, until cancelled."""
        while True:
            notification = await self._queue.get()
            await self._send(notification)

    async def _send(self, notification: dict) -> None:
        assert self.session is not None
        self.log.info("POSTing notification to %s", self.endpoint)
        try:
            async with self.session.post(
                self.endpoint,
                data=go_json(notification),
                headers={"Content-Type": "application/json"},
            ) as response:
                await response.read()
                if response.status >= 400:
                    self.log.error("failed to POST notification - got response %s", response.status)
        except (TimeoutError, aiohttp.ClientError, OSError) as error:
            self.log.error("failed to POST notification - %s", error or type(error).__name__)
