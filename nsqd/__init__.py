"""nsqd, as nsqpy builds it."""

from nsqpy import refuse_bare_name

refuse_bare_name(__name__)
