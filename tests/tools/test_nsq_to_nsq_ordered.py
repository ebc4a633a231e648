"""nsq_to_nsq_ordered, Youzan's ordered copy, between two ordered partitioned topics on real
daemons: each key's messages arrive on one destination partition in the order they were
published, and the source channel is left empty."""

import json

from nsqpy.client.smart import SmartConsumer, SmartProducer
from tests.support.partitioned import DEADLINE, Cluster
from tests.support.polling import poll
from tests.tools.support import run_tool, start_tool, stop_tool


def test_each_keys_messages_are_copied_in_order(tmp_path):
    cluster = Cluster(tmp_path, lookupds=1)
    try:
        cluster.create_topic("source", partitions=2, channels=("copy",), orderedmulti="true")
        cluster.create_topic("copied", partitions=2, channels=("check",), orderedmulti="true")
        lookupds = cluster.lookupd_addresses
        with SmartProducer(lookupds) as producer:
            for n in range(40):
                key = f"k{n % 4}"
                body = json.dumps({"testkey": {"key2": key}, "n": n}).encode()
                producer.publish("source", body, key=key)
        tool = start_tool(
            "nsq_to_nsq_ordered",
            "--topic=source",
            "--channel=copy",
            "--destination-topic=copied",
            f"--lookupd-http-address={lookupds[0]}",
        )
        received: dict[str, list[tuple[int, int]]] = {}
        with SmartConsumer(lookupds, "copied", "check", ordered=True) as consumer:

            def all_copied() -> bool:
                message = consumer.receive(0.2)
                if message is not None:
                    document = json.loads(message.body)
                    key = document["testkey"]["key2"]
                    received.setdefault(key, []).append((message.partition, document["n"]))
                    message.finish()
                return sum(map(len, received.values())) == 40

            poll(all_copied, "the 40 messages copied", timeout=DEADLINE)
        stop_tool(tool)
        for key, copies in received.items():
            numbers = [n for _partition, n in copies]
            assert numbers == sorted(numbers) == [n for n in range(40) if f"k{n % 4}" == key]
            assert len({partition for partition, _n in copies}) == 1, key
    finally:
        cluster.close()


def test_the_tool_says_what_it_needs():
    result = run_tool("nsq_to_nsq_ordered", "--topic=t")
    assert result.returncode == 1
    assert "--lookupd-http-address required" in result.stderr.decode()
    result = run_tool("nsq_to_nsq_ordered", "--topic=bad topic", "--lookupd-http-address=x:1")
    assert result.returncode == 1 and "--topic is invalid" in result.stderr.decode()
