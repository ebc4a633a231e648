"""nsqd's HTTP API as data: every endpoint, its parameters, and every status and error message
it may answer with (Go nsqd v1.3.0's http.go, docs/protocol.md §6, plus the Youzan endpoints nsqd
serves). The HTTP fuzzer judges responses against this table, and docs/openapi.yaml is
generated from it (`python -m fuzz.http_spec > docs/openapi.yaml`), so the two never differ.
"""

import json
import sys
from dataclasses import dataclass, field

JSON = "application/json; charset=utf-8"
TEXT = "text/plain; charset=utf-8"

# Answers any route may give, whatever the request.
NOT_FOUND = 404  # {"message":"NOT_FOUND"}: no such path
METHOD_NOT_ALLOWED = 405  # {"message":"METHOD_NOT_ALLOWED"} and an Allow header
BAD_REQUEST_TEXT = b"400 Bad Request"  # unparseable request: plain text, then close
HEADERS_TOO_LARGE_TEXT = b"431 Request Header Fields Too Large"  # over 1 MiB + 4 KiB


@dataclass(frozen=True)
class Param:
    name: str
    description: str
    schema: dict = field(default_factory=lambda: {"type": "string"})
    required: bool = False


@dataclass(frozen=True)
class Endpoint:
    method: str
    path: str  # `{opt}` marks a path parameter
    summary: str
    params: tuple[Param, ...] = ()
    body: str | None = None  # description of the request body, None: none is read
    ok: str = "empty"  # "empty", "text:OK", "json", "text", "stats", "binary"
    # status -> error messages of Go's V1 envelope {"message": ...}
    errors: dict[int, tuple[str, ...]] = field(default_factory=dict)
    documented_5xx: str = ""


TOPIC = Param("topic", "Topic name: 1..64 of `[.a-zA-Z0-9_-]`, optionally ending `#ephemeral`")
TOPIC_REQ = Param(TOPIC.name, TOPIC.description, required=True)
CHANNEL = Param("channel", "Channel name, same rules as topic names", required=True)
PARTITION = Param("partition", "Youzan: one partition of the topic (default: all)")
# A publish past --max-pub-waiting-size: `E_PUB_TOO_MUCH_WAITING pub too much waiting in the
# queue: <bytes>`.
_TOO_MUCH_WAITING = ("E_PUB_TOO_MUCH_WAITING",)
_QUERY = ("INVALID_REQUEST",)  # an unparseable query string (bad `%` escape, `;`)
# A publish refused: a cluster partition that cannot replicate, or /disable/write.
_REFUSED_WRITES = ("E_FAILED_ON_NOT_WRITABLE", "E_FAILED_ON_NOT_LEADER")

_TOPIC_ERRORS = {400: ("MISSING_ARG_TOPIC", "INVALID_ARG_TOPIC_PARTITION", *_QUERY),
                 404: ("TOPIC_NOT_FOUND",)}  # fmt: skip
_CHANNEL_ERRORS = {
    400: ("MISSING_ARG_TOPIC", "INVALID_ARG_TOPIC", "MISSING_ARG_CHANNEL", "INVALID_ARG_CHANNEL",
          "INVALID_ARG_TOPIC_PARTITION", *_QUERY),
    404: ("TOPIC_NOT_FOUND", "CHANNEL_NOT_FOUND"),
}  # fmt: skip

