"""The NSQ utilities and the local cluster runner behind `make run`."""

from nsqpy import refuse_bare_name

refuse_bare_name(__name__)
