"""The figure of a bench/compare.py run: one panel per family of cases (forward;
storage and decode; backward; serving), one group of horizontal bars per case,
one bar per peer: peer time / fastattn time on a log axis with the 1.0 line
(right of it, fastattn is faster), and beside each panel fastattn's own
figure as % of the run's ceiling (FMA peak or read loop over the same bytes).

Horizontal bars keep every case label on its own line, whatever the number of
cases; the figure grows with them.

    python bench/compare.py --from-json out.json --plot out.png
"""

FAMILIES = ("forward", "storage and decode", "backward", "serving")
# bar colours per library (torch first, then the peers in bench/peers.py's order)
COLORS = {"torch": "tab:orange", "numpy": "tab:green", "openvino": "tab:purple",
          "onnxruntime": "tab:blue", "jax": "tab:red", "baseline": "tab:olive"}
LABELS = {"torch": "torch", "numpy": "NumPy (SciPy for softmax)", "openvino": "OpenVINO",
          "onnxruntime": "ONNX Runtime", "jax": "JAX",
          "baseline": "fastattn's own baseline (serving: loop / contiguous)"}
TICKS = (0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)


def family(case):
    """Which panel a case belongs to."""
    if case.get("backward"):
        return "backward"
    if case["kind"] in ("varlen", "paged"):
        return "serving"
    if case.get("kv_dtype") or case.get("decode"):
        return "storage and decode"
    return "forward"


def ratio(row, lib):
    """peer time / fastattn time of a row (NumPy's column is SciPy's on softmax), or None."""
    key = "scipy" if lib == "numpy" and row["case"]["kind"] == "softmax" else lib
    return row.get("ratios", {}).get(key)


def layout(rows, libs):
    """[(family, [rows])] of the families that have rows, in FAMILIES order, and the
    libraries that have at least one ratio (the bars of every group)."""
    panels = [(f, [r for r in rows if family(r["case"]) == f]) for f in FAMILIES]
    panels = [(f, rs) for f, rs in panels if rs]
    present = [lib for lib in libs if any(ratio(r, lib) for r in rows)]
    return panels, present


def plot(results, rows, ceil, path, wrong=None):
    """Write the figure to ``path``.  ``wrong(row, lib)``: True for a peer whose
    output failed its check (drawn hatched, marked "!")."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    libs = ["torch", "numpy"] + [lib for lib in results.get("peers", []) if lib in COLORS] + ["baseline"]
    panels, present = layout(rows, libs)
    if not panels:
        raise ValueError("nothing to plot: no case has a fastattn time")
    # one log scale for every panel, so that bars compare across families
    every = [ratio(r, lib) for r in rows for lib in present if ratio(r, lib)] or [1.0]
    lo, hi = min(min(every), 1.0) / 1.3, max(max(every), 1.0) * 1.3
    ticks = [t for t in TICKS if lo <= t <= hi]
    bar_h = 0.8 / max(1, len(present))
    heights = [max(2, len(rs)) * (0.18 + 0.1 * len(present)) + 0.6 for _, rs in panels]
    fig, axes = plt.subplots(len(panels), 2, figsize=(13, sum(heights) + 1.2), squeeze=False,
                             gridspec_kw={"height_ratios": heights, "width_ratios": [4, 1]})
    for (fam, rs), (ax, ax_pct) in zip(panels, axes):
        ys = range(len(rs))
        for i, lib in enumerate(present):
            offs = (i - (len(present) - 1) / 2) * bar_h
            vals = [ratio(r, lib) for r in rs]
            y = [yi + offs for yi, v in zip(ys, vals) if v]
            x = [v for v in vals if v]
            bad = [bool(wrong and wrong(r, lib)) for r, v in zip(rs, vals) if v]
            ax.barh(y, x, height=bar_h, color=COLORS[lib], label=LABELS[lib],
                    hatch=None, edgecolor="none")
            for yi, xi, b in zip(y, x, bad):
                if b:
                    ax.barh(yi, xi, height=bar_h, color="none", edgecolor="k", hatch="///")
                    ax.text(xi, yi, " !", va="center", fontsize=7)
        ax.axvline(1.0, color="k", lw=1)
        ax.set_xscale("log")
        ax.set_xlim(lo, hi)
        ax.set_xticks(ticks)
        ax.set_xticklabels([f"{t:g}×" for t in ticks])
        ax.minorticks_off()
        ax.set_yticks(list(ys))
        ax.set_yticklabels([r["id"] for r in rs], fontsize=8)
        ax.invert_yaxis()
        ax.set_title(fam, loc="left", fontsize=10, fontweight="bold")
        ax.grid(axis="x", which="both", alpha=0.3)
        ax.set_xlabel("peer time / fastattn time (log; > 1: fastattn faster)", fontsize=8)
        ax.tick_params(axis="x", labelsize=8)
        pct = [r.get("pct_bw") if r.get("pct_bw") is not None else r.get("pct_peak") for r in rs]
        kinds = ["read" if r.get("pct_bw") is not None else "FMA" for r in rs]
        ax_pct.barh(list(ys), [v or 0 for v in pct], height=0.6,
                    color=["tab:cyan" if k == "read" else "tab:gray" for k in kinds])
        for yi, v, k in zip(ys, pct, kinds):
            if v is not None:
                ax_pct.text(min(v, 100) + 1, yi, f"{v:.0f}% {k}", va="center", fontsize=7)
        ax_pct.set_xlim(0, 130)
        ax_pct.axvline(100, color="k", lw=0.8)
        ax_pct.set_yticks(list(ys))
        ax_pct.set_yticklabels([])
        ax_pct.set_ylim(ax.get_ylim())
        ax_pct.set_xlabel("fastattn, % of ceiling", fontsize=8)
        ax_pct.tick_params(axis="x", labelsize=8)
    total = sum(heights) + 1.2
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper left", bbox_to_anchor=(0.01, 1 - 0.3 / total),
               ncol=min(len(present), 4), fontsize=8, frameon=False)
    m = results.get("machine", {})
    fig.suptitle(f"fastattn against its peers, {results.get('threads')} thread(s), {m.get('cpu', '?')}; "
                 f"missing bar: the peer cannot express the case (see the table)", x=0.01, y=1 - 0.05 / total,
                 ha="left", fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 1 - (0.45 + 0.2 * (len(present) > 4)) / total))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return fig
