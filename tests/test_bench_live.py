"""``benchmarks/bench_live.py`` end to end, tiny: two programs of the light load for a few
seconds through maitred (and sglang-router's round_robin when it is installed), each in front of
its own simulated workers; the JSON line carries every figure, and nothing failed."""

import importlib.util
import json
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).parents[1] / "benchmarks"
FIGURES = {
    "out_tok_s",
    "ttft_mean_s",
    "ttft_p95_s",
    "ttft_p99_s",
    "requests",
    "errors",
    "cache_hit_rate",
    "gateway_cpu_s",
    "cpu_ms_per_request",
}


def test_bench_live_reports_every_figure_for_each_system_without_errors(monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # the script imports its siblings, as when run from there
    from bench_live import main

    router = importlib.util.find_spec("sglang_router") is not None
    result = main(["--loads", "light", "--programs", "2", "--duration", "4", "--systems", "maitred,round_robin"])

    out, err = capsys.readouterr()
    assert json.loads(out.strip().splitlines()[-1]) == result
    assert "thunderagent" not in err  # not asked for: no line about it
    assert ("sglang-router is not installed" in err) is not router
    rows = result["loads"]["light"]
    assert list(rows) == (["maitred", "round_robin"] if router else ["maitred"])
    for row in rows.values():
        assert set(row) == FIGURES
        assert row["errors"] == 0 and row["requests"] > 0 and row["out_tok_s"] > 0
        assert row["ttft_mean_s"] > 0 and row["gateway_cpu_s"] >= 0
    assert result["reference_s"] > 0 and result["config"]["programs"] == {"light": 2}
    if router:
        assert result["ratios"]["light"]["best_router"] == "round_robin"
        assert result["ratios"]["light"]["out_tok_s_vs_best_router"] > 0


def test_bench_live_names_an_unknown_load(monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from bench_live import main

    with pytest.raises(SystemExit):
        main(["--loads", "light,huge"])
    assert "--loads: unknown huge; choose from light, oversubscribed" in capsys.readouterr().err
