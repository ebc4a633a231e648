"""The tests' port picker: ports that daemons restart on never collide."""

from tests.support import ports


def test_restartable_ports_are_never_handed_out_twice():
    drawn = [ports.restartable_port() for _ in range(300)]
    assert len(set(drawn)) == len(drawn)
    assert all(ports.LOWEST <= port < ports.SPLIT for port in drawn)


def test_each_xdist_worker_draws_from_a_share_of_its_own(monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    shares = []
    for worker in ("gw0", "gw1"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        shares.append(set(ports._worker_share(ports.LOWEST, ports.SPLIT)))
        assert ports.restartable_port() in shares[-1]
    assert not shares[0] & shares[1]


def test_a_port_offset_moves_the_ports_into_the_workers_share(monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    documented = {4150, 4151, 4160, 4161, 4171}
    offset = ports.port_offset(documented)
    share = ports._worker_share(ports.SPLIT, ports._ephemeral_start())
    assert all(port + offset in share for port in documented)
