"""The live demo end to end, small: instrumented programs through the gateway to two simulated
workers, once per policy; the summary, the PNG and the recorded history."""

from maitred.harness.livedemo import LiveDemoConfig, run_live_demo, summary_rows
from maitred.storage import SessionStore


def test_live_demo_runs_each_policy_and_records_everything(tmp_path):
    db = f"sqlite:///{tmp_path / 'demo.db'}"
    png = tmp_path / "demo.png"
    cfg = LiveDemoConfig(programs=4, steps=2, time_scale=0.05, gpu_tokens=60_000, cpu_tokens=90_000)
    lines: list[str] = []
    runs = run_live_demo(cfg, db, png, progress=lines.append)
    rows = summary_rows(runs)
    assert [r["policy"] for r in rows] == ["maitred", "round_robin"]
    # both policies against the same workers, run as maitred launches SGLang: a host pool of 1.5
    # GPUs is written back
    assert lines == [
        f"{policy}: 4 programs through the gateway to 2 simulated workers (60,000 GPU and 90,000 host "
        "tokens each, HiCache write_back) ..."
        for policy in ("maitred", "round_robin")
    ]
    for row in rows:
        assert row["requests"] == 8 and row["errors"] == 0 and row["ttft_mean_s"] > 0
        assert 0 < row["cache_hit_rate"] < 1
    assert rows[1]["held_requests"] == 0  # round robin places every request on arrival
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert runs[0].tiers and runs[0].tools
    with SessionStore(db) as store:
        programs = store.programs()
        assert len(programs) == 8
        assert sum(p.llm_calls for p in programs) == 16 and sum(p.tool_calls for p in programs) > 0
