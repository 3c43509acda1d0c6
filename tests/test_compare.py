"""``gpc compare``: its three sections, how a user's data set finds its section, --methods, --plot."""

import json
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from helpers import run_cli

from gpc import datasets
from gpc.experiments import compare, compare_multiclass, compare_sparse, plots

MULTICLASS_METHODS, SPARSE_METHODS = compare_multiclass.METHODS, compare_sparse.METHODS

SECTION_HEADINGS = ("== exact ==", "== sparse ==", "== multiclass ==")


def _write_csv(path, X, y, label="label"):
    lines = [",".join([f"x{j}" for j in range(X.shape[1])] + [label])]
    lines += [",".join([f"{v:.5f}" for v in row] + [str(c)]) for row, c in zip(X, y)]
    path.write_text("\n".join(lines) + "\n")


def _capture_figures(monkeypatch):
    """Keep every figure plots.py saves (it still writes the file)."""
    figures = []
    real = plots._save

    def keep(fig, path):
        figures.append(fig)
        return real(fig, path)

    monkeypatch.setattr(plots, "_save", keep)
    return figures


def _sections(records):
    return {r["section"] for r in records}


def test_quick_compare_shows_every_estimator(tmp_path, capsys, monkeypatch):
    figures = _capture_figures(monkeypatch)
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    code, stdout, err = run_cli(["compare", "--quick", "--quiet", "--out", str(out), "--plot", str(png)], capsys)
    assert code == 0, err
    positions = [stdout.index(h) for h in SECTION_HEADINGS]
    assert positions == sorted(positions)              # one report, the sections in order
    for caption in (compare.EXACT_CAPTION, compare_sparse.CAPTION, compare_multiclass.CAPTION):
        assert caption in stdout
    recs = json.loads(out.read_text())
    assert _sections(recs) == {"exact", "sparse", "multiclass"}
    by = {s: [r for r in recs if r["section"] == s] for s in compare.SECTIONS}
    assert {r["method"] for r in by["exact"]} == set(compare.METHOD_LABELS)
    assert {r["method"] for r in by["sparse"]} == set(SPARSE_METHODS)
    assert {r["method"] for r in by["multiclass"]} == set(MULTICLASS_METHODS)
    for r in by["exact"]:
        assert r["n_folds"] == compare.QUICK["folds"] and r["dataset"] == "crabs"
    # --quick: 20 sparse iterations on 900 banana rows; 0.35 is far below chance (0.45 for banana's
    # class balance) and above the 0.27 of SVI's slow start at m = 8
    for r in by["sparse"]:
        assert r["error"] is not None and r["error"] < 0.35, r
        assert r["n_inducing"] == (None if r["method"] == "exact-ep" else 8)
        assert r["n_train"] == (200 if r["method"] == "exact-ep" else 900)
    # glass, 6 classes: chance is 1/6 of balanced accuracy; every model on 66 rows does better
    for r in by["multiclass"]:
        assert r["balanced_accuracy"] > 0.3 and np.isfinite(r["nll"]), r
    # the outlier rows name rows of the data set: their labels are the file's labels at those rows
    y_glass = datasets.load_glass(binary=False).y
    (robust,) = [r for r in by["multiclass"] if r["method"] == "rmgpc"]
    probs = [o["probability"] for o in robust["outliers"]]
    assert probs == sorted(probs, reverse=True) and all(0.0 <= p <= 1.0 for p in probs)
    for o in robust["outliers"]:
        assert y_glass[o["row"] - 1] == o["label"]
    assert "most likely mislabelled" in stdout
    # the figure: test error and NLL (rows) against time for each section (columns), log axes
    (fig,) = figures
    axes = np.array(fig.axes).reshape(2, 3)
    assert [ax.get_title() for ax in axes[0]] == [plots.SECTION_TITLES[s] for s in compare.SECTIONS]
    assert all(ax.get_xscale() == "log" for ax in axes.ravel())
    assert [ax.get_ylabel() for ax in axes[:, 0]] == ["test error", "test NLL"]
    shown = " ".join(t.get_text() for t in axes[0, 1].texts)
    assert "sparse-ep m=8" in shown and "exact-ep n=200" in shown
    assert png.stat().st_size > 10_000


