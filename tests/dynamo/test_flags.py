"""The component's command line refuses bad values naming the flag, before it looks for Dynamo
(so these run wherever maitred does)."""

import subprocess
import sys

import pytest

BASE = ["--endpoint", "dyn://dynamo.backend.generate", "--model-name", "m"]


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--endpoint", "backend", "--model-name", "m"], "--endpoint"),
        (["--endpoint", "dyn://dynamo.backend.generate"], "--model-name"),
        ([*BASE, "--hold-timeout", "-1"], "--hold-timeout"),
        ([*BASE, "--policy", "fastest"], "--policy"),
        ([*BASE, "--http-port", "70000"], "--http-port"),
        ([*BASE, "--min-workers", "0"], "--min-workers"),
        ([*BASE, "--model-path", "/nonexistent/model"], "--model-path"),
        ([*BASE, "--event-plane", "kafka"], "--event-plane"),
    ],
)
def test_a_bad_flag_is_refused_with_its_name(argv, flag):
    done = subprocess.run([sys.executable, "-m", "maitred.gateway.dynamo", *argv], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    error = done.stderr.strip().splitlines()[-1]
    assert flag in error and "error:" in error, done.stderr
