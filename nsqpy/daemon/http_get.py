"""The daemons' few blocking HTTP GETs of another NSQ daemon's JSON (nsqd asking nsqlookupd
for a topic's channels, or its auth server for a client's rights), run in worker threads.

`urllib.request` is imported on the first such request: with `http.client` and `email` it is
2 MiB resident that an nsqd with neither lookupd nor auth never needs.
"""

import json
from typing import Any

# The Accept header Go's http_api.Client sends: a v1 daemon answers the bare JSON.
NSQ_V1_ACCEPT = "application/vnd.nsq; version=1.0"


def get_json(url: str, timeout: float) -> tuple[int, Any]:
    """The status and the decoded body of `GET url`. OSError (urllib's URLError and HTTPError
    among them) when it cannot be had, ValueError when the body is not JSON."""
    import urllib.request

    request = urllib.request.Request(url, headers={"Accept": NSQ_V1_ACCEPT})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return response.status, json.loads(response.read())
