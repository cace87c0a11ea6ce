"""Import paths users may have typed before the tree was reorganised fail with one line naming the new one."""

import subprocess
import sys

import pytest


@pytest.mark.parametrize("module", ["maitred.runtime.service.serve", "maitred.runtime.service.simworker"])
def test_an_old_module_path_names_the_new_one_in_one_line(module):
    done = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "maitred.gateway.serve" in lines[0] and "maitred.sim.worker" in lines[0], done.stderr


@pytest.mark.parametrize(
    ("old", "new"), [("maitred.runtime.service.loop", "maitred.gateway"), ("maitred.integrations.local", "maitred.harness.local")]
)
def test_an_old_import_raises_an_import_error_naming_the_new_module(old, new):
    done = subprocess.run([sys.executable, "-c", f"import {old}"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and f"ImportError: {old.rsplit('.', 1)[0] if 'service' in old else old} moved" in done.stderr
    assert new in done.stderr.strip().splitlines()[-1]
