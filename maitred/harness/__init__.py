"""Harnesses for the demo, the examples, the benchmarks and the end-to-end tests: gateways and
simulated workers started on 127.0.0.1 in background threads or child processes."""