def test_bare_command(tmp_path):
    """The README's first command, as a user runs it: three sections, nothing failed."""
    proc = subprocess.run([sys.executable, "-m", "gpc", "compare"], capture_output=True, text=True,
                          cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for heading in SECTION_HEADINGS:
        assert heading in proc.stdout
    assert "failed" not in proc.stdout
    for label in ("exact-ep n=500", "exact-ep n=1000", "sparse-ep m=32", "gfitc m=8", "svi m=32",
                  "rmgpc", "htpc", "ovr-ep", "mf-naive"):
        assert label in proc.stdout
    assert "3975 training / 1325 test rows" in proc.stdout          # banana, 1/4 held out
    assert "glass: 142 training / 72 test rows" in proc.stdout      # glass, 1/3 held out


def test_methods_pick_sections_and_filter_them(tmp_path, capsys):
    out = tmp_path / "r.json"
    code, stdout, err = run_cli(["compare", "--quick", "--quiet", "--methods", "pep", "sparse-ep",
                                 "--out", str(out)], capsys)
    assert code == 0, err
    recs = json.loads(out.read_text())
    assert {(r["section"], r["method"]) for r in recs} == {("exact", "pep"), ("sparse", "sparse-ep")}
    assert "== multiclass ==" not in stdout


def test_progress_lines_per_section_and_method_on_stderr(capsys):
    argv = ["compare", "--quick", "--methods", "laplace", "sparse-ep", "rmgpc"]
    code, stdout, err = run_cli(argv, capsys)
    assert code == 0, err
    lines = err.splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "exact section", "  laplace probit", "sparse section", "  sparse-ep m=8", "multiclass section",
        "  rmgpc"]
    assert "test error" in lines[1] and "s CPU" in lines[1]
    assert "exact section" not in stdout                  # the tables alone on stdout
    code, _, err = run_cli(argv[:1] + ["--quiet"] + argv[1:], capsys)
    assert code == 0 and err == ""


def _record(task):
    return {"task": task, "error": 0.0, "fit_cpu_seconds": 0.0}


def test_map_fits_reports_each_method_when_its_last_fit_ends():
    events = []

    def fit(task):
        events.append(f"fit {task}")
        return _record(task)

    results = compare.map_fits(fit, [0, 1, 2], ["a", "a", "b"],
                               done=lambda key, rs: events.append(f"done {key} {[r['task'] for r in rs]}"))
    assert [r["task"] for r in results] == [0, 1, 2]
    assert events == ["fit 0", "fit 1", "done a [0, 1]", "fit 2", "done b [2]"]
    # in a process pool: the same results and groups
    seen = []
    results = compare.map_fits(_record, [0, 1, 2], ["a", "a", "b"], jobs=2,
                               done=lambda key, rs: seen.append((key, [r["task"] for r in rs])))
    assert [r["task"] for r in results] == [0, 1, 2] and seen == [("a", [0, 1]), ("b", [2])]


def test_section_flag_restricts_the_bare_run(tmp_path, capsys):
    out = tmp_path / "r.json"
    code, _, err = run_cli(["compare", "--quick", "--quiet", "--section", "multiclass", "--methods", "rmgpc",
                            "smgpc", "--out", str(out)], capsys)
    assert code == 0, err
    recs = json.loads(out.read_text())
    assert [(r["section"], r["method"]) for r in recs] == [("multiclass", "rmgpc"), ("multiclass", "smgpc")]


def test_multiclass_csv_goes_to_the_multiclass_models(tmp_path, capsys):
    rng = np.random.default_rng(1)
    centres = np.array([[0.0, 0.0], [3.0, 0.0], [0.0, 3.0]])
    y = np.repeat(["a", "b", "c"], 20)
    X = centres[np.searchsorted(["a", "b", "c"], y)] + 0.7 * rng.normal(size=(60, 2))
    y[[4, 30]] = ["c", "a"]                     # two labels that the inputs contradict
    path = tmp_path / "three.csv"
    _write_csv(path, X, y, label="kind")
    out = tmp_path / "r.json"
    code, stdout, err = run_cli(["compare", "--csv", str(path), "--label", "kind", "--quiet", "--out",
                                 str(out)], capsys)
    assert code == 0, err
    assert "== multiclass ==" in stdout and "== exact ==" not in stdout
    # the data chose the section, and the report names the flag that chooses another
    assert "3 classes: the multiclass section (--section exact|sparse|multiclass chooses another)" in stdout
    recs = json.loads(out.read_text())
    assert _sections(recs) == {"multiclass"} and {r["method"] for r in recs} == set(MULTICLASS_METHODS)
    (robust,) = [r for r in recs if r["method"] == "rmgpc"]
    for o in robust["outliers"]:
        assert y[o["row"] - 1] == o["label"]    # rows are the CSV's data rows, 1-based


