"""Fault suite: kill -9, closed and hanging ports, full disk, read-only and concurrent stores, fuzzed input."""
