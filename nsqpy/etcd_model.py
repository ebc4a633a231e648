"""etcd v3 as its gRPC-JSON gateway answers, in memory and without I/O: the key space with
its revisions and history, transactions, leases and their TTLs, compaction and watches.

`nsqpy/etcd.py` speaks to a real etcd over HTTP; this model answers the same requests (a
path under `/v3` and its JSON body) with the same status and JSON, so that a cluster can run
on it in one process on a virtual clock, the daemons' own etcd client on top. It is held to
real etcd by one contract suite (`tests/cluster/test_etcd_model_contract.py`), which runs
every request of it against both and compares the answers, so the two cannot drift.

Time is what the caller says it is (`now`, seconds): a lease expires when a request or
`advance` comes at or after its deadline, as etcd's leader revokes it.

What it leaves out, and refuses rather than answers wrongly: authentication, nested
transactions, range compares (`range_end` in a compare), sorting, `min/max_*_revision`
filters, and historical reads of a key deleted and created again within the range asked.
"""

import base64
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["EtcdModel", "ModelWatch"]

# What the gateway answers for each refusal: the HTTP status and the gRPC code.
_INVALID_ARGUMENT = (400, 3)
_NOT_FOUND = (404, 5)
_OUT_OF_RANGE = (400, 11)
_UNIMPLEMENTED = (501, 12)
_ALREADY_EXISTS = (409, 6)

COMPACTED = "etcdserver: mvcc: required revision has been compacted"
FUTURE_REVISION = "etcdserver: mvcc: required revision is a future revision"
LEASE_NOT_FOUND = "etcdserver: requested lease not found"
DUPLICATE_KEY = "etcdserver: duplicate key given in txn request"
NO_KEY = "etcdserver: key is not provided"


class ModelRefusal(Exception):
    """A request the model answers with an error: its status, gRPC code and message."""

    def __init__(self, kind: tuple[int, int], message: str) -> None:
        super().__init__(message)
        self.status, self.code = kind
        self.message = message

    def answer(self) -> tuple[int, dict[str, Any]]:
        return self.status, {"error": self.message, "message": self.message, "code": self.code}


@dataclass
class _Version:
    """One key's value as of a revision; `value is None`: deleted then."""

    mod_revision: int
    value: bytes | None
    create_revision: int = 0
    version: int = 0
    lease: int = 0


@dataclass
class _Lease:
    ttl: int
    deadline: float
    keys: set[bytes] = field(default_factory=set)


@dataclass
class _Event:
    revision: int
    key: bytes
    version: _Version
    previous: _Version | None


class ModelWatch:
    """A watch stream: the `result` messages it has for its reader, in order (`take`)."""

    def __init__(self, key: bytes, range_end: bytes, prev_kv: bool) -> None:
        self.key = key
        self.range_end = range_end
        self.prev_kv = prev_kv
        self.messages: list[dict[str, Any]] = []
        self.canceled = False

    def take(self) -> list[dict[str, Any]]:
        messages, self.messages = self.messages, []
        return messages


