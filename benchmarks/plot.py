"""`python -m benchmarks plot`: draw the turn-overhead and recovery results to a PNG.

Reads the latest run of each benchmark from `benchmarks/latest.json` (written by
`report(..., benchmark=...)`) and writes `benchmarks/overhead.png` with matplotlib's
Agg backend (no display needed):

1. turn overhead: stock vs guarded median time per turn, 1 and 5 tool calls, with the
   range over repetitions and the ratio against its target;
2. recovery, whole process: start of a new process to the resumed thread's end, 10 vs
   10,000 earlier turns;
3. recovery, the resume alone: `get_state` + `invoke(None)` inside that process.

A benchmark not run yet leaves its panel saying so.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks._runner import LATEST_PATH, BenchmarkSkipped, require, run_main

__all__ = ["PLOT_PATH", "main", "plot"]

PLOT_PATH = Path(__file__).with_name("overhead.png")

_COLORS = ("#8c9bab", "#2b6cb0")


def _bars(ax: Any, comparisons: list[dict[str, Any]], title: str, unit_label: str) -> None:
    """Baseline and measured bars per scenario, min..max whiskers, ratio and verdict."""
    import numpy as np

    x = np.arange(len(comparisons))
    width = 0.36
    top = 0.0
    for side, (offset, color) in enumerate(((-width / 2, _COLORS[0]), (width / 2, _COLORS[1]))):
        values, lows, highs = [], [], []
        for c in comparisons:
            value = c["baseline"] if side == 0 else c["measured"]
            samples = c["baseline_samples"] if side == 0 else c["measured_samples"]
            values.append(value)
            lows.append(value - min(samples) if samples else 0.0)
            highs.append(max(samples) - value if samples else 0.0)
            top = max(top, value + highs[-1])
        label = comparisons[0]["labels"][side]
        bars = ax.bar(x + offset, values, width, color=color, label=label,
                      yerr=[lows, highs], capsize=4, error_kw={"elinewidth": 1, "ecolor": "#333"})
        for bar, value in zip(bars, values):
            ax.annotate(f"{value:.1f}" if value >= 10 else f"{value:.2f}",
                        (bar.get_x() + bar.get_width() / 2, 0), xytext=(0, 3),
                        textcoords="offset points", ha="center", va="bottom", fontsize=8,
                        color="white", fontweight="bold")
    for i, c in enumerate(comparisons):
        target = "" if c["target"] is None else f" (target ≤ {c['target']:.2f})"
        ax.annotate(f"ratio {c['ratio']:.2f}{target}\n{c['verdict']}",
                    (x[i], top * 1.04), ha="center", va="bottom", fontsize=8,
                    color="#1a7f37" if c["verdict"] == "PASS" else "#b35900")
    ax.set_ylim(0, top * 1.3 if top else 1)
    ax.set_xticks(x, [c["scenario"].replace(": ", ":\n") for c in comparisons], fontsize=8)
    ax.set_ylabel(unit_label)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(axis="y", alpha=0.3)


def _sync_turns(comparisons: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The plain sync turns (`turn, 1 tool call`, `turn, 5 tool calls`) of `turn_overhead`;
    its other rows (saver alone, floor, async, encrypted) are in results.md."""
    return [c for c in comparisons if c["scenario"].count(",") == 1]


def _missing(ax: Any, title: str, benchmark: str) -> None:
    ax.set_title(title, fontsize=10)
    ax.text(0.5, 0.5, f"not run yet:\npython -m benchmarks {benchmark}", ha="center",
            va="center", transform=ax.transAxes, fontsize=9, color="#666")
    ax.set_xticks([])
    ax.set_yticks([])


def plot(latest: Path = LATEST_PATH, out: Path = PLOT_PATH) -> Path:
    """Draw the PNG from `latest` to `out`; return `out`."""
    require("matplotlib", "numpy", why="needed to draw benchmarks/overhead.png")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not latest.exists():
        raise BenchmarkSkipped(f"{latest} does not exist yet: run `python -m benchmarks` "
                               "(or `python -m benchmarks turn_overhead recovery`) first")
    data = json.loads(latest.read_text(encoding="utf-8"))
    fig, axes = plt.subplots(1, 3, figsize=(15, 5.2),
                             gridspec_kw={"width_ratios": [1.2, 1, 1]})
    turn = data.get("turn_overhead")
    if turn:
        _bars(axes[0], _sync_turns(turn["comparisons"]),
              "Turn overhead: stock vs guarded, per turn",
              "ms per turn (median; whiskers: min..max of repetitions)")
    else:
        _missing(axes[0], "Turn overhead", "turn_overhead")
    recovery = data.get("recovery")
    if recovery:
        by_name = {c["scenario"]: c for c in recovery["comparisons"]}
        whole = [c for name, c in by_name.items() if "process" in name]
        inner = [c for name, c in by_name.items() if "process" not in name]
        _bars(axes[1], whole, "Recovery: new process start → thread finished",
              "ms (median; whiskers: min..max)")
        _bars(axes[2], inner, "Recovery: get_state + invoke(None) in that process",
              "ms (median; whiskers: min..max)")
    else:
        _missing(axes[1], "Recovery, whole process", "recovery")
        _missing(axes[2], "Recovery, resume alone", "recovery")
    stamps = []
    for name, entry in (("turn overhead", turn), ("recovery", recovery)):
        if entry:
            m = entry["machine"]
            commit = m.get("commit_ms")
            stamps.append(f"{name}: {m['date']}"
                          + (f", commit {commit:.2f} ms" if commit is not None else ""))
    machine = (turn or recovery or {}).get("machine")
    subtitle = ""
    if machine:
        subtitle = (f"{machine['machine']}, {machine['cpus']} cpus, python {machine['python']}, "
                    f"langgraph {machine['langgraph']}, graph_durable {machine['graph_durable']}, "
                    f"sqlite {machine.get('sqlite', '?')}\n" + "; ".join(stamps))
    fig.suptitle("graph_durable benchmarks: turn overhead and recovery", fontsize=12,
                 fontweight="bold")
    fig.text(0.5, 0.005, subtitle, ha="center", va="bottom", fontsize=7.5, color="#444")
    fig.tight_layout(rect=(0, 0.06, 1, 0.96))
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main() -> list[Any]:
    """Draw the PNG and say where it is."""
    out = plot()
    print(f"wrote {out}")
    return []


if __name__ == "__main__":
    raise SystemExit(run_main(main))
