"""The Grafana dashboard charts only metrics the gateway exports."""

import json
import re
from pathlib import Path

from maitred.gateway.metrics import Metrics

DASHBOARD = Path(__file__).resolve().parent.parent / "examples" / "grafana" / "maitred-dashboard.json"


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
