"""Figures for the command line (matplotlib is an optional extra: ``pip install "gpc[plot]"``)."""

import numpy as np


def _pyplot():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover
        raise SystemExit("plots need matplotlib: pip install 'gpc[plot]'") from exc
    return plt


def plot_compare(records, path, title=""):
    """Bar chart of the cross-validated test error (± one standard error) per method and likelihood."""
    plt = _pyplot()
    ok = [r for r in records if "error_mean" in r]
    labels = [f"{r['method']}\n{r['likelihood']}" for r in ok]
    fig, ax = plt.subplots(figsize=(max(4, 0.9 * len(ok) + 1), 3.2))
    ax.bar(np.arange(len(ok)), [r["error_mean"] for r in ok], yerr=[r["error_se"] for r in ok],
           color="tab:blue", alpha=0.8, capsize=3)
    ax.set_xticks(np.arange(len(ok)), labels, fontsize=7)
    ax.set_ylabel("test error")
    ax.set_title(title or "cross-validated test error")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
