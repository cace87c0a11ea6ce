"""``GET /metrics`` as Prometheus reads it, from real gateways on 127.0.0.1 (simulated SGLang
workers behind them where model requests are sent), parsed with prometheus-client's own
parser: label values stay bounded whatever clients send, the request and time-to-first-token
histograms count every request by endpoint, and the Grafana dashboard is a valid dashboard
model whose every query names metrics and labels a real gateway exports."""

import argparse
import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from maitred.gateway.app import Gateway, ServeConfig, build_app
from maitred.gateway.live_config import LiveConfig
from maitred.gateway.model_routes import ENDPOINTS
from maitred.gateway.serve import _config, add_arguments
from maitred.harness.background import BackgroundServer
from maitred.sim.worker.app import create_app
from maitred.sim.worker.config import SimWorkerConfig
from tests.helpers import wait_until

DASHBOARD = Path(__file__).resolve().parent.parent / "examples" / "grafana" / "maitred-dashboard.json"
FAST = LiveConfig(tick_s=0.2, poll_s=0.2, hold_timeout_s=30.0, fail_after=1)
#: Labels -> value of every sample of one scrape, by sample name (``_bucket``, ``_count``, ... kept).
Samples = dict[str, dict[frozenset[tuple[str, str]], float]]


def scrape(url: str) -> Samples:
    text = httpx.get(url + "/metrics", timeout=30).text
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples.setdefault(s.name, {})[frozenset(s.labels.items())] = s.value
    return samples


def values(samples: Samples, name: str, label: str) -> dict[str, float]:
    """``name``'s samples summed by the value of ``label``."""
    out: dict[str, float] = {}
    for labels, value in samples.get(name, {}).items():
        key = dict(labels)[label]
        out[key] = out.get(key, 0.0) + value
    return out


def sample(samples: Samples, name: str, **labels: str) -> float:
    return samples.get(name, {}).get(frozenset(labels.items()), 0.0)


