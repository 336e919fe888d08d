"""Tests: harness_throughput."""
