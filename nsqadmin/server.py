"""The nsqadmin process: the aiohttp server, its HTTP client to the cluster, the /stats poller
that feeds the charts, and the notification sender; `serve()` runs them until `shutdown()`."""

import asyncio
import logging
import os
import ssl
import time

import aiohttp
from aiohttp import web

from nsqpy.common.version import version_line
from nsqpy.daemon.net import listening_socket
from nsqpy.nsqadmin.actions import Actions
from nsqpy.nsqadmin.app import build_app
from nsqpy.nsqadmin.charts import POLL_INTERVAL, History
from nsqpy.nsqadmin.cluster import ClusterInfo, UpstreamError
from nsqpy.nsqadmin.notify import Notifier
from nsqpy.nsqadmin.options import Options
from nsqpy.nsqadmin.pages import FlashStore
from nsqpy.nsqadmin.stats import aggregate_topics

# What nsqadmin sends (Authorization: Bearer) to nsqds and nsqlookupds that require AUTH when
# the request it is answering carries no credential of its own: its chart poller's reads.
AUTH_SECRET_ENVIRONMENT = "NSQADMIN_HTTP_CLIENT_AUTH_SECRET"


class NSQAdmin:
    def __init__(self, options: Options, log: logging.Logger) -> None:
        self._options = options
        self.log = log
        self.history = History()
        self.flash = FlashStore()
        self.http_address = ""
        self._stopping = asyncio.Event()
        # Made in serve(), inside the event loop.
        self.cluster: ClusterInfo
        self.notifier: Notifier
        self.actions: Actions

    @property
    def options(self) -> Options:
        return self._options

    def set_options(self, options: Options) -> None:
        """PUT /config/... swaps the options, as Go's swapOpts."""
        self._options = options

    def client_ssl_context(self) -> ssl.SSLContext:
        """The TLS settings for nsqd/nsqlookupd/notification URLs given as https://."""
        options = self.options
        context = ssl.create_default_context(cafile=options.http_client_tls_root_ca_file or None)
        if options.http_client_tls_insecure_skip_verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if options.http_client_tls_cert:
            context.load_cert_chain(options.http_client_tls_cert, options.http_client_tls_key)
        return context

    async def serve(self) -> None:
        options = self.options
        self.log.info("%s", version_line("nsqadmin"))
        if options.graphite_url or options.proxy_graphite:
            self.log.warning(
                "--graphite-url/--proxy-graphite ignored: nsqpy draws its charts from nsqd /stats"
            )
        timeout = aiohttp.ClientTimeout(
            total=options.http_client_connect_timeout + options.http_client_request_timeout,
            sock_connect=options.http_client_connect_timeout,
            sock_read=options.http_client_request_timeout,
        )
        connector = aiohttp.TCPConnector(ssl=self.client_ssl_context(), limit=64)
        sock = listening_socket(options.http_address)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            # nsqadmin's command line is Go's to the byte: this nsqpy setting is read from the
            # environment (docs/operations.md, "Securing a cluster").
            secret = os.environ.get(AUTH_SECRET_ENVIRONMENT, "")
            self.cluster = ClusterInfo(session, self.log, auth_secret=secret)
            self.notifier = Notifier(options.notification_http_endpoint, session, self.log)
            self.actions = Actions(lambda: self.options, self.cluster, self.notifier)
            runner = web.AppRunner(build_app(self), access_log=None, handle_signals=False)
            await runner.setup()
            site = web.SockSite(runner, sock, shutdown_timeout=1.0)
            await site.start()
            self.http_address = format_address(sock.getsockname())
            self.log.info("HTTP: listening on %s", self.http_address)
            tasks = [
                asyncio.create_task(
                    self._poll(ClusterInfo(session, self.log, quiet=True, auth_secret=secret))
                ),
                asyncio.create_task(self.notifier.run()),
            ]
            try:
                await self._stopping.wait()
            finally:
                self.log.info("HTTP: closing %s", self.http_address)
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                await runner.cleanup()

    def shutdown(self) -> None:
        self._stopping.set()

    async def _poll(self, cluster: ClusterInfo) -> None:
        """Every POLL_INTERVAL, every topic's and channel's totals into the chart history."""
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            options = self.options
            try:
                producers, _ = await cluster.get_producers(
                    options.lookupd_http_address, options.nsqd_http_address
                )
                stats, _ = await cluster.get_nsqd_stats(producers, include_clients=False)
                self.history.record(time.time(), aggregate_topics(stats.topics))
            except UpstreamError as error:
                self.log.debug("chart poll failed - %s", error)
            except Exception:  # the poller must outlive any surprise in one poll
                self.log.exception("chart poll failed")
            await asyncio.sleep(max(POLL_INTERVAL - (loop.time() - started), 0.1))


def format_address(sockname) -> str:
    host, port = sockname[0], sockname[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
