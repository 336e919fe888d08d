"""Tests: replication."""