def test_large_binary_csv_goes_to_the_sparse_methods(tmp_path, capsys):
    rng = np.random.default_rng(2)
    n = compare.LARGE + 100
    X = rng.normal(size=(n, 2))
    y = np.where(np.sin(2 * X[:, 0]) + X[:, 1] + 0.3 * rng.normal(size=n) > 0, 1, 0)
    path = tmp_path / "big.csv"
    _write_csv(path, X, y)
    out = tmp_path / "r.json"
    code, stdout, err = run_cli(["compare", "--csv", str(path), "--inducing", "4", "--exact-rows", "100",
                                 "--sparse-iter", "5", "--quiet", "--out", str(out)], capsys)
    assert code == 0, err
    assert "== sparse ==" in stdout and "== exact ==" not in stdout
    assert f"{n} rows > {compare.LARGE}" in stdout and "--section exact|sparse|multiclass" in stdout
    recs = json.loads(out.read_text())
    assert {r["method"] for r in recs} == set(SPARSE_METHODS) and _sections(recs) == {"sparse"}
    # a small binary CSV stays with the exact methods
    small = tmp_path / "small.csv"
    _write_csv(small, X[:60], y[:60])
    code, stdout, err = run_cli(["compare", "--csv", str(small), "--methods", "laplace", "--folds", "2",
                                 "--quiet"], capsys)
    assert code == 0, err
    assert "== exact ==" in stdout and "== sparse ==" not in stdout


def test_bundled_set_with_its_classes(tmp_path, capsys):
    """glass is binary by default (PL's grouping); the multiclass section loads its six classes."""
    out = tmp_path / "r.json"
    code, stdout, err = run_cli(["compare", "--data", "glass", "--methods", "rmgpc", "--quiet", "--out",
                                 str(out)], capsys)
    assert code == 0, err
    (rec,) = json.loads(out.read_text())
    assert rec["section"] == "multiclass" and rec["n_train"] + rec["n_test"] == 214
    assert "6 classes" in stdout
    assert "RMGPC paper, all rows" in stdout    # glass's Table 3 column next to the outlier rows


@pytest.mark.parametrize("argv, message", [
    (["compare", "--section", "sparse", "--methods", "sep"], "its methods: exact-ep, sparse-ep, gfitc, svi"),
    (["compare", "--section", "exact", "--methods", "laplace", "rmgpc"], "rmgpc are not in --section exact"),
    (["compare", "--methods", "sparse-sep"], "sparse: exact-ep, sparse-ep, gfitc, svi"),
    (["compare", "--data", "housing", "--section", "multiclass"], "is the label a category?"),
    (["compare", "--inducing", "0"], "--inducing must be at least 1"),
    (["compare", "--threads", "0"], "--threads must be at least 1"),
    (["compare", "--methods", "svi", "--likelihood", "heaviside"], "sparse section has nothing to fit"),
])
def test_errors(argv, message, capsys):
    code, _, err = run_cli(argv, capsys)
    assert code == 2
    assert message in err, err
    assert "Traceback" not in err


def test_route():
    binary_small, binary_large = np.repeat([0, 1], 50), np.repeat([0, 1], compare.LARGE)
    three = np.repeat([0, 1, 2], 30)
    three_large = np.repeat([0, 1, 2], compare.LARGE)
    assert compare.route(binary_small, None, None) == (["exact"], None)
    sections, note = compare.route(binary_large, None, None)
    assert sections == ["sparse"] and "O(n³)" in note
    assert compare.route(three, None, None)[0] == ["multiclass"]
    sections, note = compare.route(three_large, None, None)
    assert sections == ["sparse"] and "--section multiclass" in note
    assert compare.route(binary_small, None, ["svi", "rmgpc"]) == (["sparse", "multiclass"], None)
    assert compare.route(three, ["exact"], ["rmgpc"]) == (["exact"], None)


