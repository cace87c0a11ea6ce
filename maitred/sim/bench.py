"""``maitred bench replay``: a matrix of replay runs, in parallel, with results, report and plots.

Every (policy, concurrency, host-memory ratio) cell is one closed-loop run; each concurrency
also gets one run with unlimited GPU memory, the physical limit every policy is a fraction of.
Runs are independent and deterministic, so they spread over processes freely.
"""

import json
import math
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from maitred.sim.profile import EngineProfile
from maitred.sim.replay import DEFAULT_POLICIES, Replay, RunConfig
from maitred.sim.traces import Trace, load_trace

UNLIMITED = "unlimited"
BASELINES = ("round_robin", "cache_aware", "thunderagent", "thunderagent_offload", "tao", "mori")


@dataclass(frozen=True, slots=True)
class Matrix:
    trace: str
    policies: tuple[str, ...] = DEFAULT_POLICIES
    concurrencies: tuple[int, ...] = (20, 50, 80)
    cpu_ratios: tuple[float, ...] = (1.0, 2.0)
    duration_s: float = 3600.0
    seed: int = 0
    workers: int = 1
    gpu_tokens: int | None = None
    use_signature: bool = True  # readiness history per tool signature, else per tool (SPEC 7.2)
    busy_margin: float | None = None  # maitred's tier sizing (None: the default)
    overcommit_headroom: float | None = None
    period_s: float | None = None  # every policy's step period (None: each its own)
    hold_timeout_s: float | None = None  # every policy's hold bound (None: each its own)

    def configs(self) -> list[tuple[RunConfig, bool]]:
        def config(p: str, c: int, r: float) -> RunConfig:
            return RunConfig(
                p,
                c,
                r,
                self.duration_s,
                self.seed,
                self.workers,
                self.gpu_tokens,
                period_s=self.period_s,
                hold_timeout_s=self.hold_timeout_s,
                use_signature=self.use_signature,
                busy_margin=self.busy_margin,
                overcommit_headroom=self.overcommit_headroom,
            )

        runs = [(config("round_robin", c, 1.0), True) for c in self.concurrencies]
        runs += [(config(p, c, r), False) for p in self.policies for c in self.concurrencies for r in self.cpu_ratios]
        return runs


_trace: Trace | None = None
_profile: EngineProfile | None = None


def _init(trace_spec: str, profile: dict) -> None:
    global _trace, _profile
    _trace = load_trace(trace_spec)
    _profile = EngineProfile(**profile)


def perfetto_path(folder: Path, cfg: RunConfig, unlimited: bool) -> Path:
    """The trace-event file of one run under ``--perfetto DIR``."""
    policy = UNLIMITED if unlimited else cfg.policy
    return folder / f"{policy}-c{cfg.concurrency}-x{cfg.cpu_ratio:g}.perfetto.json"


def _run(cfg: RunConfig, unlimited: bool, perfetto: Path | None = None) -> dict:
    """One run; with ``perfetto``, also its timeline (the run keeps its journal and spans, which
    change nothing it decides)."""
    assert _trace is not None and _profile is not None
    replay = Replay(_trace, replace(cfg, journal=True) if perfetto else cfg, _profile, unlimited=unlimited)
    record = asdict(replay.run())
    if unlimited:
        record["policy"] = UNLIMITED
    if perfetto is not None and replay.spans is not None:
        about = {"trace": _trace.name, **{k: record[k] for k in ("policy", "concurrency", "cpu_ratio", "workers", "seed")}}
        replay.spans.write(perfetto_path(perfetto, cfg, unlimited), replay.core.journal, about)
    return record


def run_matrix(
    matrix: Matrix,
    profile: EngineProfile,
    *,
    jobs: int | None = None,
    on_done: Callable[[dict], None] | None = None,
    perfetto: Path | None = None,
) -> list[dict]:
    """All runs of the matrix, in matrix order (whatever order they finish in). With ``perfetto``
    (a folder), each run also writes its timeline there (``perfetto_path``)."""
    configs = matrix.configs()
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(configs)))
    results: list[dict | None] = [None] * len(configs)
    if jobs == 1:
        _init(matrix.trace, asdict(profile))
        for i, (cfg, unlimited) in enumerate(configs):
            results[i] = record = _run(cfg, unlimited, perfetto)
            if on_done:
                on_done(record)
    else:
        with ProcessPoolExecutor(jobs, initializer=_init, initargs=(matrix.trace, asdict(profile))) as pool:
            futures = {pool.submit(_run, cfg, unlimited, perfetto): i for i, (cfg, unlimited) in enumerate(configs)}
            for future in as_completed(futures):
                results[futures[future]] = record = future.result()
                if on_done:
                    on_done(record)
    return [r for r in results if r is not None]