ENDPOINTS: tuple[Endpoint, ...] = (
    Endpoint("GET", "/ping", "Health: `OK`, or 500 with `NOK - <reason>`", ok="text:OK",
             errors={500: ()}, documented_5xx="500 plain text `NOK - <reason>` when unhealthy"),
    Endpoint("GET", "/info", "Version, addresses, ports and limits", ok="json"),
    Endpoint(
        "POST", "/pub", "Publish one message (the body)",
        (TOPIC_REQ, Param("defer", "Delay in ms, 0..max-req-timeout",
                          {"type": "integer", "minimum": 0}), PARTITION),
        body="The message, 1..max-msg-size bytes",
        ok="text:OK",
        errors={400: ("MISSING_ARG_TOPIC", "INVALID_TOPIC", "MSG_EMPTY", "INVALID_DEFER",
                      "INVALID_ARG_TOPIC_PARTITION", *_REFUSED_WRITES, *_QUERY),
                404: ("E_TOPIC_NOT_EXIST",), 429: _TOO_MUCH_WAITING,
                413: ("MSG_TOO_BIG",), 500: ("INTERNAL_ERROR",), 503: ("EXITING",)},
        documented_5xx="500 INTERNAL_ERROR when the write fails, 503 EXITING while stopping",
    ),
    Endpoint(
        "POST", "/put", "Deprecated alias of /pub",
        (TOPIC_REQ, Param("defer", "Delay in ms", {"type": "integer", "minimum": 0}), PARTITION),
        body="The message", ok="text:OK",
        errors={400: ("MISSING_ARG_TOPIC", "INVALID_TOPIC", "MSG_EMPTY", "INVALID_DEFER",
                      "INVALID_ARG_TOPIC_PARTITION", *_REFUSED_WRITES, *_QUERY),
                404: ("E_TOPIC_NOT_EXIST",), 429: _TOO_MUCH_WAITING,
                413: ("MSG_TOO_BIG",), 500: ("INTERNAL_ERROR",), 503: ("EXITING",)},
        documented_5xx="as /pub",
    ),
    Endpoint(
        "POST", "/mpub", "Publish many messages: lines of text, or `binary=true` MPUB framing",
        (TOPIC_REQ, Param("binary", "true/1: `[4-byte count]([4-byte size][body])*`; "
                          "false/0 or absent: newline-separated"), PARTITION),
        body="The messages", ok="text:OK",
        errors={400: ("MISSING_ARG_TOPIC", "INVALID_TOPIC", "INVALID_ARG_TOPIC_PARTITION",
                      *_REFUSED_WRITES, *_QUERY),
                404: ("E_TOPIC_NOT_EXIST",), 429: _TOO_MUCH_WAITING,
                413: ("BODY_TOO_BIG", "MSG_TOO_BIG", "BAD_BODY", "BAD_MESSAGE"),
                500: ("INTERNAL_ERROR",), 503: ("EXITING",)},
        documented_5xx="as /pub",
    ),
    Endpoint(
        "GET", "/stats", "Topics, channels, clients and memory; text unless format=json",
        (Param("format", "`json` for JSON"), Param("topic", "Only this topic"),
         Param("channel", "Only this channel"),
         Param("include_clients", "true/false (default true)"),
         Param("include_mem", "true/false (default true)"),
         Param("leaderOnly", "Youzan: only the partitions this node writes"),
         Param("needClients", "Youzan: `true` lists clients, anything else leaves them out"),
         Param("partition", "Youzan: only this partition")),
        ok="stats", errors={400: _QUERY},
    ),
    Endpoint(
        "GET", "/message/stats",
        "Youzan: how the channel stands, plain text for people",
        (TOPIC_REQ, CHANNEL, PARTITION),
        ok="text", errors={400: _CHANNEL_ERRORS[400], 404: ("TOPIC_NOT_FOUND",)},
    ),
    Endpoint(
        "GET", "/message/historystats",
        "Youzan: a partition's published bytes per hour (22 hours), or every partition's last "
        "hour",
        (Param("topic", "Topic name"), PARTITION),
        ok="json", errors={400: ("INVALID_REQUEST",), 404: ("E_TOPIC_NOT_EXIST",)},
    ),
    Endpoint(
        "GET", "/coordinator/stats",
        "Youzan: a cluster node's partitions of a topic with their ISR and catch-up nodes",
        (Param("topic", "Topic name"), PARTITION),
        ok="json", errors={400: ("INVALID_REQUEST",), 500: ("Coordinator is disabled.",)},
        documented_5xx="500 `Coordinator is disabled.` outside a cluster",
    ),
    Endpoint(
        "GET", "/serverstats",
        "Youzan: version, health, start time and publishes refused for a write the disk refused",
        ok="json",
    ),
    Endpoint(
        "POST", "/topic/create", "Create a topic (Youzan: `partition_num` partitions)",
        (TOPIC_REQ, Param("partition_num", "Youzan: 1..255 partitions"),
         Param("partition", "Youzan: create this one partition, 0..254"),
         Param("orderedmulti", "Youzan: `true` for an ordered topic"),
         Param("ext", "Youzan: `true` for an ext topic")),
        errors={400: ("MISSING_ARG_TOPIC", "INVALID_TOPIC", "INVALID_ARG_TOPIC_PARTITION_NUM",
                      "INVALID_ARG_TOPIC_PARTITION", *_QUERY)},
    ),
    Endpoint("POST", "/topic/delete", "Delete a topic and its channels", (TOPIC_REQ, PARTITION),
             errors=_TOPIC_ERRORS),
    Endpoint("POST", "/topic/empty", "Drop every queued message of a topic",
             (TOPIC_REQ, PARTITION),
             errors={400: ("MISSING_ARG_TOPIC", "INVALID_TOPIC", "INVALID_ARG_TOPIC_PARTITION",
                           *_QUERY), 404: ("TOPIC_NOT_FOUND",), 500: ("INTERNAL_ERROR",)},
             documented_5xx="500 INTERNAL_ERROR when the queue files cannot be removed"),
    Endpoint("POST", "/topic/pause", "Pause a topic", (TOPIC_REQ, PARTITION),
             errors=_TOPIC_ERRORS),
    Endpoint("POST", "/topic/unpause", "Unpause a topic", (TOPIC_REQ, PARTITION),
             errors=_TOPIC_ERRORS),
    Endpoint("POST", "/channel/create", "Create a channel of an existing topic",
             (TOPIC_REQ, CHANNEL, PARTITION),
             errors={400: (*_CHANNEL_ERRORS[400], "E_FAILED_ON_NOT_LEADER"),
                     404: ("TOPIC_NOT_FOUND",)}),
    Endpoint("POST", "/channel/delete", "Delete a channel", (TOPIC_REQ, CHANNEL, PARTITION),
             errors={**_CHANNEL_ERRORS,
                     400: (*_CHANNEL_ERRORS[400], "E_FAILED_ON_NOT_LEADER")}),
    Endpoint("POST", "/channel/empty", "Drop every queued message of a channel",
             (TOPIC_REQ, CHANNEL, PARTITION),
             errors={**_CHANNEL_ERRORS, 500: ("INTERNAL_ERROR",)},
             documented_5xx="500 INTERNAL_ERROR when the queue files cannot be removed"),
    Endpoint("POST", "/channel/emptydelayed",
             "Youzan: drop a log topic's channel's messages in its partition's delay queue",
             (TOPIC_REQ, CHANNEL, PARTITION),
             errors={**_CHANNEL_ERRORS,
                     400: (*_CHANNEL_ERRORS[400], "E_FAILED_ON_NOT_LEADER")}),
    Endpoint("POST", "/channel/requeuedelayed",
             "Deliver a channel's delayed messages now: those deferred in memory and those in "
             "a log topic's delay queue",
             (TOPIC_REQ, CHANNEL, PARTITION),
             errors={**_CHANNEL_ERRORS,
                     400: (*_CHANNEL_ERRORS[400], "E_FAILED_ON_NOT_LEADER")}),
    Endpoint("POST", "/channel/finishmemdelayed",
             "Youzan: finish the messages a channel defers in memory",
             (TOPIC_REQ, CHANNEL, PARTITION),
             errors={**_CHANNEL_ERRORS,
                     400: (*_CHANNEL_ERRORS[400], "E_FAILED_ON_NOT_LEADER")}),
    Endpoint("POST", "/message/finish",
             "Youzan: finish one message of a channel, in flight, deferred or delayed",
             (TOPIC_REQ, CHANNEL, PARTITION,
              Param("msgid", "Youzan's decimal message ID (the 16 hex digits' value)"),
              Param("id", "The message ID's 16 hex digits, when `msgid` is not given")),
             errors={**_CHANNEL_ERRORS,
                     400: (*_CHANNEL_ERRORS[400], "E_FAILED_ON_NOT_LEADER"),
                     500: ("Message ID not in flight",)},
             documented_5xx="500 `Message ID not in flight` when the channel holds no such "
                            "message (Youzan's answer)"),
    Endpoint("PUT", "/delayqueue/enable",
             "Youzan: turn the delay queue on (`enable=true`); always on here",
             (Param("enable", "`true`"),), errors={400: _QUERY}),
    Endpoint("POST", "/channel/setmaxattempts",
             "A channel's attempt limit: a message delivered that many times goes to the "
             "channel's dead-letter topic (0: none; empty: `--max-attempts` again)",
             (TOPIC_REQ, CHANNEL, PARTITION,
              Param("max_attempts", "0..65535, or empty", required=True)),
             errors={**_CHANNEL_ERRORS,
                     400: (*_CHANNEL_ERRORS[400], "MISSING_ARG_MAX_ATTEMPTS",
                           "INVALID_ARG_MAX_ATTEMPTS")}),
    Endpoint("POST", "/channel/replaydeadletters",
             "Put a channel's dead letters (its dead-letter topic's `replay` channel) back "
             "into it, as new messages",
             (TOPIC_REQ, CHANNEL, PARTITION),
             errors={**_CHANNEL_ERRORS,
                     400: (*_CHANNEL_ERRORS[400], "E_FAILED_ON_NOT_LEADER")}),
    Endpoint("POST", "/channel/pause", "Pause a channel", (TOPIC_REQ, CHANNEL, PARTITION),
             errors=_CHANNEL_ERRORS),
    Endpoint("POST", "/channel/unpause", "Unpause a channel", (TOPIC_REQ, CHANNEL, PARTITION),
             errors=_CHANNEL_ERRORS),
    Endpoint("POST", "/channel/skip",
             "Youzan: the channel moves to the end, drops its delayed messages and what is "
             "published until it is unskipped",
             (TOPIC_REQ, CHANNEL, PARTITION),
             errors={**_CHANNEL_ERRORS,
                     400: (*_CHANNEL_ERRORS[400], "E_FAILED_ON_NOT_LEADER")}),
    Endpoint("POST", "/channel/unskip",
             "Youzan: the channel moves to the end and delivers what is published again",
             (TOPIC_REQ, CHANNEL, PARTITION),
             errors={**_CHANNEL_ERRORS,
                     400: (*_CHANNEL_ERRORS[400], "E_FAILED_ON_NOT_LEADER")}),
    Endpoint("POST", "/channel/setorder",
             "Youzan: the channel delivers in order (`order=true`) or FIFO (`order=false`)",
             (TOPIC_REQ, CHANNEL, PARTITION, Param("order", "`true` or `false`", required=True)),
             errors={**_CHANNEL_ERRORS,
                     400: (*_CHANNEL_ERRORS[400], "E_FAILED_ON_NOT_LEADER", "INVALID_OPTION")}),
    Endpoint("POST", "/channel/fixconfirmed",
             "Youzan: a log topic's channel reads again from its confirmed position what it "
             "neither holds nor has acknowledged",
             (TOPIC_REQ, CHANNEL, PARTITION),
             errors={**_CHANNEL_ERRORS,
                     400: (*_CHANNEL_ERRORS[400], "E_FAILED_ON_NOT_LEADER")}),
    Endpoint("POST", "/channel/ratelimit",
             "Youzan: the channel delivers bodies over 1 KiB at most `ratekilobytes` KiB/s "
             "(0 or less: the daemon's `--channel-ratelimit-kb`)",
             (TOPIC_REQ, CHANNEL, PARTITION,
              Param("ratekilobytes", "KiB per second", required=True)),
             errors={**_CHANNEL_ERRORS,
                     400: (*_CHANNEL_ERRORS[400], "E_FAILED_ON_NOT_LEADER", "INVALID_OPTION")}),
    Endpoint("POST", "/channel/setclientlimit",
             "Youzan: the consumers whose address starts with `client_prefix` have at most "
             "`ready` messages in flight",
             (TOPIC_REQ, CHANNEL, PARTITION,
              Param("ready", "Messages in flight at most", required=True),
              Param("client_prefix", "Start of the consumers' `host:port` (empty: all)")),
             errors={**_CHANNEL_ERRORS,
                     400: (*_CHANNEL_ERRORS[400], "E_FAILED_ON_NOT_LEADER", "INVALID_OPTION")}),
    Endpoint("GET", "/config/{opt}", "One option's value, by its config-file name",
             (Param("opt", "Option name, e.g. `log_level`", required=True),),
             ok="config", errors={400: ("INVALID_OPTION",)}),
    Endpoint("PUT", "/config/{opt}",
             "Change `nsqlookupd_tcp_addresses` (JSON array of strings) or `log_level`",
             (Param("opt", "`nsqlookupd_tcp_addresses` or `log_level`", required=True),),
             body="The new value", ok="config",
             errors={400: ("INVALID_OPTION", "INVALID_VALUE"), 413: ("INVALID_VALUE",)}),
    Endpoint("POST", "/debug/freememory", "Run a garbage collection"),
    Endpoint(
        "GET", "/debug/connections",
        "Client connections served and connection objects still alive (every worker's)",
        ok="json",
    ),
    Endpoint("GET", "/metrics", "Prometheus text format", ok="text"),
    Endpoint(
        "POST", "/pubtrace", "Youzan: publish with a trace id; JSON reply with id and offset",
        (Param("topic", "Topic name", required=True), PARTITION,
         Param("trace_id", "Decimal uint64", required=True)),
        body="The message", ok="json",
        errors={400: ("MSG_EMPTY", "INVALID_TRACE_ID", "MISSING_ARG_TOPIC",
                      "INVALID_ARG_TOPIC_PARTITION", *_REFUSED_WRITES, *_QUERY),
                404: ("E_TOPIC_NOT_EXIST",), 429: _TOO_MUCH_WAITING, 413: ("MSG_TOO_BIG",),
                503: ("EXITING",)},
        documented_5xx="503 EXITING while stopping",
    ),
    Endpoint(
        "POST", "/pub_ext",
        "Youzan: publish to an ext topic with a JSON header (`ext`, and `X-Nsqext-<Key>` request"
        " headers under lower-cased keys); `OK`, or the traced JSON reply when the header has"
        " `##trace_id`",
        (Param("topic", "Topic name", required=True), PARTITION,
         Param("ext", "The JSON header, URL-encoded", required=True)),
        body="The message", ok="text",
        errors={400: ("MSG_EMPTY", "E_INVALID_JSON_HEADER", "INVALID_TRACE_ID",
                      "E_EXT_NOT_SUPPORT", "MISSING_ARG_TOPIC", "INVALID_ARG_TOPIC_PARTITION",
                      *_REFUSED_WRITES, *_QUERY),
                404: ("E_TOPIC_NOT_EXIST",), 429: _TOO_MUCH_WAITING, 413: ("MSG_TOO_BIG",),
                503: ("EXITING",)},
        documented_5xx="503 EXITING while stopping",
    ),
    Endpoint("POST", "/disable/write", "Youzan: refuse writes (`all`, `ordered`) or allow them",
             (Param("type", "`all`, `ordered`, anything else re-enables writes"),),
             errors={400: _QUERY}),
    Endpoint("POST", "/channel/setoffset",
             "Youzan: a log topic's channel delivers from a consume offset on",
             (TOPIC_REQ, CHANNEL, PARTITION),
             body="`timestamp:<unix s>`, `virtual_queue:<offset>`, `msgcount:<n>` or `special:-1`",
             errors={**_CHANNEL_ERRORS, 406: ("MSG_EMPTY",), 400: (), 500: ()},
             documented_5xx="500 with the reason when the position cannot be served"),
    Endpoint("POST", "/topic/cleanunused",
             "Youzan: a cluster node removes its logs of partitions the cluster gives to other "
             "nodes or no longer has (`dryrun=false`; otherwise it only logs which)",
             (Param("topic", "Topic name"), PARTITION,
              Param("checkall", "`true`: every topic directory of the data path"),
              Param("dryrun", "`false` removes; anything else only logs")),
             errors={400: ("INVALID_REQUEST",), 500: ()},
             documented_5xx="500 with the reason when a file cannot be removed"),
    Endpoint("POST", "/topic/fixdata",
             "Youzan: check a partition's log against its commit-log index (every group with "
             "`checkcorrupt=true`, else the first and the last) and repair what is wrong: from "
             "another replica's copy in a cluster, else a corrupt tail is cut off and a corrupt "
             "group skipped",
             (TOPIC_REQ, PARTITION,
              Param("checkcorrupt", "`true`: every group from the retained start")),
             errors={**_TOPIC_ERRORS, 500: ()},
             documented_5xx="500 with the reason when the files cannot be read or written"),
    Endpoint("POST", "/topic/greedyclean",
             "Youzan: remove every segment of a log topic all its channels consumed",
             (TOPIC_REQ, PARTITION), errors={**_TOPIC_ERRORS, 500: ()},
             documented_5xx="500 with the reason when a file cannot be removed"),
    Endpoint("GET", "/partition/offsets",
             "nsqpy: each local partition's retained start, committed end and leader",
             (TOPIC_REQ, PARTITION), ok="json",
             errors={400: ("MISSING_ARG_TOPIC", "INVALID_ARG_TOPIC_PARTITION", "NOT_A_LOG_TOPIC",
                           *_QUERY),
                     404: ("TOPIC_NOT_FOUND",)}),
    Endpoint("GET", "/partition/search",
             "nsqpy: a position by unix time, by message count or by virtual offset",
             (TOPIC_REQ, PARTITION, Param("timestamp", "Unix seconds"),
              Param("count", "Messages before the position"),
              Param("offset", "A virtual offset: the first record boundary at or after it")),
             ok="json",
             errors={400: ("MISSING_ARG_TOPIC", "MISSING_ARG_PARTITION",
                           "INVALID_ARG_TOPIC_PARTITION", "NOT_A_LOG_TOPIC",
                           "INVALID_ARG_TIMESTAMP", "INVALID_ARG_COUNT", "INVALID_ARG_OFFSET",
                           *_QUERY),
                     404: ("TOPIC_NOT_FOUND",)}),
    Endpoint("GET", "/cluster/partitions",
             "nsqpy, cluster mode: every cluster partition this node holds, its role,"
             " writability, log start and end, channels (what the master nsqlookupd reads)",
             ok="json", errors={400: _QUERY}),
    Endpoint("POST", "/cluster/leader/handover",
             "nsqpy, cluster mode: a planned leader transfer's first half, asked by the master",
             (TOPIC_REQ, Param("partition", "The partition", required=True),
              Param("to", "The ISR follower to hand over to (node ID)", required=True)),
             ok="json",
             errors={400: ("MISSING_ARG_TOPIC", "MISSING_ARG_PARTITION", "MISSING_ARG_NODE",
                           "INVALID_ARG_TOPIC_PARTITION", "NOT_A_LOG_TOPIC",
                           "E_NOT_CLUSTER the partition is not a cluster's", *_QUERY),
                     404: ("TOPIC_NOT_FOUND",), 500: ()},
             documented_5xx="500 E_TIMEOUT when the partition's writes do not drain"),
    Endpoint("POST", "/loglevel/set", "Youzan: the log level, 0 error, 1 warn, 2 info, 3 debug",
             (Param("loglevel", "Youzan's number", required=True),),
             errors={400: ("MISSING_ARG_LEVEL", "BAD_LEVEL_STRING", *_QUERY)}),
    Endpoint("GET", "/partition/fetch",
             "nsqpy: the stored records of `[offset, end)`, as written",
             (TOPIC_REQ, PARTITION, Param("offset", "Virtual offset of a record", required=True),
              Param("end", "Virtual offset to stop at"), Param("max_bytes", "Default 1 MiB"),
              Param("starts", "`true`: the body begins with each record's start, 4 bytes each "
                    "(as many as X-NSQ-Record-Starts)")),
             ok="binary",
             errors={400: ("MISSING_ARG_TOPIC", "MISSING_ARG_PARTITION",
                           "INVALID_ARG_TOPIC_PARTITION", "NOT_A_LOG_TOPIC", "INVALID_ARG_OFFSET",
                           "OFFSET_NOT_A_RECORD_BOUNDARY", *_QUERY),
                     404: ("TOPIC_NOT_FOUND",), 416: ("OFFSET_BEFORE_START",)}),
    Endpoint("GET", "/message/get",
             "Youzan: one message of a log topic's partition by count, ID, virtual offset or "
             "time",
             (TOPIC_REQ, PARTITION,
              Param("search_mode", "`count`, `id`, `virtual_offset` or `timestamp`",
                    required=True),
              Param("search_pos", "The count, decimal ID, offset or unix seconds",
                    required=True),
              Param("needext", "`true`: the ext header too"),
              Param("delayed_queue", "`true`: a channel's message in the delay queue, by ID"),
              Param("channel", "With `delayed_queue`: the channel")),
             ok="json", errors={400: (), 404: ()}),
)  # fmt: skip


