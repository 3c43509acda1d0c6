"""Figures for the command line (matplotlib is an optional extra: ``pip install "gpc[plot]"``).

Every function writes small PNGs (about 100 dpi) and returns the path(s) written.
"""

import os

import numpy as np

DPI = 100


def _pyplot():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover
        raise ValueError("plots need matplotlib: pip install 'gpc[plot]'") from exc
    return plt


def _save(fig, path):
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    import matplotlib.pyplot as plt
    plt.close(fig)
    return path


SECTION_TITLES = {"exact": "exact: GaussianProcessClassifier", "sparse": "sparse: inducing points",
                  "multiclass": "multiclass: MultiClassGPC, one-vs-rest"}


def compare_panels(records):
    """{section: [(label, fit CPU s, test error, test NLL), ...]} of ``gpc compare``'s records, the
    sections in the order they first appear, failed fits left out."""
    from .compare import point
    panels = {}
    for r in records:
        p = point(r)
        if p is not None:
            panels.setdefault(r.get("section", "exact"), []).append(p)
    return panels


def _log_or_symlog(ax, values, axis):
    """Log scale, or symmetric log (linear below 1e-3) when a value is 0, e.g. a test error of 0."""
    scale = "log" if min(values) > 0 else "symlog"
    kw = {"linthresh": 1e-3} if scale == "symlog" else {}
    (ax.set_yscale if axis == "y" else ax.set_xscale)(scale, **kw)


def _merge_labels(points, close=0.03):
    """[(label, x, y)] with points closer than ``close`` decades on both axes merged into one label."""
    merged = []
    for label, x, y in points:
        for i, (other, ox, oy) in enumerate(merged):
            if abs(np.log10(x / ox)) < close and abs(np.log10(max(y, 1e-12) / max(oy, 1e-12))) < close:
                merged[i] = (f"{other}, {label}", ox, oy)
                break
        else:
            merged.append((label, x, y))
    return merged


def _log_ticks(lo, hi):
    """At least three ticks in [lo, hi] at 1, 2, 5 × 10^k, or finer steps of a decade for a narrow
    range; evenly spaced ones where even those are too few."""
    decades = range(int(np.floor(np.log10(lo))), int(np.ceil(np.log10(hi))) + 1)
    for subs in ((1.0,), (1.0, 2.0, 5.0), (1.0, 2.0, 3.0, 5.0, 7.0), tuple(np.arange(1.0, 10.0, 0.5))):
        inside = [s * 10.0 ** k for k in decades for s in subs if lo <= s * 10.0 ** k <= hi]
        if len(inside) >= 3:
            return inside
    from matplotlib import ticker
    return [t for t in ticker.MaxNLocator(4).tick_values(lo, hi) if lo <= t <= hi]


def _plain_ticks(ax):
    """Labelled ticks on the log axes of a panel, written as plain numbers (a panel can span less
    than a decade, where matplotlib's log ticks would leave it unlabelled)."""
    from matplotlib import ticker
    for axis, scale, limits in ((ax.xaxis, ax.get_xscale(), ax.get_xlim()),
                                (ax.yaxis, ax.get_yscale(), ax.get_ylim())):
        if scale == "log":
            axis.set_major_locator(ticker.FixedLocator(_log_ticks(*limits)))
        axis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        axis.set_minor_formatter(ticker.NullFormatter())
    ax.tick_params(labelsize=7)


def plot_compare(records, path):
    """Test error (top) and test NLL (bottom) against fit CPU time, a column per section of
    ``gpc compare``, log axes, every point labelled with its method."""
    plt = _pyplot()
    panels = compare_panels(records)
    if not panels:
        raise ValueError("nothing to plot: every fit failed")
    fig, axes = plt.subplots(2, len(panels), figsize=(4.2 * len(panels), 6.0), squeeze=False)
    for col, (section, points) in enumerate(panels.items()):
        seconds = [p[1] for p in points]
        for row, (value, name) in enumerate(((2, "test error"), (3, "test NLL"))):
            ax = axes[row, col]
            ys = [p[value] for p in points]
            ax.plot(seconds, ys, "o", color=f"C{col}", ms=5)
            for label, x, yv in _merge_labels([(p[0], x, yv) for p, x, yv in zip(points, seconds, ys)]):
                ax.annotate(label, (x, yv), xytext=(3, 2), textcoords="offset points", fontsize=6.5)
            ax.set_xscale("log")
            _log_or_symlog(ax, ys, "y")
            ax.margins(x=0.15, y=0.1)
            _plain_ticks(ax)
            ax.set_ylabel(name)
            ax.grid(True, which="both", lw=0.3, alpha=0.5)
            if row == 0:
                ax.set_title(SECTION_TITLES.get(section, section), fontsize=9)
            else:
                ax.set_xlabel("fit time (CPU s)")
    fig.suptitle("gpc compare: lower left is better (faster, more accurate)", fontsize=10)
    return _save(fig, path)


