"""A worker that joins after the component started: Dynamo's discovery announces it, the
component adds it to the core's workers, reads its capacity from its card, and places programs
on it; one that leaves is declared down and its programs go elsewhere."""

import time
from contextlib import ExitStack

import pytest

from maitred.harness.dynamo_stack import MockerSpec, start_stack
from tests.dynamo.helpers import chat, decided, metric, words

pytestmark = pytest.mark.timeout(1500)


def _until(condition, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def test_a_worker_that_joins_later_takes_programs_and_one_that_leaves_gives_them_back(dynamo_python, tmp_path):
    with ExitStack() as es:
        stack = start_stack("maitred", dynamo_python, tmp_path, es, mocker=MockerSpec(workers=1))
        admin = stack.admin_url
        assert admin is not None
        first = decided(chat(stack.url, [{"role": "user", "content": words(1, 50)}], session="before"))["worker_id"]
        assert metric(admin, "maitred_workers_healthy") == 1
        joined = stack.add_worker(es)
        _until(lambda: metric(admin, "maitred_workers_healthy") == 2, "the new worker never became healthy")
        placed = {
            decided(chat(stack.url, [{"role": "user", "content": words(i, 50)}], session=f"after-{i}"))["worker_id"]
            for i in range(6)
        }
        assert len(placed) == 2  # new programs went to both workers
        second = (placed - {first}).pop()
        moved = next(
            f"after-{i}"
            for i in range(6)
            if decided(chat(stack.url, [{"role": "user", "content": "ok"}], session=f"after-{i}"))["worker_id"] == second
        )
        joined.stop()
        _until(lambda: metric(admin, "maitred_workers_healthy") == 1, "the stopped worker was never declared down")
        assert decided(chat(stack.url, [{"role": "user", "content": "ok"}], session=moved))["worker_id"] == first
