"""The connector against nsqds that require TLS and AUTH: the source and the sink, classic and
log topics, direct (`nsqd`, `nsqd_http`) and through nsqlookupd, and the idempotent sink.

Options: `tls`, `tlsRootCaFile`, `tlsCert`, `tlsKey` and `authSecret` (docs/spark.md). The
direct nsqd requires TLS on TCP and HTTP (its plain HTTP port answers `TLS_REQUIRED` with the
HTTPS port, which the connector follows), a client certificate its CA signed, and AUTH on
every route but /ping and /info (`--http-auth-required`). Behind nsqlookupd the nsqd requires
TLS on TCP only (`tcp-https`: the standalone nsqlookupd places partitions over its plain
HTTP port, carrying the cluster secret)."""

from collections.abc import Iterator

import pytest

from nsqpy.client.blocking import http_json, http_request
from nsqpy.client.security import Security
from tests.harness import start_nsqlookupd
from tests.security.support import Certificates, make_certificates, running_nsqd
from tests.spark.support import MSG_TIMEOUT, collect_available_now
from tests.support.auth_server import AuthServer, answering
from tests.support.polling import poll

pytestmark = pytest.mark.spark

SECRET = "pipeline"
CLUSTER_SECRET = "cluster-of-two"
ALL = {"topic": ".*", "channels": [".*"]}
ANSWERS = {
    SECRET: {"ttl": 3600, "authorizations": [{**ALL, "permissions": ["subscribe", "publish"]}]},
    "reader": {"ttl": 3600, "authorizations": [{**ALL, "permissions": ["subscribe"]}]},
}


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def auth_server() -> Iterator[AuthServer]:
    with answering(ANSWERS) as server:
        yield server


def secured_flags(certs: Certificates, auth_server: AuthServer, tls_required: str) -> list[str]:
    return [
        *certs.tls_flags(),
        f"-tls-required={tls_required}",
        "-tls-client-auth-policy=require-verify",
        f"-tls-root-ca-file={certs.ca}",
        f"-auth-http-address=127.0.0.1:{auth_server.port}",
        "-http-auth-required",
        f"-msg-timeout={MSG_TIMEOUT}",
    ]


@pytest.fixture
def nsqd(certs, auth_server, tmp_path):
    flags = secured_flags(certs, auth_server, "true")
    (tmp_path / "nsqd").mkdir()
    with running_nsqd(tmp_path / "nsqd", *flags, "-log-topic=lt") as daemon:
        yield daemon


def proven(certs: Certificates, secret: str = SECRET) -> Security:
    return Security(
        tls_v1=True,
        tls_root_ca_file=certs.ca,
        tls_cert=certs.client_cert,
        tls_key=certs.client_key,
        auth_secret=secret,
    )


def with_security(source, certs: Certificates, secret: str = SECRET):
    return (
        source.option("tls", "true")
        .option("tlsRootCaFile", certs.ca)
        .option("tlsCert", certs.client_cert)
        .option("tlsKey", certs.client_key)
        .option("authSecret", secret)
    )


def bodies_of(rows) -> list[bytes]:
    return sorted(bytes(row.body) for row in rows)


def test_a_classic_topic_written_and_read_over_tls_and_auth(spark, nsqd, certs, tmp_path):
    tcp, http = nsqd.addresses["TCP"], nsqd.addresses["HTTP"]
    expected = [f"classic-{i:03d}".encode() for i in range(200)]
    frame = spark.createDataFrame([(body,) for body in expected], "body binary")
    with_security(frame.write.format("nsq").mode("append"), certs).option("nsqd_http", http).option(
        "topic", "classic"
    ).save()
    stream = with_security(spark.readStream.format("nsq"), certs)
    stream = (
        stream.option("nsqd", tcp)
        .option("nsqd_http", http)
        .option("topic", "classic")
        .option("channel", "spark")
        .option("source", "classic")
        .option("idleTimeout", "5s")
        .load()
    )
    assert bodies_of(collect_available_now(stream, tmp_path / "checkpoint")) == expected
    stats = http_json(http, "/stats", security=proven(certs), format="json", topic="classic")
    (channel,) = stats["topics"][0]["channels"]
    assert (channel["depth"], channel["in_flight_count"], channel["message_count"]) == (0, 0, 200)


