FROM python:3.11-slim

WORKDIR /opt/nsqpy
COPY pyproject.toml README.md ./
# The `nsqpy` root package, the Spark connector and the pytest plugin (its fixtures start
# nsqd/nsqlookupd in-process).
COPY nsqpy ./nsqpy
COPY common ./common
COPY diskqueue ./diskqueue
COPY partition_log ./partition_log
COPY nsqd ./nsqd
COPY nsqlookupd ./nsqlookupd
COPY nsqadmin ./nsqadmin
COPY tools ./tools
RUN pip install --no-cache-dir .

# The daemons run as an unprivileged user that owns only nsqd's data directory.
RUN groupadd --system --gid 10001 nsq \
    && useradd --system --uid 10001 --gid nsq --home-dir /data --no-create-home nsq \
    && mkdir /data \
    && chown nsq:nsq /data
# nsqd's messages and nsqd.dat outlive the container: mount a named volume or a host folder here.
VOLUME /data
WORKDIR /data
USER nsq

# nsqd TCP/HTTP/HTTPS, nsqlookupd TCP/HTTP, nsqadmin HTTP
EXPOSE 4150 4151 4152 4160 4161 4171
# Other containers reach nsqd at the address it registers with nsqlookupd: give it a
# `--broadcast-address` they can resolve (compose.yaml uses the service name). Without one it
# would register the container's random hostname.
CMD ["nsqd", "--data-path=/data"]
