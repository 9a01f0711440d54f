"""Benchmarks, run by hand; not part of the test suite."""