class EtcdModel:
    """One etcd cluster's state, answered as its gateway answers (`handle`)."""

    def __init__(self, *, minimum_ttl: int = 2, lease_ids: Callable[[], int] | None = None) -> None:
        self.revision = 1
        self.compacted = 0
        # Every key's versions in revision order, the compacted ones gone.
        self._history: dict[bytes, list[_Version]] = {}
        self._events: list[_Event] = []
        self._leases: dict[int, _Lease] = {}
        self._watches: list[ModelWatch] = []
        self.minimum_ttl = minimum_ttl
        counter = itertools.count(7587868290000000001)
        self._lease_ids = lease_ids or (lambda: next(counter))
        self.header = {"cluster_id": "14841639068965178418", "member_id": "10276657743932975437"}
        self.raft_term = 2

    # -- the gateway --------------------------------------------------------------------

    def handle(self, path: str, body: dict[str, Any], now: float) -> tuple[int, dict[str, Any]]:
        """The answer to `POST path` with `body` at time `now`: (status, JSON). A streaming
        RPC (keepalive) answers its one message as `{"result": ...}`; a watch is `watch`."""
        self.advance(now)
        route = _ROUTES.get(path.removeprefix("/v3"))
        if route is None:
            return 404, {"error": "Not Found", "message": "Not Found", "code": 5}
        try:
            return 200, route(self, body, now)
        except ModelRefusal as refusal:
            return refusal.answer()

    def watch(self, body: dict[str, Any], now: float) -> ModelWatch:
        """`POST /v3/watch` with a create request: the stream, its first messages in it
        (created, then the history since `start_revision`, or canceled if compacted)."""
        self.advance(now)
        create = body.get("create_request", {})
        key = _bytes(create.get("key", ""))
        watch = ModelWatch(key, _bytes(create.get("range_end", "")), bool(create.get("prev_kv")))
        start = int(create.get("start_revision", 0))
        watch.messages.append({"header": self._header(), "created": True})
        if start and start < self.compacted:
            header = {**self.header, "raft_term": str(self.raft_term)}
            watch.messages.append(
                {"header": header, "canceled": True, "compact_revision": str(self.compacted)}
            )
            watch.canceled = True
            return watch
        if start:
            past = [event for event in self._events if event.revision >= start]
            events = [self._event_json(watch, event) for event in past if _in(watch, event.key)]
            if events:
                watch.messages.append({"header": self._header(), "events": events})
        self._watches.append(watch)
        return watch

    def close_watch(self, watch: ModelWatch) -> None:
        if watch in self._watches:
            self._watches.remove(watch)

    def next_deadline(self) -> float | None:
        """When the next lease expires, if any lease is held."""
        return min((lease.deadline for lease in self._leases.values()), default=None)

    def advance(self, now: float) -> None:
        """Time is `now`: leases past their deadline are revoked, each at a revision."""
        for lease_id, lease in sorted(self._leases.items(), key=lambda item: item[1].deadline):
            if lease.deadline <= now:
                self._revoke(lease_id)

    # -- kv -------------------------------------------------------------------------------

    def _range(self, body: dict[str, Any], _now: float) -> dict[str, Any]:
        for unsupported in ("sort_order", "sort_target", "min_mod_revision", "max_mod_revision"):
            if body.get(unsupported):
                raise ModelRefusal(_UNIMPLEMENTED, f"the etcd model has no {unsupported}")
        revision = int(body.get("revision", 0))
        if revision > self.revision:
            raise ModelRefusal(_OUT_OF_RANGE, FUTURE_REVISION)
        if revision and revision < self.compacted:
            raise ModelRefusal(_OUT_OF_RANGE, COMPACTED)
        found = self._read(_bytes(body.get("key", "")), _bytes(body.get("range_end", "")), revision)
        answer: dict[str, Any] = {"header": self._header()}
        limit = int(body.get("limit", 0))
        shown = found[:limit] if limit else found
        if not body.get("count_only") and shown:
            answer["kvs"] = [
                _kv_json(key, version, keys_only=bool(body.get("keys_only")))
                for key, version in shown
            ]
        if len(shown) < len(found):
            answer["more"] = True
        if found:
            answer["count"] = str(len(found))
        return answer

    def _put(self, body: dict[str, Any], _now: float) -> dict[str, Any]:
        changes = _Changes(self)
        previous = changes.put(body)
        changes.commit()
        answer: dict[str, Any] = {"header": self._header()}
        if body.get("prev_kv") and previous is not None:
            answer["prev_kv"] = _kv_json(_bytes(body["key"]), previous)
        return answer

    def _delete_range(self, body: dict[str, Any], _now: float) -> dict[str, Any]:
        changes = _Changes(self)
        deleted = changes.delete(body)
        changes.commit()
        answer: dict[str, Any] = {"header": self._header()}
        if deleted:
            answer["deleted"] = str(len(deleted))
            if body.get("prev_kv"):
                answer["prev_kvs"] = [_kv_json(key, version) for key, version in deleted]
        return answer

    def _txn(self, body: dict[str, Any], _now: float) -> dict[str, Any]:
        succeeded = all(self._compare(compare) for compare in body.get("compare", ()))
        operations = body.get("success" if succeeded else "failure", ())
        for branch in ("success", "failure"):
            _check_no_duplicates(body.get(branch, ()))
        changes = _Changes(self)
        results: list[tuple[str, Any]] = []
        for operation in operations:
            if "request_put" in operation:
                changes.put(operation["request_put"])
                results.append(("response_put", None))
            elif "request_delete_range" in operation:
                results.append(
                    ("response_delete_range", changes.delete(operation["request_delete_range"]))
                )
            elif "request_range" in operation:
                request = operation["request_range"]
                found = changes.read(
                    _bytes(request.get("key", "")), _bytes(request.get("range_end", ""))
                )
                results.append(("response_range", found))
            else:
                raise ModelRefusal(_UNIMPLEMENTED, "the etcd model has no nested transactions")
        changes.commit()
        inner = {"revision": str(self.revision)}
        responses = []
        for kind, outcome in results:
            response: dict[str, Any] = {"header": dict(inner)}
            if kind == "response_range" and outcome:
                response["kvs"] = [_kv_json(key, version) for key, version in outcome]
                response["count"] = str(len(outcome))
            if kind == "response_delete_range" and outcome:
                response["deleted"] = str(len(outcome))
            responses.append({kind: response})
        answer: dict[str, Any] = {"header": self._header()}
        if succeeded:
            answer["succeeded"] = True
        if responses:
            answer["responses"] = responses
        return answer

    def _compaction(self, body: dict[str, Any], _now: float) -> dict[str, Any]:
        revision = int(body.get("revision", 0))
        if revision > self.revision:
            raise ModelRefusal(_OUT_OF_RANGE, FUTURE_REVISION)
        if revision <= self.compacted:
            raise ModelRefusal(_OUT_OF_RANGE, COMPACTED)
        self.compacted = revision
        for key, versions in list(self._history.items()):
            # Every version older than the newest at the compaction revision goes; a
            # deletion at or before it takes the key with it.
            kept = [v for v in versions if v.mod_revision > revision]
            older = [v for v in versions if v.mod_revision <= revision]
            if older and older[-1].value is not None:
                kept.insert(0, older[-1])
            if kept:
                self._history[key] = kept
            else:
                del self._history[key]
        self._events = [event for event in self._events if event.revision > revision]
        return {"header": self._header()}

    # -- leases ---------------------------------------------------------------------------

    def _grant(self, body: dict[str, Any], now: float) -> dict[str, Any]:
        ttl = max(int(body.get("TTL", 0)), self.minimum_ttl)
        lease_id = int(body.get("ID", 0)) or self._lease_ids()
        if lease_id in self._leases:
            raise ModelRefusal(_ALREADY_EXISTS, "etcdserver: lease already exists")
        self._leases[lease_id] = _Lease(ttl, now + ttl)
        return {"header": self._header(), "ID": str(lease_id), "TTL": str(ttl)}

    def _keep_alive(self, body: dict[str, Any], now: float) -> dict[str, Any]:
        lease_id = int(body.get("ID", 0))
        answer: dict[str, Any] = {"header": self._header(), "ID": str(lease_id)}
        lease = self._leases.get(lease_id)
        if lease is not None:
            lease.deadline = now + lease.ttl
            answer["TTL"] = str(lease.ttl)
        return {"result": answer}

    def _revoke_route(self, body: dict[str, Any], _now: float) -> dict[str, Any]:
        lease_id = int(body.get("ID", 0))
        if lease_id not in self._leases:
            raise ModelRefusal(_NOT_FOUND, LEASE_NOT_FOUND)
        self._revoke(lease_id)
        return {"header": self._header()}

    def _time_to_live(self, body: dict[str, Any], now: float) -> dict[str, Any]:
        lease_id = int(body.get("ID", 0))
        lease = self._leases.get(lease_id)
        answer: dict[str, Any] = {"header": self._header(), "ID": str(lease_id)}
        if lease is None:
            answer["TTL"] = "-1"
            return answer
        answer["TTL"] = str(max(int(lease.deadline - now), 0))
        answer["grantedTTL"] = str(lease.ttl)
        if body.get("keys") and lease.keys:
            answer["keys"] = [_b64(key) for key in sorted(lease.keys)]
        return answer

    def _revoke(self, lease_id: int) -> None:
        lease = self._leases.pop(lease_id)
        changes = _Changes(self)
        for key in sorted(lease.keys):
            changes.delete({"key": _b64(key)})
        changes.commit()

    def _status(self, _body: dict[str, Any], _now: float) -> dict[str, Any]:
        """Maintenance.Status of the one member, which leads."""
        return {
            "header": self._header(),
            "version": "3.4.23",
            "leader": self.header["member_id"],
            "raftTerm": str(self.raft_term),
        }

    # -- reading and the log --------------------------------------------------------------

    def _current(self, key: bytes, revision: int = 0) -> _Version | None:
        for version in reversed(self._history.get(key, ())):
            if not revision or version.mod_revision <= revision:
                return version if version.value is not None else None
        return None

    def _read(
        self, key: bytes, range_end: bytes, revision: int = 0
    ) -> list[tuple[bytes, _Version]]:
        found = []
        for candidate in sorted(_keys_in(self._history, key, range_end)):
            version = self._current(candidate, revision)
            if version is not None:
                found.append((candidate, version))
        return found

    def _compare(self, compare: dict[str, Any]) -> bool:
        if compare.get("range_end"):
            raise ModelRefusal(_UNIMPLEMENTED, "the etcd model has no range compares")
        current = self._current(_bytes(compare.get("key", "")))
        target = compare.get("target", "VERSION")
        result = compare.get("result", "EQUAL")
        if target == "VALUE":
            if current is None:
                return False  # etcd: a value compare on a missing key always fails
            have: Any = current.value
            want: Any = _bytes(compare.get("value", ""))
        else:
            field_name, attribute = _COMPARE_FIELDS[target]
            have = getattr(current, attribute) if current is not None else 0
            want = int(compare.get(field_name, 0))
        return _COMPARE_RESULTS[result](have, want)

    def _header(self) -> dict[str, str]:
        return {**self.header, "revision": str(self.revision), "raft_term": str(self.raft_term)}

    def _event_json(self, watch: ModelWatch, event: _Event) -> dict[str, Any]:
        if event.version.value is None:
            message: dict[str, Any] = {
                "type": "DELETE",
                "kv": {"key": _b64(event.key), "mod_revision": str(event.revision)},
            }
        else:
            message = {"kv": _kv_json(event.key, event.version)}
        if watch.prev_kv and event.previous is not None:
            message["prev_kv"] = _kv_json(event.key, event.previous)
        return message

    def _committed(self, events: list[_Event]) -> None:
        self._events.extend(events)
        for watch in self._watches:
            mine = [self._event_json(watch, event) for event in events if _in(watch, event.key)]
            if mine:
                watch.messages.append({"header": self._header(), "events": mine})


