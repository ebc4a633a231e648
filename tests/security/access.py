"""The credentials of the HTTP access tests: the auth server's answers for them, and which
of them holds each need."""

CLUSTER_SECRET = "the-cluster-secret"
ALL = {"topic": ".*", "channels": [".*"]}
ANSWERS = {
    "sub": {"ttl": 3600, "authorizations": [{**ALL, "permissions": ["subscribe"]}]},
    "pub": {"ttl": 3600, "authorizations": [{**ALL, "permissions": ["publish"]}]},
    "admin": {"ttl": 3600, "authorizations": [{**ALL, "permissions": ["admin"]}]},
    "nothing": {"ttl": 3600, "authorizations": []},
    "wrong": 403,
    # Only topic `t`'s channel `c`: another channel or topic is not covered.
    "narrow": {
        "ttl": 3600,
        "authorizations": [{"topic": "^t$", "channels": ["^c$"], "permissions": ["subscribe"]}],
    },
}
CREDENTIALS = {
    "none": None,
    "wrong": "wrong",
    "sub": "sub",
    "pub": "pub",
    "admin": "admin",
    "cluster": CLUSTER_SECRET,
}
# Who holds each need.
HOLDERS = {
    "open": set(CREDENTIALS),
    "subscribe": {"sub", "cluster"},
    "publish": {"pub", "cluster"},
    "admin": {"admin", "cluster"},
    "cluster": {"cluster"},
}
