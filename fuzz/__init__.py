"""Fuzzing nsqd: the V2 codec (atheris or plain random bytes), the TCP protocol and the HTTP API
against a live nsqd (issue #10). `python -m fuzz.run --help` runs the long campaign; the short
seeded runs are tests/reliability/test_fuzz_tcp.py and test_fuzz_http.py."""
