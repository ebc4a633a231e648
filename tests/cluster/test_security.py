"""A cluster's own links let no one in (docs/operations.md, "Securing a cluster"): replication
over mutual TLS with the cluster's CA, refusing a plain-TCP peer and a peer whose certificate
another CA signed; etcd over TLS with client certificates and etcd's user/password auth; a wrong
password ends a daemon's start with one clear line."""

import json
import ssl
import time

import pytest
import trustme

from nsqpy.common.replication import PULL, PUT, REPLY, encode_frame
from tests.cluster.aging import (
    AGED_NSQD_ARGS,
    age_topic,
    log_start,
    poll_back_in_isr,
    publish_batch,
    replace_disk,
)
from tests.cluster.cluster_tls import cluster_tls_flags, write_identity
from tests.cluster.etcd_server import EtcdServer, EtcdTLS
from tests.cluster.local_cluster import LocalCluster
from tests.cluster.raw_rpc import frames_of, raw_exchange
from tests.cluster.traffic import check_replicas_identical, drain
from tests.harness import DaemonProcess, V2Connection
from tests.security.access import ANSWERS, CLUSTER_SECRET
from tests.support.auth_server import answering
from tests.support.http import HTTPReply, request
from tests.support.polling import poll


@pytest.fixture
def tls_cluster(tmp_path, etcd_server, cluster_ca):
    flags = (*cluster_tls_flags(cluster_ca), "-sync-every=1")
    with LocalCluster(tmp_path, etcd_server, nsqd_args=flags) as cluster:
        cluster.create_topic("t", 1, 3)
        yield cluster


def publish_some(cluster, count: int) -> None:
    leader = cluster.node_leading("t", 0)
    connection = V2Connection(leader.tcp_port)
    try:
        for index in range(count):
            connection.send(b"PUB t 0\n" + len(b"m%d" % index).to_bytes(4, "big") + b"m%d" % index)
            assert connection.read_response().data == b"OK"
    finally:
        connection.close()


def log_end(node) -> list[int]:
    reply = node.http("GET", "/partition/offsets?topic=t")
    [entry] = json.loads(reply.body)["partitions"]
    return [entry["end"]["offset"], entry["end"]["count"]]


def test_replication_runs_over_mutual_tls(tls_cluster):
    publish_some(tls_cluster, 20)
    check_replicas_identical(tls_cluster, "t", 1)
    for node in tls_cluster.nodes:
        assert not any("not authenticated" in line for line in node.process.lines)


def test_an_unauthenticated_peer_gets_no_data_and_changes_nothing(tls_cluster):
    publish_some(tls_cluster, 5)
    info = tls_cluster.partition("t", 0)
    leader = tls_cluster.node(info["leader"])
    follower = tls_cluster.node(info["isr"][1])
    before = log_end(follower)
    pull = encode_frame(PULL, {"topic": "t", "partition": 0, "offset": 0})
    answer = raw_exchange(leader.ports["RPC"], pull)
    # No frame of the protocol comes back (at most a TLS alert), and no message.
    assert frames_of(answer) == []
    assert b"m0" not in answer
    entry = [0, 0, 0, before[0], 10, before[1] + 1, 1]
    put = encode_frame(
        PUT,
        {
            "topic": "t",
            "partition": 0,
            "leader": info["leader"],
            "epoch": info["write_epoch"],
            "entry": entry,
        },
        b"\0" * 10,
    )
    raw_exchange(follower.ports["RPC"], put)
    assert log_end(follower) == before
    poll(
        lambda: any("RPC: refused a peer" in line for line in follower.process.lines),
        "the refusal logged",
    )


def test_a_peer_with_another_cas_certificate_is_refused(tls_cluster, cluster_ca):
    stranger_ca = trustme.CA()
    cert, key = write_identity(stranger_ca, cluster_ca["dir"], "stranger")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.load_verify_locations(cluster_ca["ca"])
    context.load_cert_chain(cert, key)
    leader = tls_cluster.node(tls_cluster.partition("t", 0)["leader"])
    pull = encode_frame(PULL, {"topic": "t", "partition": 0, "offset": 0})
    answer = raw_exchange(leader.ports["RPC"], pull, context)
    assert answer == b""
    # The same with the cluster CA's certificate is answered.
    member = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    member.check_hostname = False
    member.load_verify_locations(cluster_ca["ca"])
    member.load_cert_chain(cluster_ca["cert"], cluster_ca["key"])
    frames = frames_of(raw_exchange(leader.ports["RPC"], pull, member))
    assert frames and frames[0].op == REPLY


