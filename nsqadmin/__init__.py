"""nsqadmin, as nsqpy builds it."""