def best_baseline(records: Sequence[dict], concurrency: int, ratio: float, key: str, *, lower: bool = False) -> dict | None:
    rows = [
        r
        for r in records
        if r["policy"] in BASELINES and r["concurrency"] == concurrency and r["cpu_ratio"] == ratio and _usable(r[key])
    ]
    if not rows:
        return None
    return (min if lower else max)(rows, key=lambda r: r[key])


def _usable(value: Any) -> bool:
    return value is not None and math.isfinite(value)


def _ratio(a: dict | None, b: dict | None, key: str) -> float | None:
    """``a[key] / b[key]``; None when either is missing or not finite, or ``b[key]`` is 0."""
    if a is None or b is None or not _usable(a[key]) or not _usable(b[key]) or b[key] == 0:
        return None
    return float(a[key] / b[key])


def cell(records: Sequence[dict], policy: str, concurrency: int, ratio: float) -> dict | None:
    for r in records:
        if r["policy"] == policy and r["concurrency"] == concurrency and (policy == UNLIMITED or r["cpu_ratio"] == ratio):
            return r
    return None


def report_markdown(matrix: Matrix, records: Sequence[dict], command: str) -> str:
    ratios, concs = matrix.cpu_ratios, matrix.concurrencies
    policies = list(matrix.policies)
    lines = [
        f"# Replay: {matrix.trace}",
        "",
        f"Command: `{command}`",
        "",
        f"{matrix.duration_s:.0f} simulated seconds per run, seed {matrix.seed}, {matrix.workers} worker(s)"
        + ("" if matrix.use_signature else "; readiness from per-tool history (--history tool)")
        + "".join(
            f"; {name} {value:g}"
            for name, value in (
                ("maitred's busy margin", matrix.busy_margin),
                ("maitred's overcommit headroom", matrix.overcommit_headroom),
                ("every policy's step period (s)", matrix.period_s),
                ("every policy's hold bound (s)", matrix.hold_timeout_s),
            )
            if value is not None
        )
        + ".",
        "",
        f"`{UNLIMITED}` is the same workload with unlimited GPU memory: the upper bound every cell is read "
        "against. `oracle` is maitred told the true tool durations; `belady` is Belady's rule told each "
        "program's next request, a heuristic that other policies can beat, not a bound.",
        "",
    ]
    tables = [
        ("Throughput (output tokens/s)", "throughput_tok_s", "{:.0f}"),
        ("Mean TTFT (s)", "ttft_mean_s", "{:.2f}"),
        ("p95 TTFT (s)", "ttft_p95_s", "{:.2f}"),
        ("Prefix hit rate", "prefix_hit_rate", "{:.3f}"),
    ]
    if any(r.get("handoff_requests") for r in records):  # only traces with handoffs have the column's data
        tables += [
            ("Mean TTFT of a handoff consumer's first request (s)", "handoff_ttft_mean_s", "{:.2f}"),
            ("Handoff consumers' first requests", "handoff_requests", "{:d}"),
        ]
    for title, key, fmt in tables:
        lines += [
            f"## {title}",
            "",
            "| policy | " + " | ".join(f"C={c} ×{r:g}" for c in concs for r in ratios) + " |",
            "|---|" + "---|" * (len(concs) * len(ratios)),
        ]
        for policy in policies + [UNLIMITED]:
            cells = []
            for c in concs:
                for r in ratios:
                    rec = cell(records, policy, c, r)
                    cells.append(fmt.format(rec[key]) if rec and _usable(rec[key]) else "-")
            lines.append(f"| {policy} | " + " | ".join(cells) + " |")
        lines.append("")
    if "maitred" in policies:
        lines += [
            "## maitred against the best baseline of each cell",
            "",
            "| cell | throughput × | mean TTFT change | share of unlimited | vs oracle | vs belady |",
            "|---|---|---|---|---|---|",
        ]
        for c in concs:
            for r in ratios:
                ours, limit, oracle = (
                    cell(records, "maitred", c, r),
                    cell(records, UNLIMITED, c, r),
                    cell(records, "oracle", c, r),
                )
                vs_belady = _ratio(ours, cell(records, "belady", c, r), "throughput_tok_s")
                tput, ttft = (
                    best_baseline(records, c, r, "throughput_tok_s"),
                    best_baseline(records, c, r, "ttft_mean_s", lower=True),
                )
                speedup, ttft_ratio = _ratio(ours, tput, "throughput_tok_s"), _ratio(ours, ttft, "ttft_mean_s")
                if speedup is None or ttft_ratio is None or tput is None or ttft is None:
                    continue
                share, vs_oracle = _ratio(ours, limit, "throughput_tok_s"), _ratio(ours, oracle, "throughput_tok_s")
                lines.append(
                    f"| C={c} ×{r:g} | {speedup:.2f} ({tput['policy']}) | {(ttft_ratio - 1) * 100:+.0f}% ({ttft['policy']}) | "
                    f"{'-' if share is None else f'{share:.0%}'} | {'-' if vs_oracle is None else f'{vs_oracle:.2f}'} | "
                    f"{'-' if vs_belady is None else f'{vs_belady:.2f}'} |"
                )
        lines.append("")
    if "maitred" in policies and "maitred_no_preprefill" in policies:
        lines += preprefill_markdown(records, concs, ratios)
    return "\n".join(lines)


