"""Figures of the SEP paper's experiments (matplotlib, an optional extra); each returns the path(s)."""

import os

import numpy as np

from .plots import _pyplot, _save

COLORS = {"gfitc": "tab:green", "sep": "tab:blue", "svi": "tab:red", "logistic": "tab:gray",
          "ep": "tab:purple", "vi": "tab:orange", "exact": "k"}


def plot_sep_table1(records, directory, datasets, paper):
    """One panel per data set (four per row): our mean test NLL ± s.d. (bars, error bars in the
    method's colour) per m fraction and method, the paper's mean ± s.d. (black diamonds) on the
    right half of each bar."""
    plt = _pyplot()
    dsets = [d for d in datasets if any(r["dataset"] == d for r in records)]
    fracs = sorted({r["m_fraction"] for r in records})
    methods = [m for m in COLORS if any(r["method"] == m for r in records)]
    ncol = min(4, len(dsets))
    nrow = -(-len(dsets) // ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(3.0 * ncol + 0.5, 2.6 * nrow), squeeze=False)
    for ax in axes.ravel()[len(dsets):]:
        ax.set_visible(False)
    width = 0.8 / max(len(methods), 1)
    get = {(r["dataset"], r["m_fraction"], r["method"]): r for r in records}
    for ax, d in zip(axes.ravel(), dsets):
        for j, m in enumerate(methods):
            x = np.arange(len(fracs)) + (j - (len(methods) - 1) / 2) * width
            rs = [get.get((d, f, m)) for f in fracs]
            ours = [r["nll_mean"] if r and r["nll_mean"] is not None else np.nan for r in rs]
            sd = [r["nll_sd"] if r else 0.0 for r in rs]
            ax.bar(x, ours, width * 0.9, yerr=sd, color=COLORS[m], alpha=0.75, capsize=2,
                   error_kw={"ecolor": COLORS[m], "elinewidth": 1.0},
                   label=m.upper() if d == dsets[0] else None)
            p = [paper[d][f][("gfitc", "sep", "svi").index(m)] for f in fracs]
            ax.errorbar(x + 0.3 * width, [v[0] for v in p], yerr=[v[1] for v in p], fmt="D",
                        color="k", markersize=3, elinewidth=0.7, capsize=0,
                        label="paper ± sd" if d == dsets[0] and j == 0 else None)
        ax.set_xticks(np.arange(len(fracs)), [f"{int(100 * f)}%" for f in fracs])
        ax.set_title(d, fontsize=9)
        ax.set_ylim(bottom=0)
    for row in axes:
        row[0].set_ylabel("test NLL")
    axes[0, 0].legend(fontsize=7)
    return _save(fig, os.path.join(directory, "sep-table1.png"))


def plot_sep_banana(records, X_train, y_train, directory):
    """SEP Figure 2: one row per method, one column per m; training points (blue −1, red +1), the
    learnt inducing points (black dots) and the decision boundary P(y = +1) = ½ (black line)."""
    plt = _pyplot()
    methods = list(dict.fromkeys(r["method"] for r in records))
    ms = sorted({r["m"] for r in records})
    fig, axes = plt.subplots(len(methods), len(ms), figsize=(1.9 * len(ms), 1.9 * len(methods)),
                             squeeze=False, sharex=True, sharey=True)
    get = {(r["method"], r["m"]): r for r in records}
    for i, meth in enumerate(methods):
        for j, m in enumerate(ms):
            ax = axes[i, j]
            ax.scatter(X_train[:, 0], X_train[:, 1], s=2, c=np.where(y_train > 0, "tab:red", "tab:blue"),
                       alpha=0.5, linewidths=0)
            r = get.get((meth, m))
            if r is not None and "failure" not in r:
                x0, x1, y0, y1 = r["grid_box"]
                P = np.asarray(r["grid_proba"])
                gx, gy = np.linspace(x0, x1, P.shape[1]), np.linspace(y0, y1, P.shape[0])
                ax.contour(gx, gy, P, levels=[0.5], colors="k", linewidths=1.0)
                Z = np.asarray(r["inducing_points"])
                ax.scatter(Z[:, 0], Z[:, 1], s=6, c="k")
                ax.set_xlim(x0, x1)
                ax.set_ylim(y0, y1)
            ax.set_xticks([])
            ax.set_yticks([])
            if i == 0:
                ax.set_title(f"m = {m}", fontsize=9)
            if j == 0:
                ax.set_ylabel(meth.upper(), fontsize=9)
    return _save(fig, os.path.join(directory, "sep-banana.png"))


def plot_time_curves(records, directory, filename, title, baselines=()):
    """Test error and NLL against training time (log scale), one line per record: colour by
    method, line style by m (or batch / minibatch for records with a ``variant``); ``baselines`` are (label, error, nll)
    horizontal lines (e.g. logistic regression)."""
    plt = _pyplot()
    styles = ["-", "--", ":", "-."]

    def kind(r):
        if "variant" in r:
            return "minibatch" if r.get("batch_size") else "batch"
        return f"m={r.get('m')}"

    kinds = list(dict.fromkeys(kind(r) for r in records))
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    for r in records:
        if not r.get("seconds"):
            continue
        label = f"{r['method'].upper()} {kind(r)}"
        points = {key: list(r[key]) + list(r.get("checkpoints", {}).get(key, []))
                  for key in ("seconds", "error", "nll")}        # epochs and within-epoch scorings
        order = np.argsort(points["seconds"], kind="stable")
        t = np.maximum(np.asarray(points["seconds"], dtype=float)[order], 1e-3)
        for ax, key in zip(axes, ("error", "nll")):
            ax.plot(t, np.asarray(points[key])[order], styles[kinds.index(kind(r)) % len(styles)],
                    color=COLORS.get(r["method"], "k"), label=label, linewidth=1.2)
    for name, error, nll in baselines:
        for ax, value in zip(axes, (error, nll)):
            ax.axhline(value, color=COLORS["logistic"], linestyle="-.", linewidth=1.0, label=name)
    from matplotlib.ticker import LogLocator, NullFormatter, StrMethodFormatter
    for ax, name in zip(axes, ("test error", "test NLL")):
        ax.set_xscale("log")
        # the starts (chance level) would flatten the ends on a linear axis; an error of 0 has no
        # logarithm, so a panel with one keeps a linear axis
        log_y = all(v > 0 for line in ax.get_lines() for v in line.get_ydata())
        if log_y:
            ax.set_yscale("log")
        for axis in (ax.xaxis, ax.yaxis) if log_y else (ax.xaxis,):   # ticks at 1, 2, 5 x 10^k
            axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
            axis.set_major_formatter(StrMethodFormatter("{x:g}"))
            axis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("training time [s]")
        ax.set_ylabel(name + (" (log scale)" if log_y else ""))
    axes[1].legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    return _save(fig, os.path.join(directory, filename))


def plot_smgpc_uci(records, directory, datasets):
    """The multi-class UCI table: one column per data set, test error (top) and NLL (bottom), bars
    ± s.d. per m fraction and method, the exact GP's mean as a black line and its ± s.d. as a band."""
    plt = _pyplot()
    dsets = [d for d in datasets if any(r["dataset"] == d for r in records)]
    fracs = sorted({r["m_fraction"] for r in records if r["method"] != "exact"})
    methods = [m for m in ("ep", "sep", "vi") if any(r["method"] == m for r in records)]
    fig, axes = plt.subplots(2, len(dsets), figsize=(3.2 * len(dsets) + 0.5, 5.0), squeeze=False)
    width = 0.8 / max(len(methods), 1)
    get = {(r["dataset"], r["m_fraction"], r["method"]): r for r in records if r["n_splits"]}
    for j, d in enumerate(dsets):
        for ax, key in zip(axes[:, j], ("error", "nll")):
            for k, m in enumerate(methods):
                x = np.arange(len(fracs)) + (k - (len(methods) - 1) / 2) * width
                rs = [get.get((d, f, m)) for f in fracs]
                ax.bar(x, [r[key + "_mean"] if r else np.nan for r in rs], width * 0.9,
                       yerr=[r[key + "_sd"] if r else 0.0 for r in rs], color=COLORS[m], alpha=0.75,
                       capsize=2, label=m.upper() if j == 0 and key == "error" else None)
            exact = get.get((d, 1.0, "exact"))
            if exact is not None:
                mean, sd = exact[key + "_mean"], exact[key + "_sd"]
                ax.axhline(mean, color="k", linewidth=1.0,
                           label="exact GP" if j == 0 and key == "error" else None)
                ax.axhspan(mean - sd, mean + sd, color="k", alpha=0.08)
            ax.set_xticks(np.arange(len(fracs)), [f"{100 * f:g}%" for f in fracs])
            ax.set_ylim(bottom=0)
            if j == 0:
                ax.set_ylabel("test error" if key == "error" else "test NLL")
        axes[0, j].set_title(d, fontsize=9)
        axes[1, j].set_xlabel("m / n per class")
    axes[0, 0].legend(fontsize=7)
    return _save(fig, os.path.join(directory, "smgpc-uci.png"))
