"""``GET /metrics`` as Prometheus reads it, from real gateways on 127.0.0.1, parsed with
prometheus-client's own parser: tool label values stay bounded whatever clients send; and the
Grafana dashboard charts only metrics the gateway exports."""

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from maitred.gateway.app import ServeConfig, build_app
from maitred.gateway.metrics import Metrics
from maitred.gateway.serve import _config, add_arguments
from maitred.harness.background import BackgroundServer

DASHBOARD = Path(__file__).resolve().parent.parent / "examples" / "grafana" / "maitred-dashboard.json"
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


def test_ten_thousand_tool_names_leave_metrics_at_the_cap_and_every_call_counted_once():
    popular = {"pytest": 40, "grep": 30, "Bash": 20, "Read": 12, "Edit": 8}
    with BackgroundServer(build_app(serve_config("--metrics-max-tools", "5")).app) as server:
        post_events(server.url, tool_calls("p", [name for name, n in popular.items() for _ in range(n)]))
        before = scrape(server.url)
        post_events(server.url, tool_calls("p", [f"tool-{i}" for i in range(10_000)], first=1000))
        after = scrape(server.url)
    assert values(before, "maitred_tool_duration_seconds_count", "tool") == popular
    counts = values(after, "maitred_tool_duration_seconds_count", "tool")
    assert counts == {**popular, "other": 10_000}
    # every series the flood added is one of the "other" series: /metrics grew by one tool
    buckets = {labels for name in after if name.startswith("maitred_tool_duration") for labels in after[name]}
    assert {dict(labels)["tool"] for labels in buckets} == {*popular, "other"}
    assert len(after["maitred_tool_duration_seconds_bucket"]) == 6 * len(before["maitred_tool_duration_seconds_bucket"]) / 5


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


# -- the Grafana dashboard ----------------------------------------------------------------------


def test_dashboard_queries_name_only_exported_metrics():
    exported = {family.name for family in Metrics().registry.collect()}
    panels = json.loads(DASHBOARD.read_text())["panels"]
    queried = {
        re.sub(r"_(bucket|total|count|sum)$", "", name)
        for panel in panels
        for target in panel["targets"]
        for name in re.findall(r"maitred_[a-z_]+", target["expr"])
    }
    assert queried and queried <= exported, sorted(queried - exported)
    assert exported <= queried | {"maitred_prompt_tokens"}, f"not charted: {sorted(exported - queried)}"