def route(method: str, path: str) -> Endpoint | None:
    for endpoint in ENDPOINTS:
        if endpoint.method != method:
            continue
        if endpoint.path == path or (
            endpoint.path.endswith("{opt}") and path.startswith(endpoint.path[: -len("{opt}")])
        ):
            return endpoint
    return None


def methods_of(path: str) -> set[str]:
    found = set()
    for endpoint in ENDPOINTS:
        if endpoint.path == path or (
            endpoint.path.endswith("{opt}") and path.startswith(endpoint.path[: -len("{opt}")])
        ):
            found.add(endpoint.method)
    return found


# -- OpenAPI ---------------------------------------------------------------------------------

_OK_CONTENT = {
    "empty": ("Success, empty body", None),
    "text:OK": ("The text `OK`", {TEXT: {"schema": {"type": "string", "enum": ["OK"]}}}),
    "json": ("JSON", {JSON: {"schema": {"type": "object"}}}),
    "text": ("Text", {TEXT: {"schema": {"type": "string"}}}),
    "binary": (
        "Records `[4 size][record]...`; X-NSQ-Start-Count, X-NSQ-Next-Offset, X-NSQ-Next-Count",
        {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
    ),
    "config": (
        "The value: text for a string option (Go's RespondV1), JSON otherwise",
        {TEXT: {"schema": {"type": "string"}}, JSON: {}},
    ),
    "stats": (
        "Text report, or JSON with format=json",
        {TEXT: {"schema": {"type": "string"}}, JSON: {"schema": {"type": "object"}}},
    ),
}


_SCOPES = {
    "topic": "on the request's topic",
    "channel": "on the request's topic and channel",
    "node": "on any topic",
}


def _auth_note(method: str, path: str) -> str | None:
    """When a route answers 401/403 (nsqd's tables; docs/operations.md "Securing a cluster")."""
    from nsqpy.nsqd.http_api import CLUSTER_ROUTES, EVERY_OTHER_ROUTE, MESSAGE_ROUTES

    key = (method, path.replace("{opt}", "*"))
    if key in MESSAGE_ROUTES:
        permission, scope = MESSAGE_ROUTES[key]
        return f"With --auth-http-address: needs `{permission}` {_SCOPES[scope]}"
    if key in EVERY_OTHER_ROUTE:
        permission, scope = EVERY_OTHER_ROUTE[key]
        return f"With --http-auth-required: needs `{permission}` {_SCOPES[scope]}"
    if key in CLUSTER_ROUTES:
        return (
            "With --cluster-secret: only the cluster's own callers carrying it (without one,"
            " `admin` under --http-auth-required)"
        )
    return None


def openapi() -> dict:
    paths: dict[str, dict] = {}
    for endpoint in ENDPOINTS:
        operation: dict = {"summary": endpoint.summary}
        auth_note = _auth_note(endpoint.method, endpoint.path)
        if auth_note is not None:
            operation["description"] = (
                f"{auth_note}: the credential is `Authorization: Bearer <secret>`, asked of"
                " the auth servers; refusals are 401 and 403."
            )
        parameters = []
        for param in endpoint.params:
            parameters.append(
                {
                    "name": param.name,
                    "in": "path" if param.name == "opt" else "query",
                    "required": param.required or param.name == "opt",
                    "description": param.description,
                    "schema": param.schema,
                }
            )
        if parameters:
            operation["parameters"] = parameters
        if endpoint.body is not None:
            operation["requestBody"] = {
                "description": endpoint.body,
                "content": {"application/octet-stream": {"schema": {"type": "string"}}},
            }
        description, content = _OK_CONTENT[endpoint.ok]
        responses: dict = {"200": {"description": description}}
        if content:
            responses["200"]["content"] = content
        for status, messages in sorted(endpoint.errors.items()):
            if endpoint.path == "/ping":
                responses[str(status)] = {
                    "description": endpoint.documented_5xx,
                    "content": {TEXT: {"schema": {"type": "string"}}},
                }
                continue
            responses[str(status)] = {
                "description": "Go's V1 error envelope",
                "content": {
                    JSON: {
                        "schema": {
                            "$ref": "#/components/schemas/Error",
                        },
                        "examples": {m: {"value": {"message": m}} for m in messages},
                    }
                },
            }
        responses["404"] = responses.get("404") or {"$ref": "#/components/responses/NotFound"}
        responses["405"] = {"$ref": "#/components/responses/MethodNotAllowed"}
        if auth_note is not None:
            responses["401"] = {"$ref": "#/components/responses/Unauthenticated"}
            responses["403"] = responses.get("403") or {"$ref": "#/components/responses/Forbidden"}
        operation["responses"] = responses
        paths.setdefault(endpoint.path, {})[endpoint.method.lower()] = operation
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "nsqd HTTP API",
            "version": "1.3.0",
            "description": (
                "nsqpy's nsqd, wire compatible with Go nsqd v1.3.0 (docs/protocol.md §6). "
                "Every error "
                'is Go\'s V1 envelope `{"message": "TEXT"}` with the status shown; every '
                "response carries `X-Nsq-Content-Type: nsq; version=1.0` except /ping, /metrics "
                "and the bare 400/431 answers to requests that cannot be parsed (plain text, "
                "then the connection is closed: `400 Bad Request`, and `431 Request Header "
                "Fields Too Large` past 1 MiB + 4 KiB of request line and headers). A request "
                "whose Content-Length is over the route's limit is answered from its headers "
                "(413) and the connection closed. Generated from fuzz/http_spec.py, which the "
                "HTTP fuzzer checks every response against."
            ),
        },
        "paths": paths,
        "components": {
            "schemas": {
                "Error": {
                    "type": "object",
                    "required": ["message"],
                    "properties": {"message": {"type": "string"}},
                }
            },
            "responses": {
                "NotFound": {
                    "description": "No such path (`NOT_FOUND`) or, where listed, no such object",
                    "content": {JSON: {"schema": {"$ref": "#/components/schemas/Error"}}},
                },
                "MethodNotAllowed": {
                    "description": "`METHOD_NOT_ALLOWED`, with an `Allow` header",
                    "content": {JSON: {"schema": {"$ref": "#/components/schemas/Error"}}},
                },
                "Unauthenticated": {
                    "description": (
                        "`AUTH_REQUIRED` (no credential; with `WWW-Authenticate: Bearer`),"
                        " `AUTH_FAILED` (no auth server answered usably) or `UNAUTHORIZED`"
                        " (the answer granted nothing)"
                    ),
                    "content": {JSON: {"schema": {"$ref": "#/components/schemas/Error"}}},
                },
                "Forbidden": {
                    "description": "`FORBIDDEN`: the credential lacks what the route needs",
                    "content": {JSON: {"schema": {"$ref": "#/components/schemas/Error"}}},
                },
            },
        },
    }