def test_without_cluster_tls_a_node_warns_what_is_exposed(tmp_path, etcd_server):
    with LocalCluster(tmp_path, etcd_server, nsqds=1) as cluster:
        assert any(
            "replication links are not authenticated or encrypted" in line
            for line in cluster.nodes[0].process.lines
        )


def test_half_the_cluster_tls_flags_is_refused_at_start(tmp_path, cluster_ca):
    nsqd = DaemonProcess(
        "nsqd",
        [f"-data-path={tmp_path}", f"-cluster-tls-cert={cluster_ca['cert']}"],
        cwd=tmp_path,
    )
    with pytest.raises(RuntimeError, match="must be given together"):
        nsqd.start()


@pytest.fixture
def secure_etcd(tmp_path):
    tls = EtcdTLS.make(tmp_path / "etcd-tls")
    with EtcdServer(tmp_path / "etcd", tls=tls) as etcd:
        etcd.enable_auth("root", "s3cret")
        yield etcd, tls


def test_a_cluster_on_an_etcd_with_tls_and_auth(tmp_path, secure_etcd):
    etcd, tls = secure_etcd
    flags = tls.daemon_flags("s3cret")
    with LocalCluster(tmp_path, etcd, nsqd_args=flags, lookupd_args=flags) as cluster:
        cluster.create_topic("t", 1, 3)
        publish_some(cluster, 10)
        old = cluster.node_leading("t", 0)
        old.kill()
        poll(lambda: cluster.node_leading("t", 0) not in (None, old), "a failover through etcd")
        assert cluster.stats()["etcd"]["reachable"] is True


@pytest.mark.parametrize("daemon", ["nsqd", "nsqlookupd"])
def test_a_wrong_etcd_password_fails_the_start_with_one_line(tmp_path, secure_etcd, daemon):
    etcd, tls = secure_etcd
    args = [
        "-tcp-address=127.0.0.1:0",
        "-http-address=127.0.0.1:0",
        f"-cluster-leadership-addresses={etcd.client_url}",
        *tls.daemon_flags("wrong"),
    ]
    if daemon == "nsqd":
        args += [f"-data-path={tmp_path}", "-rpc-port=127.0.0.1:0"]
    process = DaemonProcess(daemon, args, cwd=tmp_path)
    process.start(wait_for=("TCP",))
    started = time.monotonic()
    status = process.process.wait(15)
    assert status == 1, process.log
    assert time.monotonic() - started < 10
    fatal = [line for line in process.lines if " FATAL: " in line]
    assert len(fatal) == 1, process.log
    assert "etcd refused user 'root'" in fatal[0]
    assert "authentication failed" in fatal[0]


@pytest.fixture
def auth_server():
    with answering(ANSWERS) as server:
        yield server