class _Changes:
    """One write transaction's changes, seen by its own later operations, committed at one
    revision (none when nothing changed)."""

    def __init__(self, model: EtcdModel) -> None:
        self.model = model
        self.revision = model.revision + 1
        self.events: list[_Event] = []
        self._written: dict[bytes, _Version] = {}

    def _now(self, key: bytes) -> _Version | None:
        if key in self._written:
            written = self._written[key]
            return written if written.value is not None else None
        return self.model._current(key)

    def read(self, key: bytes, range_end: bytes) -> list[tuple[bytes, _Version]]:
        keys = set(_keys_in(self.model._history, key, range_end))
        keys.update(_keys_in(self._written, key, range_end))
        found = []
        for candidate in sorted(keys):
            version = self._now(candidate)
            if version is not None:
                found.append((candidate, version))
        return found

    def put(self, body: dict[str, Any]) -> _Version | None:
        key = _bytes(body.get("key", ""))
        if not key:
            raise ModelRefusal(_INVALID_ARGUMENT, NO_KEY)
        previous = self._now(key)
        lease = int(body.get("lease", 0))
        if body.get("ignore_lease"):
            lease = previous.lease if previous is not None else 0
        if lease and lease not in self.model._leases:
            raise ModelRefusal(_NOT_FOUND, LEASE_NOT_FOUND)
        value = _bytes(body.get("value", ""))
        if body.get("ignore_value") and previous is not None:
            value = previous.value or b""
        version = _Version(
            self.revision,
            value,
            previous.create_revision if previous is not None else self.revision,
            previous.version + 1 if previous is not None else 1,
            lease,
        )
        self._write(key, version, previous)
        return previous

    def delete(self, body: dict[str, Any]) -> list[tuple[bytes, _Version]]:
        key = _bytes(body.get("key", ""))
        deleted = self.read(key, _bytes(body.get("range_end", "")))
        for candidate, previous in deleted:
            self._write(candidate, _Version(self.revision, None), previous)
        return deleted

    def _write(self, key: bytes, version: _Version, previous: _Version | None) -> None:
        self._written[key] = version
        self.events.append(_Event(self.revision, key, version, previous))

    def commit(self) -> None:
        """The changes made at the next revision, with their leases' keys (a refusal before
        this leaves the model as it was)."""
        if not self.events:
            return
        model = self.model
        model.revision = self.revision
        leases = model._leases
        for event in self.events:
            model._history.setdefault(event.key, []).append(event.version)
            previous = event.previous
            if previous is not None and previous.lease in leases:
                leases[previous.lease].keys.discard(event.key)
            if event.version.lease:
                leases[event.version.lease].keys.add(event.key)
        model._committed(self.events)


