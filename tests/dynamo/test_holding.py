"""Admission under memory pressure: one mocker worker whose KV pool (``--num-gpu-blocks-override``)
holds one of two programs' contexts (with their 512-token reserves). The second program's turn
is held by maitred's component, instead of being sent to a worker that would have to evict the
first program's prefix, and goes as soon as the first program ends (before its hold bound)."""

import threading
import time
from contextlib import ExitStack

import httpx
import pytest

from maitred.harness.dynamo_stack import MockerSpec, start_stack
from tests.dynamo.helpers import chat, decided, metric, words

pytestmark = pytest.mark.timeout(1500)
#: 64 blocks of 16 tokens: 1,024 tokens of KV on the only worker.
SMALL = MockerSpec(workers=1, gpu_blocks=64, block_size=16)


def test_a_turn_that_does_not_fit_is_held_until_the_core_makes_room(dynamo_python, tmp_path):
    with ExitStack() as es:
        stack = start_stack("maitred", dynamo_python, tmp_path, es, mocker=SMALL, maitred_args=["--hold-timeout", "30"])
        assert stack.admin_url is not None
        first = decided(chat(stack.url, [{"role": "user", "content": words(1, 300)}], session="first"))
        assert first["waited_s"] == 0.0 and not first["forced"]
        held_before = metric(stack.admin_url, "maitred_held_requests_total")
        answers: list[httpx.Response] = []
        second = threading.Thread(
            target=lambda: answers.append(chat(stack.url, [{"role": "user", "content": words(2, 300)}], session="second"))
        )
        second.start()
        deadline = time.monotonic() + 30
        while metric(stack.admin_url, "maitred_held_requests_total") == held_before and time.monotonic() < deadline:
            time.sleep(0.05)
        assert metric(stack.admin_url, "maitred_held_requests_total") == held_before + 1  # held, not sent
        assert httpx.get(stack.admin_url + "/v1/programs/second", timeout=10).json()["held"] is True
        # the first program ends (x-dynamo-session-final): its room goes to the held one
        chat(stack.url, [{"role": "user", "content": "ok"}], session="first", **{"x-dynamo-session-final": "true"})
        second.join(60)
        d = decided(answers[0])
        assert d["waited_s"] > 0.0 and not d["forced"], d  # it waited for room, and got it before its bound
        stack.check()