def preprefill_markdown(records: Sequence[dict], concs: Sequence[int], ratios: Sequence[float]) -> list[str]:
    """maitred with pre-prefill on against off, per cell: what the warmups buy the first request
    after a handoff (LOCAL's metric) and what they cost everyone else."""
    lines = [
        "## Pre-prefill: maitred against maitred_no_preprefill",
        "",
        "| cell | handoff consumer TTFT (on / off) | change | throughput change | mean TTFT change |",
        "|---|---|---|---|---|",
    ]
    for c in concs:
        for r in ratios:
            on, off = cell(records, "maitred", c, r), cell(records, "maitred_no_preprefill", c, r)
            if on is None or off is None:
                continue
            consumer = _ratio(on, off, "handoff_ttft_mean_s")
            tput, ttft = _ratio(on, off, "throughput_tok_s"), _ratio(on, off, "ttft_mean_s")
            pair = "-" if consumer is None else f"{on['handoff_ttft_mean_s']:.2f} / {off['handoff_ttft_mean_s']:.2f} s"
            lines.append(f"| C={c} ×{r:g} | {pair} | {_change(consumer)} | {_change(tput)} | {_change(ttft)} |")
    return lines + [""]


def _change(ratio: float | None) -> str:
    return "-" if ratio is None else f"{(ratio - 1) * 100:+.1f}%"


def plot(matrix: Matrix, records: Sequence[dict], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for key, label, name in (
        ("throughput_tok_s", "output tokens/s", "throughput.png"),
        ("ttft_mean_s", "mean TTFT (s)", "ttft.png"),
    ):
        fig, axes = plt.subplots(1, len(matrix.cpu_ratios), figsize=(5.5 * len(matrix.cpu_ratios), 4), squeeze=False)
        for ax, ratio in zip(axes[0], matrix.cpu_ratios):
            for policy in list(matrix.policies) + [UNLIMITED]:
                xs, ys = [], []
                for c in matrix.concurrencies:
                    rec = cell(records, policy, c, ratio)
                    if rec and rec[key] is not None and math.isfinite(rec[key]):
                        xs.append(c)
                        ys.append(rec[key])
                style = {"linestyle": "--", "color": "black"} if policy == UNLIMITED else {"marker": "o"}
                ax.plot(xs, ys, label=policy, linewidth=2.2 if policy == "maitred" else 1.2, **style)
            ax.set_title(f"host memory = {ratio:g}× GPU")
            ax.set_xlabel("concurrent programs")
            ax.set_ylabel(label)
            ax.grid(alpha=0.3)
        axes[0][-1].legend(fontsize=7, loc="best")
        fig.suptitle(Path(matrix.trace).name if not matrix.trace.startswith("synthetic") else matrix.trace)
        fig.tight_layout()
        path = out / name
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def finite_or_none(value: Any) -> Any:
    """``value`` with every NaN or infinity replaced by None, recursively: results.json must be
    strict JSON (bare ``NaN`` is refused by most parsers), and a run with no completed request
    has no mean TTFT rather than a NaN one."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite_or_none(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_none(v) for v in value]
    return value


def write_outputs(matrix: Matrix, records: Sequence[dict], out: Path, command: str) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    records = finite_or_none(list(records))
    results = out / "results.json"
    document = {"matrix": asdict(matrix), "command": command, "runs": records}
    results.write_text(json.dumps(finite_or_none(document), indent=2, allow_nan=False) + "\n")
    report = out / "report.md"
    report.write_text(report_markdown(matrix, records, command))
    return [results, report, *plot(matrix, records, out)]