def _check_no_duplicates(operations: Any) -> None:
    """etcd refuses a branch that writes one key twice (puts, or a put in a deleted range)."""
    puts: set[bytes] = set()
    deletes: list[tuple[bytes, bytes]] = []
    for operation in operations:
        if "request_put" in operation:
            key = _bytes(operation["request_put"].get("key", ""))
            if key in puts:
                raise ModelRefusal(_INVALID_ARGUMENT, DUPLICATE_KEY)
            puts.add(key)
        elif "request_delete_range" in operation:
            request = operation["request_delete_range"]
            deletes.append((_bytes(request.get("key", "")), _bytes(request.get("range_end", ""))))
    for key in puts:
        for start, end in deletes:
            if _keys_in({key}, start, end):
                raise ModelRefusal(_INVALID_ARGUMENT, DUPLICATE_KEY)


def _keys_in(keys: Any, key: bytes, range_end: bytes) -> list[bytes]:
    if not range_end:
        return [key] if key in keys else []
    if range_end == b"\0":
        return [candidate for candidate in keys if candidate >= key]
    return [candidate for candidate in keys if key <= candidate < range_end]


def _in(watch: ModelWatch, key: bytes) -> bool:
    return bool(_keys_in({key}, watch.key, watch.range_end))


def _kv_json(key: bytes, version: _Version, *, keys_only: bool = False) -> dict[str, Any]:
    kv: dict[str, Any] = {
        "key": _b64(key),
        "create_revision": str(version.create_revision),
        "mod_revision": str(version.mod_revision),
        "version": str(version.version),
    }
    if version.value and not keys_only:
        kv["value"] = _b64(version.value)
    if version.lease:
        kv["lease"] = str(version.lease)
    return kv