def test_method_names_are_unambiguous():
    names = [m for section in compare.section_methods().values() for m in section]
    assert len(names) == len(set(names))
    assert "sep" in compare.section_methods()["exact"]          # sequential EP, the exact engine's
    assert "sep" not in compare.section_methods()["sparse"]


def test_held_out_scores():
    class Fixed:
        classes_ = np.array(["a", "b", "c"])

        def predict_proba(self, X):
            return np.array([[0.7, 0.2, 0.1], [0.1, 0.8, 0.1], [0.5, 0.4, 0.1], [0.2, 0.2, 0.6]])

    y = np.array(["a", "b", "b", "c"])
    s = compare.held_out_scores(Fixed(), np.zeros((4, 1)), y)
    assert s["error"] == pytest.approx(0.25)                   # row 3 predicted "a"
    assert s["error_se"] == pytest.approx(np.sqrt(0.25 * 0.75 / 4))
    assert s["nll"] == pytest.approx(-np.mean(np.log([0.7, 0.8, 0.4, 0.6])))
    assert s["balanced_accuracy"] == pytest.approx((1.0 + 0.5 + 1.0) / 3)   # class b: 1 of 2


def test_plot_merges_coincident_labels_and_takes_zero_errors(tmp_path, monkeypatch):
    figures = _capture_figures(monkeypatch)
    records = [
        {"section": "exact", "method": "sep", "likelihood": "probit", "error_mean": 0.0, "nll_mean": 0.07,
         "fit_cpu_seconds_mean": 0.100},
        {"section": "exact", "method": "pep", "likelihood": "probit", "error_mean": 0.0, "nll_mean": 0.07,
         "fit_cpu_seconds_mean": 0.101},
        {"section": "exact", "method": "kl", "likelihood": "logit", "error_mean": 0.03, "nll_mean": 0.09,
         "fit_cpu_seconds_mean": 1.0},
        {"section": "exact", "method": "vb", "likelihood": "probit", "failures": ["diverged"]},
        {"section": "multiclass", "label": "htpc", "error": 0.4, "nll": 1.4, "fit_cpu_seconds": 12.0},
    ]
    assert plots.compare_panels(records) == {
        "exact": [("sep", 0.100, 0.0, 0.07), ("pep", 0.101, 0.0, 0.07), ("kl logit", 1.0, 0.03, 0.09)],
        "multiclass": [("htpc", 12.0, 0.4, 1.4)]}
    plots.plot_compare(records, str(tmp_path / "p.png"))
    (fig,) = figures
    axes = np.array(fig.axes).reshape(2, 2)
    assert sorted(t.get_text() for t in axes[0, 0].texts) == ["kl logit", "sep, pep"]
    assert axes[0, 0].get_yscale() == "symlog"                   # a test error of 0 stays on the plot
    assert axes[1, 0].get_yscale() == "log"


def test_options_reject_what_cannot_run():
    args = SimpleNamespace(quick=False, folds=None, jobs=1, threads=1, likelihood=None, inducing=None,
                           exact_rows=[0], sparse_iter=None, seed=0, quiet=True)
    with pytest.raises(ValueError, match="--exact-rows must be at least 1"):
        compare._options(args)


def test_stratified_subset_keeps_the_class_proportions():
    y = np.repeat(["a", "b", "c"], [700, 200, 100])               # sorted by class, as many files are
    keep = compare.stratified_subset(y, 150, seed=3)
    assert len(keep) == 150 and len(np.unique(keep)) == 150
    # 150 · (0.7, 0.2, 0.1) = (105, 30, 15) exactly; no class lost to the file's order
    assert [np.sum(y[keep] == c) for c in "abc"] == [105, 30, 15]
    assert np.array_equal(keep, compare.stratified_subset(y, 150, seed=3))
    # 7 · (0.7, 0.2, 0.1) = (4.9, 1.4, 0.7): floors (4, 1, 0), the two rows left to a and c
    assert [np.sum(y[compare.stratified_subset(y, 7, seed=0)] == c) for c in "abc"] == [5, 1, 1]