def test_a_cluster_behind_auth_and_its_secret_works_and_refuses_everyone_else(
    tmp_path, etcd_server, auth_server
):
    """Every nsqd and nsqlookupd with --auth-http-address and --cluster-secret, nsqds with
    --http-auth-required: the master creates, places and fails over partitions with the
    secret; a publisher with `publish` writes; nobody else reaches the master's routes or
    the operations."""
    auth = (f"-auth-http-address=127.0.0.1:{auth_server.port}", f"-cluster-secret={CLUSTER_SECRET}")
    with LocalCluster(
        tmp_path,
        etcd_server,
        nsqd_args=(*auth, "-http-auth-required"),
        lookupd_args=auth,
        credential=CLUSTER_SECRET,
    ) as cluster:
        cluster.create_writable_topic("t", 1, 3)
        leader = cluster.node_leading("t", 0)

        def publish(node, secret: str) -> HTTPReply:
            headers = {"Authorization": f"Bearer {secret}"}
            return request(node.http_port, "POST", "/pub?topic=t&partition=0", b"m", headers)

        assert publish(leader, "sub").status == 403
        assert publish(leader, "pub").status == 200
        # The master's own calls and the nodes' reports need the secret; an admin is not it.
        for secret in (None, "admin"):
            headers = {"Authorization": f"Bearer {secret}"} if secret else {}
            reply = request(leader.http_port, "GET", "/cluster/partitions", headers=headers)
            assert reply.status == (401 if secret is None else 403), reply
            master = poll(cluster.master, "a master")
            reply = request(master.port("HTTP"), "POST", "/cluster/node/leave?node=x", b"", headers)
            assert reply.status == (401 if secret is None else 403), reply
        for secret in (None, "sub", "pub"):
            headers = {"Authorization": f"Bearer {secret}"} if secret else {}
            reply = request(
                master.port("HTTP"), "POST", "/topic/delete?topic=t&partition=**", b"", headers
            )
            assert reply.status in (401, 403), reply
        assert cluster.partition("t", 0)["leader"] == leader.node_id
        # A failover goes through the nodes' reports to the master, with the secret.
        leader.kill()
        follower = poll(
            lambda: (
                cluster.node_leading("t", 0) not in (None, leader) and cluster.node_leading("t", 0)
            ),
            "a follower leading",
        )
        poll(lambda: publish(follower, "pub").status == 200, "the new leader writable")
        offsets = json.loads(follower.http("GET", "/partition/offsets?topic=t").body)
        assert offsets["partitions"][0]["end"]["count"] == 2
        # A node stopping tells the master it leaves (/cluster/node/leave), with the secret.
        [other] = [node for node in cluster.nodes if node not in (leader, follower)]
        assert other.process.stop() == 0
        assert "leaving the cluster" in other.process.log
        deleted = request(
            master.port("HTTP"),
            "POST",
            "/topic/delete?topic=t&partition=**",
            b"",
            {"Authorization": "Bearer admin"},
        )
        assert deleted.status == 200, deleted
        # No call of the cluster's own was refused along the way.
        logs = [node.process.log for node in cluster.nodes] + [ld.log for ld in cluster.lookupds]
        refusals = ("AUTH_REQUIRED", "AUTH_FAILED", "UNAUTHORIZED", "FORBIDDEN")
        assert not any(word in log for log in logs for word in refusals), logs


def test_auth_in_cluster_mode_without_the_cluster_secret_is_refused_at_start(tmp_path):
    for name in ("nsqd", "nsqlookupd"):
        data = tmp_path / name
        data.mkdir()
        args = [
            "-auth-http-address=127.0.0.1:1",
            "-cluster-leadership-addresses=http://127.0.0.1:1",
            f"-data-path={data}" if name == "nsqd" else "-tcp-address=127.0.0.1:0",
        ]
        process = DaemonProcess(name, args).launch()
        assert process.process.wait(20) == 1
        assert "needs --cluster-secret" in process.log, process.log


def test_with_the_cluster_secret_a_replaced_disk_on_an_aged_topic_catches_up_and_rejoins(
    tmp_path, etcd_server
):
    """Old data and an emptied disk behind --cluster-secret: the replica started over on an
    empty data directory copies a log that retention already cut, and its leader's request to
    the master to admit it (`/cluster/isr/join`) carries the secret, so it rejoins the ISR;
    nothing of the cluster's own is refused, and the log starts where the leader's does."""
    secret = (f"-cluster-secret={CLUSTER_SECRET}",)
    with LocalCluster(
        tmp_path,
        etcd_server,
        nsqd_args=(*AGED_NSQD_ARGS, *secret),
        lookupd_args=secret,
        credential=CLUSTER_SECRET,
    ) as cluster:
        cluster.create_writable_topic("t", 1, 2)
        leader = cluster.node_leading("t", 0)
        [follower_id] = [n for n in cluster.partition("t", 0)["isr"] if n != leader.node_id]
        follower = cluster.node(follower_id)
        start = age_topic(cluster, "t")
        acked = publish_batch(leader, "t", "kept", 100)
        replace_disk(cluster, follower)
        poll_back_in_isr(cluster, follower, "t")
        assert log_start(follower, "t") == start
        check_replicas_identical(cluster, "t", 1)
        assert acked <= drain(leader, "t", acked)
        refusals = ("AUTH_REQUIRED", "AUTH_FAILED", "UNAUTHORIZED", "FORBIDDEN")
        logs = [node.process.log for node in cluster.nodes] + [ld.log for ld in cluster.lookupds]
        assert not any(word in log for log in logs for word in refusals), logs
