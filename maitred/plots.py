"""PNG output. matplotlib runs headless (Agg) and is imported only when a plot is asked for."""

from pathlib import Path

from maitred.storage.queries import ProgramTimeline

_LANES = {
    "llm": ("model (reasoning)", "tab:blue"),
    "tool": ("tools (acting)", "tab:orange"),
    "wait": ("human (waiting)", "tab:gray"),
}


def timeline_png(timeline: ProgramTimeline, path: str | Path) -> Path:
    """Busy (model) and idle (tool, human) phases of one program on a shared time axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    spans = timeline.spans
    origin = min((s.start for s in spans), default=timeline.program.started_at or 0.0)
    horizon = max((s.end or s.start for s in spans), default=origin)
    fig, ax = plt.subplots(figsize=(11, 2.8))
    for lane, (kind, (label, colour)) in enumerate(_LANES.items()):
        bars = [(s.start - origin, max((s.end or horizon) - s.start, 1e-3)) for s in spans if s.kind == kind]
        ax.broken_barh(bars, (lane - 0.35, 0.7), facecolors=colour, label=label)
    for h in timeline.handoffs:
        ax.axvline(h["ts"] - origin, color="tab:red", linestyle="--", linewidth=1)
        ax.text(
            h["ts"] - origin,
            0.97,
            f" → {h['to_agent']}",
            color="tab:red",
            fontsize=8,
            va="top",
            transform=ax.get_xaxis_transform(),
        )
    ax.set_yticks(range(len(_LANES)), [label for label, _ in _LANES.values()])
    ax.set_xlabel("seconds since first event")
    totals = timeline.busy_idle()
    ax.set_title(
        f"program {timeline.program.program_id}: reasoning {totals['reasoning_s']:.1f} s, "
        f"acting {totals['acting_s']:.1f} s, waiting {totals['waiting_s']:.1f} s"
    )
    ax.set_xlim(0, max(horizon - origin, 1e-3) * 1.02)
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