def plot_pl_table1(records, directory, datasets):
    """One panel per likelihood: our CV error (bars, ± s.e.) and the paper's (black ticks); the data
    sets in the order of ``datasets``."""
    plt = _pyplot()
    liks = list(dict.fromkeys(r["likelihood"] for r in records))
    methods = list(dict.fromkeys(r["method"] for r in records))
    dsets = [d for d in datasets if any(r["dataset"] == d for r in records)]
    fig, axes = plt.subplots(len(liks), 1, figsize=(7.5, 2.3 * len(liks)), squeeze=False)
    width = 0.8 / max(len(methods), 1)
    colors = dict(zip(methods, plt.cm.tab10.colors))
    for ax, lik in zip(axes[:, 0], liks):
        gh = min(r["gh_order"] for r in records if r["likelihood"] == lik)
        top = 0.0
        for j, m in enumerate(methods):
            for i, d in enumerate(dsets):
                r = next((r for r in records if (r["dataset"], r["likelihood"], r["method"], r["gh_order"])
                          == (d, lik, m, gh)), None)
                if r is None:
                    continue
                xpos = i - 0.4 + (j + 0.5) * width
                top = max(top, (r["error_mean"] + r["error_se"]) if r["n_folds"] else 0.0,
                          r.get("paper") or 0.0)
                if r["n_folds"]:
                    ax.bar(xpos, r["error_mean"], width, yerr=r["error_se"], color=colors[m],
                           label=m if i == 0 else None, capsize=1.5, error_kw={"lw": 0.6})
                if r.get("paper") is not None:
                    ax.plot([xpos - width / 2, xpos + width / 2], [r["paper"]] * 2, "k-", lw=1.5,
                            label="paper" if (i == 0 and j == 0) else None)
        ax.set_xticks(np.arange(len(dsets)), dsets, fontsize=8)
        ax.set_ylabel("test error")
        ax.set_title(f"{lik} (GH order {gh})", fontsize=9)
        ax.set_ylim(0.0, 1.3 * top if top > 0 else 1.0)   # headroom: the legend covers no tick
        ax.legend(fontsize=6, ncol=len(methods) + 1, loc="upper left")
    return _save(fig, os.path.join(directory, "pl-table1.png"))


def plot_pl_figure1(out, directory):
    """Exact posterior contours, the PL mean and 3σ ellipse, the parallel-PL path; EP in the title."""
    plt = _pyplot()
    ex = out["exact"]
    fig, ax = plt.subplots(figsize=(5.2, 4.6))
    dens = ex["density"]
    levels = np.exp(np.linspace(np.log(dens.max()) - 9, np.log(dens.max()), 12))
    ax.contour(ex["f1"], ex["f2"], dens, levels=levels, colors="0.45", linewidths=0.7)
    pl = out["pl"]["parallel"]
    t = np.linspace(0, 2 * np.pi, 200)
    L = np.linalg.cholesky(pl["cov"])
    ell = pl["mean"][:, None] + 3.0 * L @ np.vstack([np.cos(t), np.sin(t)])
    ax.plot(ell[0], ell[1], "r-", lw=1.5, label="PL 3σ ellipse")
    path = out["pl_parallel_path"]
    ax.plot(path[:, 0], path[:, 1], "b-", lw=0.6, alpha=0.6)
    ax.plot(path[:, 0], path[:, 1], "bx", ms=6, label="parallel-PL means (from the prior mean)")
    ax.plot(*pl["mean"], "r+", ms=14, mew=2.5, label="PL mean")
    ax.plot(*ex["mean"], "ko", mfc="none", ms=7, label="exact posterior mean")
    ax.axhline(0, color="0.8", lw=0.6)
    ax.axvline(0, color="0.8", lw=0.6)
    ax.set_xlabel("$f_1$")
    ax.set_ylabel("$f_2$")
    ep = out["ep"]["ep sequential (1, 2)"].get("without_fixes", {})
    if ep.get("failed"):
        note = f"EP stops: cavity var. of $f_{ep['site']}$ = {ep['cavity_variance']:.1f}"
    else:
        note = "EP did not fail"
    ax.set_title(f"Exact posterior (log-spaced contours), PL; {note}", fontsize=8.5)
    ax.legend(fontsize=7, loc="lower right")
    return _save(fig, os.path.join(directory, "pl-figure1.png"))


def plot_mf_pima(records, directory):
    """Test errors (of 332) and free energies: ours next to the paper's."""
    plt = _pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(7.5, 3.0))
    labels = [f"min {r['minimised'][3:]}\nrun {r['method'][3:]}" for r in records]
    x = np.arange(len(records))
    for ax, key, pkey, name in ((ax1, "test_errors", "paper_test_errors", "test errors (of 332)"),
                                (ax2, "free_energy", "paper_free_energy", "free energy −ln P(D)")):
        ax.bar(x - 0.2, [r[key] for r in records], 0.4, label="ours", color="tab:blue")
        ax.bar(x + 0.2, [r[pkey] for r in records], 0.4, label="paper", color="0.6")
        ax.set_xticks(x, labels, fontsize=7)
        ax.set_title(name, fontsize=9)
        ax.legend(fontsize=7)
    return _save(fig, os.path.join(directory, "mf-pima.png"))


