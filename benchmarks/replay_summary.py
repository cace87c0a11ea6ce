"""The cross-matrix tables of BENCHMARKS.md ("Replay matrix"), from the ``results.json`` of
``maitred bench replay`` runs, so the figures there are copied from the runs, not retyped.

    python benchmarks/replay_summary.py docs/replay/synthetic docs/replay/swe ...

For each folder (label: its name), every cell under memory pressure (one worker: C ≥ 50; at
C = 20 every policy ties; several workers: every cell): maitred's
throughput, the best baseline's, the ratio, maitred's mean TTFT against that baseline's and the
best TTFT of any baseline, maitred over ``belady``, the ``unlimited`` bound with maitred's share of it, and
maitred's tier moves per hour. Then the range of the ratio over all cells.
"""

import argparse
import json
import sys
from pathlib import Path

from maitred.sim.bench import UNLIMITED, best_baseline, cell


class NotAReplay(ValueError):
    """A folder without a readable ``results.json`` of ``maitred bench replay``."""


def _results(folder: Path) -> tuple[list[dict], dict]:
    path = folder / "results.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return data["runs"], data["matrix"]
    except OSError as exc:
        raise NotAReplay(f"{path}: cannot read it ({exc.strerror}); give an --out folder of maitred bench replay") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise NotAReplay(f"{path}: not the results.json of maitred bench replay ({exc})") from None


def rows(folder: Path) -> list[tuple[str, str, float]]:
    """(table row, cell label, maitred's throughput over the best baseline's) per cell."""
    runs, matrix = _results(folder)
    out = []
    for c in matrix["concurrencies"]:
        if matrix["workers"] == 1 and c < 50:
            continue
        for r in matrix["cpu_ratios"]:
            ours, best = cell(runs, "maitred", c, r), best_baseline(runs, c, r, "throughput_tok_s")
            fastest = best_baseline(runs, c, r, "ttft_mean_s", lower=True)
            if ours is None or best is None or fastest is None:
                continue
            hours = ours["duration_s"] / 3600
            belady, limit = cell(runs, "belady", c, r), cell(runs, UNLIMITED, c, r)
            ratio = ours["throughput_tok_s"] / best["throughput_tok_s"]
            ttft = (ours["ttft_mean_s"] / best["ttft_mean_s"] - 1) * 100
            line = (
                f"| {folder.name} | {c} ×{r:g} | {ours['throughput_tok_s']:.0f} | {best['policy']} "
                f"{best['throughput_tok_s']:.0f} | **{ratio:.2f}×** | {ours['ttft_mean_s']:.2f} s ({ttft:+.0f}%; best "
                f"{fastest['policy']} {fastest['ttft_mean_s']:.2f}) | "
                + (f"{ours['throughput_tok_s'] / belady['throughput_tok_s']:.2f}" if belady else "-")
                + " | "
                + (
                    f"{limit['throughput_tok_s']:.0f} ({ours['throughput_tok_s'] / limit['throughput_tok_s']:.0%})"
                    if limit
                    else "-"
                )
                + f" | {ours['tier_moves'] / hours:,.0f} |"
            )
            out.append((line, f"{folder.name} C={c} ×{r:g}", ratio))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="+", type=Path, help="output folders of maitred bench replay")
    args = parser.parse_args(argv)
    try:
        cells = [row for folder in args.folders for row in rows(folder)]
    except NotAReplay as exc:
        print(f"replay_summary: error: {exc}", file=sys.stderr)
        return 1
    if not cells:
        print("replay_summary: error: no cell with maitred and a baseline at C >= 50 in these folders", file=sys.stderr)
        return 1
    print(
        "| matrix | C ×host | maitred tok/s | best baseline | × | maitred mean TTFT (vs that baseline; best TTFT) "
        "| × belady | unlimited tok/s (maitred's share) | tier moves/h |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    print("\n".join(line for line, _, _ in cells))
    low, high = min(cells, key=lambda x: x[2]), max(cells, key=lambda x: x[2])
    print(f"\nmaitred / best baseline: {low[2]:.2f}× ({low[1]}) to {high[2]:.2f}× ({high[1]}) over {len(cells)} cells")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