def test_a_log_topic_written_and_read_in_batch_and_stream_over_tls_and_auth(
    spark, nsqd, certs, tmp_path
):
    http = nsqd.addresses["HTTP"]
    expected = [f"log-{i:03d}".encode() for i in range(300)]
    frame = spark.createDataFrame([(body,) for body in expected], "body binary")
    with_security(frame.write.format("nsq").mode("append"), certs).option("nsqd_http", http).option(
        "topic", "lt"
    ).save()
    batch = with_security(spark.read.format("nsq"), certs).option("nsqd_http", http)
    assert bodies_of(batch.option("topic", "lt").load().collect()) == expected
    stream = with_security(spark.readStream.format("nsq"), certs).option("nsqd_http", http)
    stream = stream.option("topic", "lt").option("channel", "query")
    stream = stream.option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "100")
    rows = collect_available_now(stream.load(), tmp_path / "checkpoint")
    assert bodies_of(rows) == expected
    # Spark commits a batch when it plans the next: the query moved its channel past the first
    # two of its three batches, through the secured HTTPS port.
    stats = http_json(http, "/stats", security=proven(certs), format="json", topic="lt")
    (channel,) = stats["topics"][0]["channels"]
    assert (channel["channel_name"], channel["confirmed_count"]) == ("query", 200)


def test_a_credential_the_auth_server_refuses_fails_the_read_saying_so(spark, nsqd, certs):
    http = nsqd.addresses["HTTP"]
    http_request(http, "/pub", method="POST", body=b"x", security=proven(certs), topic="lt")
    batch = with_security(spark.read.format("nsq"), certs, secret="stranger")
    with pytest.raises(Exception, match="AUTH_FAILED") as refused:
        batch.option("nsqd_http", http).option("topic", "lt").load().collect()
    assert "authSecret" in str(refused.value)


@pytest.fixture
def cluster(certs, auth_server, tmp_path):
    """(nsqlookupd HTTP, nsqd HTTP): a standalone nsqlookupd and one nsqd registered with it,
    which requires TLS on TCP and AUTH everywhere; nsqlookupd reaches it with the cluster
    secret."""
    lookupd = start_nsqlookupd("-broadcast-address=127.0.0.1", f"-cluster-secret={CLUSTER_SECRET}")
    try:
        flags = secured_flags(certs, auth_server, "tcp-https")
        (tmp_path / "nsqd").mkdir()
        with running_nsqd(
            tmp_path / "nsqd",
            *flags,
            f"-cluster-secret={CLUSTER_SECRET}",
            f"-lookupd-tcp-address={lookupd.addresses['TCP']}",
            "-broadcast-address=127.0.0.1",
        ) as nsqd:
            lookupd_http = lookupd.addresses["HTTP"]
            poll(lambda: http_json(lookupd_http, "/nodes")["producers"], "the nsqd to register")
            yield lookupd_http, nsqd.addresses["HTTP"]
    finally:
        lookupd.stop()


def test_the_idempotent_sink_and_the_source_through_nsqlookupd_over_tls_and_auth(
    spark, cluster, certs
):
    lookupd_http, nsqd_http = cluster
    security = proven(certs)
    http_request(
        lookupd_http,
        "/topic/create",
        method="POST",
        topic="orders",
        partition_num="2",
        replicator="1",
    )
    for partition in (0, 1):
        poll(
            lambda p=partition: _has_partition(nsqd_http, security, "orders", p),
            f"partition {partition} placed",
        )
        http_request(
            nsqd_http,
            "/channel/create",
            method="POST",
            security=security,
            topic="orders",
            channel="c",
            partition=str(partition),
        )
    poll(
        lambda: (
            len(http_json(lookupd_http, "/lookup", topic="orders", access="w")["partitions"]) == 2
        ),
        "nsqlookupd to list both partitions to writers",
    )
    expected = [f"order-{i:03d}".encode() for i in range(400)]
    frame = spark.createDataFrame([(body,) for body in expected], "body binary").repartition(2)
    writer = with_security(frame.write.format("nsq").mode("append"), certs).option(
        "lookupd", lookupd_http
    )
    writer.option("topic", "orders").save()
    reader = with_security(spark.read.format("nsq"), certs).option("lookupd", lookupd_http)
    rows = reader.option("topic", "orders").load().collect()
    assert bodies_of(rows) == expected
    assert {row.partition for row in rows} == {0, 1}
    # Stored once each.
    stats = http_json(nsqd_http, "/stats", security=security, format="json", topic="orders")
    assert sum(t["message_count"] for t in stats["topics"]) == len(expected)


def _has_partition(nsqd_http: str, security: Security, topic: str, partition: int) -> bool:
    stats = http_json(nsqd_http, "/stats", security=security, format="json", topic=topic)
    return any(t.get("topic_partition") == partition for t in stats.get("topics") or [])
