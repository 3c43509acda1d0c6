"""Figures of the SEP paper's experiments (matplotlib, an optional extra); each returns the path(s)."""

import os

import numpy as np

from .plots import _pyplot, _save

COLORS = {"gfitc": "tab:green", "sep": "tab:blue", "svi": "tab:red", "logistic": "tab:gray"}


def plot_sep_table1(records, directory, datasets, paper):
    """One panel per data set: our mean test NLL ± s.d. (bars) per m fraction and method, the
    paper's mean ± s.d. (black marks) beside each bar."""
    plt = _pyplot()
    dsets = [d for d in datasets if any(r["dataset"] == d for r in records)]
    fracs = sorted({r["m_fraction"] for r in records})
    methods = [m for m in COLORS if any(r["method"] == m for r in records)]
    fig, axes = plt.subplots(1, len(dsets), figsize=(2.6 * len(dsets) + 0.5, 2.8), squeeze=False)
    width = 0.8 / max(len(methods), 1)
    get = {(r["dataset"], r["m_fraction"], r["method"]): r for r in records}
    for ax, d in zip(axes[0], dsets):
        for j, m in enumerate(methods):
            x = np.arange(len(fracs)) + (j - (len(methods) - 1) / 2) * width
            rs = [get.get((d, f, m)) for f in fracs]
            ours = [r["nll_mean"] if r and r["nll_mean"] is not None else np.nan for r in rs]
            sd = [r["nll_sd"] if r else 0.0 for r in rs]
            ax.bar(x, ours, width * 0.9, yerr=sd, color=COLORS[m], alpha=0.75, capsize=2,
                   label=m.upper() if d == dsets[0] else None)
            p = [paper[d][f][("gfitc", "sep", "svi").index(m)] for f in fracs]
            ax.errorbar(x, [v[0] for v in p], yerr=[v[1] for v in p], fmt="_", color="k",
                        markersize=8, elinewidth=0.8, capsize=0,
                        label="paper ± sd" if d == dsets[0] and j == 0 else None)
        ax.set_xticks(np.arange(len(fracs)), [f"{int(100 * f)}%" for f in fracs])
        ax.set_title(d, fontsize=9)
        ax.set_ylim(bottom=0)
    axes[0, 0].set_ylabel("test NLL")
    axes[0, 0].legend(fontsize=7)
    return _save(fig, os.path.join(directory, "sep-table1.png"))
