"""``benchmarks/bench_dynamo.py`` end to end, tiny: two program slots for a few seconds through
each of Dynamo's KV router, ``dynamo.thunderagent_router`` and maitred's component, each on its
own fresh mocker workers; the JSON line carries every figure, and no request failed."""

from pathlib import Path

import pytest

from maitred.harness.dynamo_stack import ROUTERS

BENCHMARKS = Path(__file__).parents[2] / "benchmarks"
FIGURES = {"out_tok_s", "ttft_mean_s", "ttft_p99_s", "requests", "failed", "cache_hit_rate"}
pytestmark = pytest.mark.timeout(1500)


def test_bench_dynamo_reports_every_figure_for_each_router_without_failures(dynamo_python, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # the script imports its siblings, as when run from there
    from bench_dynamo import main

    result = main(["--programs", "2", "--duration", "6", "--python", dynamo_python])
    assert set(result["routers"]) == set(ROUTERS)
    for router, figures in result["routers"].items():
        assert set(figures) == FIGURES, router
        assert figures["requests"] > 0 and figures["failed"] == 0, (router, figures)
    assert set(result["ratios"]) == {"maitred/kv", "maitred/thunderagent"}
    assert result["reference_s"] > 0
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("{")
