"""The `nsqpy` pytest plugin (pytest11 entry point): its fixtures in a fresh pytest run."""

pytest_plugins = ["pytester"]


def test_fixtures_give_running_servers(pytester):
    pytester.makepyfile(
        r"""
        import urllib.request

        import pytest
        import trio

        from nsqpy.client.blocking import Consumer, Producer, lookup_nsqds


        def get(address, path):
            with urllib.request.urlopen(f"http://{address}{path}", timeout=5) as response:
                return response.read()


        def test_nsqd(nsqd):
            assert nsqd.tcp_address.startswith("127.0.0.1:")
            assert get(nsqd.http_address, "/ping") == b"OK"
            with Producer(nsqd.tcp_address) as producer:
                producer.publish("t", b"x")
            with Consumer(nsqd.tcp_address, "t", "c") as consumer:
                assert consumer.receive(timeout=5).body == b"x"


        def test_nsqlookupd(nsqlookupd):
            assert get(nsqlookupd.http_address, "/ping") == b"OK"


        def test_cluster(nsq_cluster):
            with Producer(nsq_cluster.nsqd_tcp_address) as producer:
                producer.publish("clustered", b"x")
            import time
            deadline = time.monotonic() + 10
            while not lookup_nsqds(nsq_cluster.lookupd_http_address, "clustered"):
                assert time.monotonic() < deadline
                time.sleep(0.01)
            port = nsq_cluster.nsqd_tcp_address.rsplit(":", 1)[1]
            assert lookup_nsqds(nsq_cluster.lookupd_http_address, "clustered") == [
                f"127.0.0.1:{port}"
            ]


        @pytest.mark.trio
        async def test_trio_code_can_use_the_addresses(nsqd):
            host, port = nsqd.tcp_address.rsplit(":", 1)
            stream = await trio.open_tcp_stream(host, int(port))
            await stream.send_all(b"  V2PUB t\n\x00\x00\x00\x01x")
            assert await stream.receive_some(100) == b"\x00\x00\x00\x06\x00\x00\x00\x00OK"
            await stream.aclose()
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=4)


def test_plugin_is_registered_through_the_entry_point(pytester):
    pytester.makepyfile("def test_nothing(): pass")
    result = pytester.runpytest_subprocess("--fixtures")
    output = result.stdout.str()
    assert "fixtures defined from nsqpy.testing.plugin" in output
    for fixture in ("nsqd --", "nsqlookupd --", "nsq_cluster --"):
        assert fixture in output
