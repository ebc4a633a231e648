FROM python:3.11-slim

WORKDIR /opt/nsqpy
COPY pyproject.toml README.md ./
COPY common ./common
COPY diskqueue ./diskqueue
COPY nsqd ./nsqd
COPY nsqlookupd ./nsqlookupd
COPY nsqadmin ./nsqadmin
COPY tools ./tools
# The pytest plugin the package declares (its fixtures start nsqd/nsqlookupd in-process).
COPY nsqpy_pytest ./nsqpy_pytest
RUN pip install --no-cache-dir .

# nsqd TCP/HTTP/HTTPS, nsqlookupd TCP/HTTP, nsqadmin HTTP
EXPOSE 4150 4151 4152 4160 4161 4171
WORKDIR /data
CMD ["nsqd"]
