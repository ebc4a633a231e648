"""The etcd model (nsqpy/etcd_model.py) under the production client: what a call costs on it
against a real etcd, and how many simulated seconds a real second holds on a virtual clock.

    .venv/bin/python -m bench.etcd_model [--count 2000] [--hours 1]

* **calls**: `--count` puts of a 100-byte value over 100 keys, then as many gets, one at a
  time from one trio task, through `EtcdClient`: on the model over `ModelNetwork`, then on a
  fresh real etcd (Debian's etcd-server, the cluster tests' way). µs a call.
* **virtual time**: on trio's MockClock (autojump), a node's life in etcd for `--hours`
  simulated hours: a 3 s lease kept alive (a refresh a second, as nsqd's node lease), a put
  every 10 s under it and a watch that reads every event back. Simulated seconds a real one.
"""

import argparse
import sys
import time

import trio
import trio.testing

from bench._support import Record, Report, add_common_arguments, banner, load_average
from nsqpy.etcd import EtcdClient, keep_lease_alive
from nsqpy.etcd_model import EtcdModel
from nsqpy.etcd_model_network import ModelNetwork

VALUE = b"v" * 100
KEYS = 100


async def _calls(client: EtcdClient, count: int) -> dict[str, float]:
    for index in range(100):  # warm-up
        await client.put(f"k/{index % KEYS}", VALUE)
    figures = {}
    for name, call in (
        ("put", lambda i: client.put(f"k/{i % KEYS}", VALUE)),
        ("get", lambda i: client.get(f"k/{i % KEYS}")),
    ):
        started = time.perf_counter()
        for index in range(count):
            await call(index)
        figures[name] = (time.perf_counter() - started) / count * 1e6
    return figures


async def calls_on_the_model(count: int) -> dict[str, float]:
    async with trio.open_nursery() as nursery:
        network = ModelNetwork(EtcdModel(), nursery)
        await nursery.start(network.run)
        async with EtcdClient(["http://etcd-model:2379"], network=network) as client:
            figures = await _calls(client, count)
        nursery.cancel_scope.cancel()
    return figures


async def calls_on_etcd(count: int) -> dict[str, float]:
    from tests.cluster.etcd_server import EtcdServer

    server = EtcdServer().start()
    try:
        async with EtcdClient([server.client_url]) as client:
            return await _calls(client, count)
    finally:
        server.close()


async def a_nodes_life(hours: float) -> int:
    """The simulated life; how many events the watch read back."""
    seconds = hours * 3600
    async with trio.open_nursery() as nursery:
        network = ModelNetwork(EtcdModel(), nursery)
        await nursery.start(network.run)
        async with EtcdClient(["http://etcd-model:2379"], network=network) as client:
            lease = await client.grant_lease(3)
            first = await client.put("nodes/1", "up", lease=lease)
            seen = 0

            async def watch() -> None:
                nonlocal seen
                async with client.watch_prefix("nodes/", first + 1) as events:
                    async for _event in events:
                        seen += 1

            async with trio.open_nursery() as life:
                await life.start(keep_lease_alive, client, lease, 3)
                life.start_soon(watch)
                for beat in range(int(seconds // 10)):
                    await trio.sleep(10)
                    await client.put("nodes/1", f"beat {beat}", lease=lease)
                await trio.sleep(1)
                life.cancel_scope.cancel()
        nursery.cancel_scope.cancel()
    return seen


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--hours", type=float, default=1.0)
    add_common_arguments(parser, runs=1)
    args = parser.parse_args(argv)
    banner("the etcd model (bench.etcd_model)", f"{args.count:,} calls; {args.hours:g} h")
    report = Report(args.json)
    load = load_average()
    model = trio.run(calls_on_the_model, args.count)
    real = trio.run(calls_on_etcd, args.count)
    for name in ("put", "get"):
        print(f"  {name}: model {model[name]:.0f} µs a call, etcd {real[name]:.0f} µs")
        report.add(Record("etcd_model", f"{name} on the model", "µs", [model[name]], [load]))
        report.add(Record("etcd_model", f"{name} on etcd", "µs", [real[name]], [load]))
    started = time.perf_counter()
    seen = trio.run(a_nodes_life, args.hours, clock=trio.testing.MockClock(autojump_threshold=0))
    elapsed = time.perf_counter() - started
    rate = args.hours * 3600 / elapsed
    print(f"  {args.hours:g} simulated h in {elapsed:.1f} s: {rate:,.0f} simulated s a second")
    print(f"  ({seen:,} watch events read back)")
    report.add(Record("etcd_model", "simulated seconds a real second", "s/s", [rate], [load]))
    report.write()


if __name__ == "__main__":
    main(sys.argv[1:])
