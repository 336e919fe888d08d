"""Tests: newcomer."""
