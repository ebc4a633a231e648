"""nsqd, as nsqpy builds it."""
