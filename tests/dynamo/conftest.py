"""``dynamo_python``: an interpreter with Dynamo and maitred installed, for the processes of a
Dynamo stack (``maitred.harness.dynamo_stack``): mocker workers, the frontend, the routers.

It is a venv of its own, built once into pytest's cache from ``pip install -e '.[dynamo]'``
and then ``pip install --no-deps ai-dynamo==1.6.1`` (one of ai-dynamo's dependencies downloads
from outside the package registries), not the project's ``.venv``: ai-dynamo-runtime pins
pydantic<=2.13.5, older than what ``.[dev]`` resolves to, and installing it there would change
what every other test runs with. Built on first use only (about a minute and some 300 MB, most
of it Dynamo's runtime library), so CI pays for it once per cache and ``.ci/run`` installs
nothing for it. ``MAITRED_DYNAMO_PYTHON`` names another interpreter to use instead. Where the
venv cannot be built the tests skip with one line; under ``CI`` they fail.
"""

import os
import subprocess
from pathlib import Path

import pytest

from tests.integrations.venvs import cached_venv

REPO = Path(__file__).resolve().parents[2]
DYNAMO_VERSION = "1.6.1"


def _unusable(python: str) -> str | None:
    done = subprocess.run(
        [python, "-c", "import dynamo.llm, dynamo.mocker, maitred.gateway.dynamo"], capture_output=True, text=True
    )
    return None if done.returncode == 0 else (done.stderr.strip().splitlines() or ["import failed"])[-1]


@pytest.fixture(scope="session")
def dynamo_python(pytestconfig) -> str:
    given = os.environ.get("MAITRED_DYNAMO_PYTHON")
    if given:
        python = given
    else:
        venv = cached_venv(
            pytestconfig,
            "dynamo-extra",
            ["-e", f"{REPO}[dynamo]"],
            then=[["--no-deps", f"ai-dynamo=={DYNAMO_VERSION}"]],
            key=REPO.joinpath("pyproject.toml").read_bytes() + DYNAMO_VERSION.encode(),
            what=f"maitred[dynamo] and ai-dynamo {DYNAMO_VERSION}",
        )
        python = str(venv / "bin" / "python")
    why = _unusable(python)
    if why is not None:
        message = f"Dynamo is not usable from {python} ({why})"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return python