def plot_mf_online(records, directory):
    """Training and test error against examples presented; dash-dotted line where re-use begins."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(records), figsize=(4.2 * len(records), 3.2), squeeze=False)
    for ax, r in zip(axes[0], records):
        t = np.arange(1, len(r["train_error"]) + 1)
        ax.plot(t, r["train_error"], "b-", lw=1, label="training error")
        ax.plot(t, r["test_error"], "r-", lw=1, label="test error")
        for s in range(1, r["n_sweeps"]):
            ax.axvline(s * r["n_train"], color="k", ls="-.", lw=0.8)
        ax.set_xlabel("examples presented")
        ax.set_ylabel("error")
        ax.set_ylim(0, max(0.6, float(np.max(r["test_error"][5:], initial=0)) + 0.05))
        ax.set_title(f"{r['dataset']} ({r['n_train']} train / {r['n_test']} test)", fontsize=9)
        ax.legend(fontsize=7)
    return _save(fig, os.path.join(directory, "mf-online.png"))


def plot_nr_bounds(records, directory, grid_values, reliable_reference):
    """Contours over (ln ℓ, ln σ_f): ln Z per method with AIS, ln Z − ln Z_AIS, test error, test log-lik.

    ``grid_values(records, method, key)`` and ``reliable_reference(records)`` are the experiment's
    own readers of its records (gpc.experiments.nr_bounds), passed in so that this module imports no
    experiment."""
    plt = _pyplot()
    methods = list(dict.fromkeys(r["method"] for r in records if r["method"] != "ais"))
    ells, sfs, ref = reliable_reference(records)
    paths = []
    if len(ells) < 2 or len(sfs) < 2:
        return paths

    def panels(key, fname, title, levels, diff=False, cmap="viridis", mark_max=False):
        names = (["ais"] if not diff and key == "log_evidence" else []) + methods
        ncol = min(4, len(names))
        nrow = int(np.ceil(len(names) / ncol))
        fig, axes = plt.subplots(nrow, ncol, figsize=(2.5 * ncol + 0.8, 2.2 * nrow + 0.4), squeeze=False,
                                 sharex=True, sharey=True)
        from matplotlib.colors import BoundaryNorm
        norm = BoundaryNorm(levels, plt.get_cmap(cmap).N, extend="both")
        for ax, m in zip(axes.ravel(), names):
            v = (ref if m == "ais" else grid_values(records, m, key)[2]) - (ref if diff else 0.0)
            v = np.ma.masked_invalid(v)
            cs = ax.contourf(ells, sfs, v, levels=levels, cmap=cmap, norm=norm, extend="both")
            ax.contour(ells, sfs, v, levels=levels, colors="k", linewidths=0.3)
            if mark_max and v.count():
                i, j = np.unravel_index(np.ma.argmax(v), v.shape)
                ax.plot(ells[j], sfs[i], "w*", ms=9, mec="k")
            ax.set_title(m if m != "ais" else "AIS (reference)", fontsize=8)
        for ax in axes.ravel()[len(names):]:
            ax.axis("off")
        for ax in axes[-1]:
            ax.set_xlabel("ln ℓ", fontsize=8)
        for ax in axes[:, 0]:
            ax.set_ylabel("ln σ_f", fontsize=8)
        fig.colorbar(cs, ax=axes.ravel().tolist(), shrink=0.85)
        fig.suptitle(title, fontsize=9)
        path = os.path.join(directory, fname)
        fig.savefig(path, dpi=DPI)
        plt.close(fig)
        return path

    top = float(np.nanmax(ref)) if np.isfinite(ref).any() else 0.0
    low = float(np.nanmin(ref)) if np.isfinite(ref).any() else -1.0
    ev_levels = np.linspace(max(low, top - 100.0), top + 1.0, 12)
    gap_levels = np.array([-50.0, -20.0, -10.0, -5.0, -2.0, -1.0, -0.3, 0.3, 1.0])
    errs = [r["test_error"] for r in records if r.get("test_error") is not None]
    tlls = [r["test_loglik"] for r in records if r.get("test_loglik") is not None]
    err_levels = np.linspace(0.0, max(max(errs, default=0.5), 0.05), 11)
    tll_levels = np.linspace(max(min(tlls, default=-1.0), -0.7), max(tlls, default=0.0) + 1e-6, 11)
    specs = (("log_evidence", "nr-bounds-evidence.png",
              "ln Z over (ln ℓ, ln σ_f), digits 3 vs 5 (★ maximum; blank: AIS unreliable)", ev_levels,
              False, "viridis", True),
             ("log_evidence", "nr-bounds-gap.png",
              "ln Z − ln Z_AIS (0 = the reference; blank: AIS unreliable)", gap_levels, True, "RdBu_r"),
             ("test_error", "nr-bounds-error.png", "test error (★ minimum error is darkest)", err_levels,
              False, "magma_r"),
             ("test_loglik", "nr-bounds-testll.png", "mean test log predictive probability (★ maximum)",
              tll_levels, False, "viridis", True))
    for spec in specs:
        paths.append(panels(*spec))
    return paths
