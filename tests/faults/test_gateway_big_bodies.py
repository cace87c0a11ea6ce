"""One large request does not stall the gateway's other clients: the slowest ``/healthz`` while
a 15 MB event batch is parsed and applied, against the slowest of a baseline in the same run
(``maitred.harness.stall``). A real ``maitred serve`` process on 127.0.0.1."""

import subprocess
import sys

from maitred.bind import wait_http
from maitred.harness.background import free_port
from maitred.harness.stall import events_body, measure_stall

#: Before, the batch froze /healthz for 320x (0.57 s against 1.8 ms) its slowest baseline
#: answer; parsed off the loop and applied in slices, 0.6-10x.
MAX_RATIO = 30


def test_a_large_event_batch_does_not_stall_other_clients():
    port = free_port()
    command = [sys.executable, "-m", "maitred", "serve", "--port", str(port), "--no-db", "--log-level", "warning"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_http(url + "/healthz", timeout_s=60, process=process)
        body = events_body()
        stall = measure_stall(url, "/v1/events", body, baseline=400)
    finally:
        process.terminate()
        process.wait(30)
    print("STALL", stall.figures())
    assert stall.status == 200
    assert stall.ratio < MAX_RATIO, stall.figures()
