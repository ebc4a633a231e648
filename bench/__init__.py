"""Reproducible benchmarks; results are kept in bench/RESULTS.md."""