def _bytes(text: str) -> bytes:
    return base64.b64decode(text)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


_COMPARE_FIELDS = {
    "VERSION": ("version", "version"),
    "CREATE": ("create_revision", "create_revision"),
    "MOD": ("mod_revision", "mod_revision"),
    "LEASE": ("lease", "lease"),
}
_COMPARE_RESULTS: dict[str, Callable[[Any, Any], bool]] = {
    "EQUAL": lambda have, want: have == want,
    "NOT_EQUAL": lambda have, want: have != want,
    "GREATER": lambda have, want: have > want,
    "LESS": lambda have, want: have < want,
}
_ROUTES: dict[str, Callable[[EtcdModel, dict[str, Any], float], dict[str, Any]]] = {
    "/kv/range": EtcdModel._range,
    "/kv/put": EtcdModel._put,
    "/kv/deleterange": EtcdModel._delete_range,
    "/kv/txn": EtcdModel._txn,
    "/kv/compaction": EtcdModel._compaction,
    "/lease/grant": EtcdModel._grant,
    "/lease/keepalive": EtcdModel._keep_alive,
    "/lease/revoke": EtcdModel._revoke_route,
    "/kv/lease/revoke": EtcdModel._revoke_route,
    "/lease/timetolive": EtcdModel._time_to_live,
    "/kv/lease/timetolive": EtcdModel._time_to_live,
    "/maintenance/status": EtcdModel._status,
}
