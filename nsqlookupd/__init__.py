"""nsqlookupd, as nsqpy builds it."""