def _yaml(value, indent: int = 0) -> list[str]:
    """A small YAML emitter for the OpenAPI document (dicts, lists, strings, numbers, bools);
    strings are written as JSON strings, which YAML reads as double-quoted scalars."""
    pad = "  " * indent
    lines: list[str] = []
    if isinstance(value, dict):
        for key, item in value.items():
            plain = key.replace("_", "").replace("-", "").isalnum() and not key.isdigit()
            name = key if plain else json.dumps(key)
            if isinstance(item, dict | list) and item:
                lines.append(f"{pad}{name}:")
                lines.extend(_yaml(item, indent + 1))
            else:
                lines.append(f"{pad}{name}: {_scalar(item)}")
    else:
        for item in value:
            if isinstance(item, dict | list) and item:
                sub = _yaml(item, indent + 1)
                lines.append(f"{pad}- {sub[0].lstrip()}")
                lines.extend(sub[1:])
            else:
                lines.append(f"{pad}- {_scalar(item)}")
    return lines


def _scalar(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, dict):
        return "{}"
    if isinstance(value, list):
        return "[]"
    return json.dumps(value, ensure_ascii=False)


def openapi_yaml() -> str:
    header = "# Generated by `python -m fuzz.http_spec > docs/openapi.yaml`; do not edit by hand.\n"
    return header + "\n".join(_yaml(openapi())) + "\n"


if __name__ == "__main__":
    sys.stdout.write(openapi_yaml())