def serve_config(*argv: str, workers: list[str] | None = None) -> ServeConfig:
    """A gateway's configuration as ``maitred serve`` builds it from these flags."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--no-db", *argv])
    return _config(args, workers or [])


def tool_calls(program_id: str, names: list[str], *, first: int = 0) -> list[dict[str, Any]]:
    """A tool.start and a tool.end per name (call ids numbered from ``first``)."""
    now = time.time()
    events = []
    for i, name in enumerate(names, start=first):
        events.append({"type": "tool.start", "ts": now, "program_id": program_id, "call_id": f"c{i}", "tool": name})
        events.append({"type": "tool.end", "ts": now + 0.2, "program_id": program_id, "call_id": f"c{i}"})
    return events


def post_events(url: str, events: list[dict[str, Any]], batch: int = 2000) -> None:
    for start in range(0, len(events), batch):
        r = httpx.post(url + "/v1/events", json=events[start : start + batch], timeout=60)
        assert r.status_code == 200 and not r.json().get("rejected"), r.text


# -- tool names ---------------------------------------------------------------------------------


def flood(i: int) -> list[dict[str, Any]]:
    """One program of its own, a model call naming a model and worker of its own, one tool call
    of a tool of its own: everything a client can make up."""
    now, pid = time.time(), f"flood-{i}"
    base = {"ts": now, "program_id": pid}
    return [
        {**base, "type": "program.start", "framework": f"framework-{i}"},
        {**base, "type": "llm.start", "request_id": f"r{i}", "model": f"model-{i}", "prompt_tokens": 10},
        {**base, "type": "llm.end", "request_id": f"r{i}", "prompt_tokens": 10, "completion_tokens": 2, "worker": f"w{i}"},
        {**base, "type": "tool.start", "call_id": f"c{i}", "tool": f"tool-{i}"},
        {**base, "type": "tool.end", "call_id": f"c{i}", "ts": now + 0.2},
        {**base, "type": "program.end"},
    ]


def test_ten_thousand_made_up_names_add_only_the_other_tool_series_and_every_call_is_counted_once():
    popular = {"pytest": 40, "grep": 30, "Bash": 20, "Read": 12, "Edit": 8}
    with BackgroundServer(build_app(serve_config("--metrics-max-tools", "5")).app) as server:
        post_events(server.url, tool_calls("p", [name for name, n in popular.items() for _ in range(n)]))
        before = scrape(server.url)
        post_events(server.url, [e for i in range(10_000) for e in flood(i)])
        after = scrape(server.url)
        # counted from its first call, not from the counts the flood left: promoted on its 11th
        # call, when it outnumbers Edit (8) by more than a quarter; Edit's series goes
        post_events(server.url, tool_calls("p", ["Write"] * 12, first=500))
        promoted = scrape(server.url)
    assert values(before, "maitred_tool_duration_seconds_count", "tool") == popular
    assert values(after, "maitred_tool_duration_seconds_count", "tool") == {**popular, "other": 10_000}
    assert values(promoted, "maitred_tool_duration_seconds_count", "tool") == {
        **{name: n for name, n in popular.items() if name != "Edit"},
        "Write": 2,
        "other": 10_010,
    }
    assert sample(after, "maitred_events_total") == sample(before, "maitred_events_total") + 60_000
    added = {(name, labels) for name, series in after.items() for labels in series} - {
        (name, labels) for name, series in before.items() for labels in series
    }
    assert added and all(
        name.startswith("maitred_tool_duration_seconds") and dict(labels)["tool"] == "other" for name, labels in added
    ), sorted(added)


def test_a_tool_that_becomes_one_of_the_most_called_gets_its_own_series_and_no_counter_goes_back():
    with BackgroundServer(build_app(serve_config("--metrics-max-tools", "2")).app) as server:
        scrapes = []
        post_events(server.url, tool_calls("p", ["pytest"] * 4 + ["grep"] * 3))
        scrapes.append(scrape(server.url))
        post_events(server.url, tool_calls("p", ["Bash"] * 3, first=100))  # not more than grep (3 x 1.25): other
        scrapes.append(scrape(server.url))
        post_events(server.url, tool_calls("p", ["Bash"] * 7, first=200))  # its 4th call outnumbers grep: promoted
        scrapes.append(scrape(server.url))
        post_events(server.url, tool_calls("p", ["grep"], first=300))  # displaced, and short of pytest x 1.25: other
        scrapes.append(scrape(server.url))
    counts = [values(s, "maitred_tool_duration_seconds_count", "tool") for s in scrapes]
    assert counts[0] == {"pytest": 4, "grep": 3}
    assert counts[1] == {"pytest": 4, "grep": 3, "other": 3}
    assert counts[2] == {"pytest": 4, "Bash": 7, "other": 3}  # Bash's first three stay in other
    assert counts[3] == {"pytest": 4, "Bash": 7, "other": 4}
    for earlier, later in zip(scrapes, scrapes[1:]):  # a series never goes backwards while it exists
        for name in ("maitred_tool_duration_seconds_count", "maitred_tool_duration_seconds_sum"):
            for labels, value in earlier[name].items():
                assert later[name].get(labels, value) >= value, (name, dict(labels))


def test_metrics_max_tools_is_a_flag_of_serve_refused_below_zero():
    assert serve_config().metrics_max_tools == 20
    assert serve_config("--metrics-max-tools", "0").metrics_max_tools == 0
    result = subprocess.run(
        [sys.executable, "-m", "maitred.gateway.serve", "--metrics-max-tools", "-1", "--worker", "http://127.0.0.1:1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and "--metrics-max-tools" in result.stderr and "Traceback" not in result.stderr


# -- model requests -----------------------------------------------------------------------------

#: A request per endpoint the gateway serves, streamed or not (``count_tokens`` never streams).
ROUTES: dict[str, tuple[bool, ...]] = {
    "/v1/chat/completions": (False, True),
    "/v1/completions": (False, True),
    "/v1/responses": (False, True),
    "/v1/messages": (False, True),
    "/v1/messages/count_tokens": (False,),
    "/generate": (False, True),
}
ROUNDS = 3
PER_ROUND = sum(map(len, ROUTES.values()))


def timed(url: str) -> float:
    """Model requests the gateway has timed so far."""
    return sum(scrape(url).get("maitred_request_duration_seconds_count", {}).values())


def body(path: str, model: str, program_id: str, stream: bool) -> dict[str, Any]:
    text = "fix the failing test in tests/test_core.py " * 8
    bodies: dict[str, dict[str, Any]] = {
        "/v1/chat/completions": {"messages": [{"role": "user", "content": text}], "max_tokens": 8},
        "/v1/completions": {"prompt": text, "max_tokens": 8},
        "/v1/responses": {"input": text, "max_output_tokens": 8},
        "/v1/messages": {"messages": [{"role": "user", "content": text}], "max_tokens": 8},
        "/v1/messages/count_tokens": {"messages": [{"role": "user", "content": text}]},
        "/generate": {"text": text, "sampling_params": {"max_new_tokens": 8}},
    }
    out = {**bodies[path], "program_id": program_id}
    if path != "/generate":
        out["model"] = model
    if stream:
        out["stream"] = True
    return out


@dataclass
class Served:
    gateway: Gateway
    workers: list[BackgroundServer]
    first: Samples  # after the first round of requests
    last: Samples  # after all of them, a refused one, one during shutdown and a worker's failure
    names: set[str]  # every model name and program id the requests carried


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    """Two simulated workers behind a gateway; every endpoint asked ``ROUNDS`` times streamed
    and not, each request with a model name and program id of its own; then a request refused
    (400), one while the gateway shuts down (503), invalid events, tool calls, and one worker
    stopped, so that every metric the dashboard charts has samples."""
    with ExitStack() as stack:
        sims = [
            stack.enter_context(BackgroundServer(create_app(SimWorkerConfig(gpu_tokens=200_000, time_scale=50.0))))
            for _ in range(2)
        ]
        gateway = build_app(ServeConfig([s.url for s in sims], runtime=FAST, wait_for_workers_s=10))
        server = stack.enter_context(BackgroundServer(gateway.app))
        names: set[str] = set()
        first: Samples = {}
        with httpx.Client(base_url=server.url, timeout=60) as client:
            for round_ in range(ROUNDS):
                for path, streams in ROUTES.items():
                    for stream in streams:
                        model, pid = f"model-{path}-{stream}-{round_}", f"prog-{path}-{stream}-{round_}"
                        names |= {model, pid}
                        r = client.post(path, json=body(path, model, pid, stream))
                        assert r.status_code == 200, (path, stream, r.text)
                if round_ == 0:  # (a stream is timed once it has ended, just after its client read the end)
                    assert wait_until(lambda: timed(server.url) == PER_ROUND, interval=0.05)
                    first = scrape(server.url)
            refused = client.post("/v1/chat/completions", json={**body("/v1/chat/completions", "m", "p", False), "stream": 1})
            assert refused.status_code == 400, refused.text
            post_events(server.url, tool_calls("prog-tools", ["pytest", "grep", "pytest"]))
            client.post("/v1/events", json=[{"type": "tool.start", "ts": time.time(), "program_id": "x"}])
            gateway.runtime.shutting_down = True
            assert client.post("/v1/chat/completions", json=body("/v1/chat/completions", "m", "p", False)).status_code == 503
            gateway.runtime.shutting_down = False
            sims[1].stop()
            down = sims[1].url
            assert wait_until(lambda: sample(scrape(server.url), "maitred_worker_failures_total", worker=down) == 1, interval=0.1)
            last = scrape(server.url)
        yield Served(gateway, sims, first, last, names)


def test_each_endpoints_duration_and_ttft_histograms_count_the_requests_sent(served):
    for path, streams in ROUTES.items():
        endpoint = ENDPOINTS[path].name
        for stream in streams:
            flag = "true" if stream else "false"
            duration = sample(
                served.last, "maitred_request_duration_seconds_count", endpoint=endpoint, status_class="2xx", stream=flag
            )
            assert duration == ROUNDS, (endpoint, flag)
            ttft = sample(served.last, "maitred_ttft_seconds_count", endpoint=endpoint, stream=flag)
            assert ttft == (ROUNDS if ENDPOINTS[path].generates else 0), (endpoint, flag)  # count_tokens generates nothing
            assert sample(served.last, "maitred_requests_total", endpoint=endpoint, outcome="ok") == ROUNDS * len(streams)


def test_refused_and_shutdown_answers_are_timed_under_their_status_class(served):
    chat = {"endpoint": "chat", "stream": "false"}
    assert sample(served.last, "maitred_request_duration_seconds_count", status_class="4xx", **chat) == 1
    assert sample(served.last, "maitred_request_duration_seconds_count", status_class="5xx", **chat) == 1
    classes = {dict(k)["status_class"] for k in served.last["maitred_request_duration_seconds_count"]}
    assert classes == {"2xx", "4xx", "5xx"}


def test_worker_failures_start_at_zero_per_worker_and_count_the_one_that_stopped(served):
    up, down = (w.url for w in served.workers)
    assert values(served.first, "maitred_worker_failures_total", "worker") == {up: 0, down: 0}
    assert values(served.last, "maitred_worker_failures_total", "worker") == {up: 0, down: 1}


def test_the_duration_histograms_buckets_span_milliseconds_to_half_an_hour(served):
    chat = {"endpoint": "chat", "status_class": "2xx", "stream": "false"}
    buckets = {
        float(labels["le"]): value
        for key, value in served.last["maitred_request_duration_seconds_bucket"].items()
        if chat.items() <= (labels := dict(key)).items()
    }
    assert min(buckets) <= 0.001 and 1800 in buckets and buckets[float("inf")] == buckets[1800] == ROUNDS


def test_model_names_and_program_ids_never_become_label_values(served):
    """Each request carried a model name and a program id never seen before: none is a label
    value, and the later rounds added no series to what the first round made."""
    labels = {v for series in served.last.values() for key in series for _, v in key}
    assert not labels & served.names

    def answered(samples: Samples, name: str) -> set[frozenset[tuple[str, str]]]:
        return {k for k in samples[name] if dict(k).get("status_class", "2xx") == "2xx" and dict(k).get("outcome", "ok") == "ok"}

    for name in ("maitred_request_duration_seconds_bucket", "maitred_ttft_seconds_bucket", "maitred_requests_total"):
        assert answered(served.first, name) == answered(served.last, name), name


# -- the Grafana dashboard ----------------------------------------------------------------------

AGGREGATION = re.compile(
    r"\b(?:sum|min|max|avg|count|group|stddev|stdvar|topk|bottomk|quantile)\s+(by|without)\s*\(([^)]*)\)\s*\("
)
SELECTOR = re.compile(r"\b(maitred_[a-z0-9_]+)\s*(?:\{([^}]*)\})?")
MATCHER = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"(?:[^"\\]|\\.)*"\s*')


def closing(expr: str, opened: int) -> int:
    """Index of the parenthesis closing the one at ``opened``."""
    depth = 0
    for i in range(opened, len(expr)):
        depth += {"(": 1, ")": -1}.get(expr[i], 0)
        if depth == 0:
            return i
    raise AssertionError(f"unbalanced parentheses in {expr!r}")


def check_query(expr: str, exported: dict[str, set[str]]) -> set[str]:
    """The metrics ``expr`` reads, after checking each exists in the scrape (``exported``: sample
    name -> its label names) and every label it selects on or aggregates by exists on them."""
    assert expr.count("(") == expr.count(")"), expr
    assert not re.search(r"\)\s*(by|without)\s*\(", expr), f"write `sum by (...) (...)`, not a trailing by: {expr}"
    read = set()
    for match in SELECTOR.finditer(expr):
        name, matchers = match.group(1), match.group(2)
        assert name in exported, f"{name} is not on /metrics (query {expr})"
        read.add(name)
        for part in filter(str.strip, (matchers or "").split(",")):
            m = MATCHER.fullmatch(part)
            assert m is not None, f"cannot read the matcher {part!r} in {expr}"
            assert m.group(1) in exported[name], f"{name} has no label {m.group(1)!r} (query {expr})"
    for match in AGGREGATION.finditer(expr):
        inner = expr[match.end() - 1 : closing(expr, match.end() - 1) + 1]
        for label in filter(None, (s.strip() for s in match.group(2).split(","))):
            for name in (m.group(1) for m in SELECTOR.finditer(inner)):
                assert label in exported[name], f"{name} has no label {label!r} to aggregate by (query {expr})"
    for match in re.finditer(r"histogram_quantile\s*\(\s*[0-9.]+\s*,", expr):
        inner = expr[match.end() : closing(expr, match.start() + expr[match.start() :].index("("))]
        assert all(m.group(1).endswith("_bucket") for m in SELECTOR.finditer(inner)), expr
        by = AGGREGATION.search(inner)
        assert by is not None and "le" in by.group(2).replace(" ", "").split(","), f"histogram_quantile without le: {expr}"
    return read


def test_the_dashboard_is_a_grafana_dashboard_model_over_datasource_variables():
    dashboard = json.loads(DASHBOARD.read_text())
    assert isinstance(dashboard["schemaVersion"], int) and dashboard["schemaVersion"] >= 36
    assert dashboard["title"] and dashboard["uid"] and {"from", "to"} <= set(dashboard["time"])
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    panels = dashboard["panels"]
    ids = [p["id"] for p in panels]
    assert all(isinstance(i, int) for i in ids) and len(set(ids)) == len(ids)
    cells: set[tuple[int, int]] = set()
    for panel in panels:
        assert panel["type"] in {"timeseries", "stat", "gauge", "heatmap", "table", "bargauge"} and panel["title"]
        pos = panel["gridPos"]
        assert all(isinstance(pos[k], int) for k in ("x", "y", "w", "h")) and pos["x"] + pos["w"] <= 24, panel["title"]
        area = {(x, y) for x in range(pos["x"], pos["x"] + pos["w"]) for y in range(pos["y"], pos["y"] + pos["h"])}
        assert not area & cells, f"{panel['title']} overlaps another panel"
        cells |= area
        refs = [panel["datasource"], *(t["datasource"] for t in panel["targets"])]
        assert all(ref == {"type": "prometheus", "uid": "${datasource}"} for ref in refs), panel["title"]
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert panel["targets"] and len(set(ref_ids)) == len(ref_ids), panel["title"]
        assert all(t["expr"].strip() for t in panel["targets"]), panel["title"]


def test_every_dashboard_query_names_metrics_and_labels_a_real_gateway_exports(served):
    exported: dict[str, set[str]] = {name: {label for key in series for label, _ in key} for name, series in served.last.items()}
    read = set()
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        for target in panel["targets"]:
            read |= check_query(target["expr"], exported)
    families = {re.sub(r"_(bucket|count|sum|total)$", "", name) for name in read}
    charted = {re.sub(r"_(bucket|count|sum|total|created)$", "", name) for name in exported}
    assert charted - families == set(), f"exported but not charted: {sorted(charted - families)}"


def test_the_query_check_catches_a_missing_metric_or_label(served):
    exported = {name: {label for key in series for label, _ in key} for name, series in served.last.items()}
    check_query('sum by (endpoint) (rate(maitred_ttft_seconds_count{stream="true"}[5m]))', exported)
    for bad in (
        "rate(maitred_ttft_seconds[5m])",  # a histogram is read through its _bucket, _sum and _count
        'rate(maitred_ttft_seconds_count{model="x"}[5m])',
        "sum by (program_id) (rate(maitred_requests_total[5m]))",
        "histogram_quantile(0.9, sum by (endpoint) (rate(maitred_ttft_seconds_bucket[5m])))",
        "sum(rate(maitred_requests_total[5m])) by (endpoint)",
    ):
        with pytest.raises(AssertionError):
            check_query(bad, exported)
