"""`gpc reproduce rmgpc-table2`: a reduced run in CI, the paper's protocol behind the slow marker."""

import argparse

import numpy as np
import pytest

from gpc.experiments import rmgpc_table2


def _args(**kw):
    base = dict(splits=1, etas=[0.2], datasets=["new-thyroid"], methods=["robust", "standard"], seed=0,
                max_iter=500, tol=1e-4)
    base.update(kw)
    return argparse.Namespace(**base)


def test_balanced_class_rate():
    y = np.array([0, 0, 0, 1])
    # class 0 all right, class 1 wrong: (1 + 0)/2, whereas accuracy would be 3/4
    assert rmgpc_table2.balanced_class_rate(y, np.zeros(4, int)) == 0.5


def test_reduced_run_robust_beats_standard_under_label_noise():
    """The CI run: new-thyroid, η = 20 %, 4 splits, MultiClassGPC's default EP (tol 1e-4; about 8 s
    CPU).

    RMGPC's claim (Table 2, §4.1) is that it beats SMGPC under label noise.  On these four paired
    splits RMGPC's mean BCR is 7.4 points above SMGPC's; the test demands 3 points, and that every
    split favours RMGPC (the signed-rank test's smallest two-sided p for 4 pairs, 2/2⁴ = 0.125), so
    it fails if the outlier indicators stop helping (RMGPC falling back to SMGPC's behaviour gives a
    margin near 0 and splits going either way)."""
    recs = rmgpc_table2.main(_args(splits=4))
    assert [(r["dataset"], r["eta"], r["model"]) for r in recs] == [
        ("new-thyroid", 0.2, "robust"), ("new-thyroid", 0.2, "standard")]
    by = {r["model"]: r for r in recs}
    for r in recs:
        assert r["n_splits"] == 4 and r["bcr_sd"] >= 0
        # the paper reports 85.9-89.5 % at η = 20 %; four splits of 72 test points can be ±10 % off
        assert 75.0 < r["bcr_mean"] <= 100.0
    assert by["robust"]["bcr_mean"] >= by["standard"]["bcr_mean"] + 3.0
    assert by["standard"]["wilcoxon_p_vs_robust"] == pytest.approx(0.125)
    # the per-split rates behind the summary (for tests across runs on the same seeded splits):
    # every split favours RMGPC, as the p-value of 2/2^4 says
    margins = np.subtract(by["robust"]["bcr_splits"], by["standard"]["bcr_splits"])
    assert len(margins) == 4 and np.all(margins > 0)
    assert np.mean(by["robust"]["bcr_splits"]) == pytest.approx(by["robust"]["bcr_mean"], rel=1e-12)


def test_unknown_names_raise():
    with pytest.raises(ValueError, match="SVMguide2"):
        rmgpc_table2.main(_args(datasets=["svmguide2"]))
    with pytest.raises(ValueError, match="unknown model"):
        rmgpc_table2.main(_args(methods=["htpc"]))
    with pytest.raises(ValueError, match="--max-iter"):
        rmgpc_table2.main(_args(max_iter=0))


def test_doc_table_from_records_and_the_cli_round_trip(tmp_path, capsys):
    """``--from-json`` reads an earlier run's records and ``--update-doc`` writes the markdown table
    between the markers: a Wilcoxon p below 1 % gets ◁, a model that agrees with RMGPC on every split
    (p NaN) gets none, and the paper's columns come from PAPER."""
    import json

    records = [
        {"dataset": "wine", "eta": 0.2, "model": "robust", "bcr_mean": 97.44, "bcr_sd": 1.52,
         "n_splits": 3, "wilcoxon_p_vs_robust": float("nan"), "bcr_splits": [96.0, 97.0, 99.3]},
        {"dataset": "wine", "eta": 0.2, "model": "standard", "bcr_mean": 95.0, "bcr_sd": 2.0,
         "n_splits": 3, "wilcoxon_p_vs_robust": 0.0078, "bcr_splits": [93.0, 95.0, 97.0]},
        {"dataset": "wine", "eta": 0.2, "model": "sklearn", "bcr_mean": 97.44, "bcr_sd": 1.52,
         "n_splits": 3, "wilcoxon_p_vs_robust": float("nan"), "bcr_splits": [96.0, 97.0, 99.3]},
    ]
    table = rmgpc_table2.doc_table(records)
    row = table.splitlines()[2]
    assert row == ("| wine | 20 % | 3 | 97.4 ± 1.5 | 95.0 ± 2.0 ◁ (p 0.0078) | - | - | 97.4 ± 1.5 "
                   "| 96.6 ± 2.7 | 95.5 ± 2.6 | 95.1 ± 3.0 |")
    src, doc = tmp_path / "r.json", tmp_path / "doc.md"
    src.write_text(json.dumps(records))
    doc.write_text("before\n<!-- rmgpc-table2 -->\nold\n<!-- /rmgpc-table2 -->\nafter\n")
    out = rmgpc_table2.main(argparse.Namespace(from_json=str(src), update_doc=str(doc)))
    assert [r["model"] for r in out] == ["robust", "standard", "sklearn"]
    assert doc.read_text() == ("before\n<!-- rmgpc-table2 -->\n" + table
                               + "\n<!-- /rmgpc-table2 -->\nafter\n")


def test_combine_pairs_runs_of_different_models_by_split():
    """Runs of different models on the same seeded splits combine: each p is the signed-rank test of
    the first min(n) paired splits against RMGPC (scipy's wilcoxon on those pairs), NaN when the two
    agree on every pair; a model given twice is refused."""
    from scipy.stats import wilcoxon

    rng = np.random.default_rng(0)
    robust = list(rng.uniform(80, 100, 30))
    worse = [v - d for v, d in zip(robust, rng.uniform(-1, 4, 30))]
    run_a = [{"dataset": "glass", "eta": 0.1, "model": m, "bcr_mean": float(np.mean(s)),
              "bcr_sd": 0.0, "n_splits": 30, "bcr_splits": s}
             for m, s in (("robust", robust), ("sklearn", list(robust)))]
    run_b = [{"dataset": "glass", "eta": 0.1, "model": "heavy-tailed", "bcr_mean": 0.0,
              "bcr_sd": 0.0, "n_splits": 12, "bcr_splits": worse[:12]}]
    out = rmgpc_table2.combine(run_a + run_b)
    by = {r["model"]: r for r in out}
    assert by["heavy-tailed"]["wilcoxon_pairs"] == 12
    assert by["heavy-tailed"]["wilcoxon_p_vs_robust"] == wilcoxon(worse[:12], robust[:12]).pvalue
    assert np.isnan(by["sklearn"]["wilcoxon_p_vs_robust"]) and by["sklearn"]["wilcoxon_pairs"] == 30
    assert np.isnan(by["robust"]["wilcoxon_p_vs_robust"])
    with pytest.raises(ValueError, match="two records"):
        rmgpc_table2.combine(run_a + run_a)


def test_the_docs_show_table2_of_the_committed_records():
    """docs/reproduction.md's Table 2 is the one docs/results/rmgpc-table2.json gives (remade with
    ``gpc reproduce rmgpc-table2 --from-json docs/results/rmgpc-table2.json --update-doc
    docs/reproduction.md``), and the records keep what the issue checks: every RMGPC, SMGPC and HTPC
    cell within the paper's ± sd of its cell, and RMGPC ≥ SMGPC at η = 20 % on every data set."""
    import pathlib

    from gpc.experiments.sep_common import read_records, replace_blocks

    root = pathlib.Path(__file__).resolve().parents[1]
    records = read_records(str(root / "docs" / "results" / "rmgpc-table2.json"))
    text = (root / "docs" / "reproduction.md").read_text(encoding="utf-8")
    assert replace_blocks(text, {"rmgpc-table2": rmgpc_table2.doc_table(records)}) == text
    by = {(r["dataset"], round(r["eta"], 2), r["model"]): r for r in records}
    for (name, eta), paper in rmgpc_table2.PAPER.items():
        for model, (mean, sd) in zip(("robust", "standard", "heavy-tailed"), paper):
            r = by[(name, eta, model)]
            assert len(r["bcr_splits"]) == r["n_splits"]
            assert abs(r["bcr_mean"] - mean) <= sd, (name, eta, model)
        assert by[(name, 0.2, "robust")]["bcr_mean"] >= by[(name, 0.2, "standard")]["bcr_mean"]


def test_the_docs_show_table3_of_the_committed_records():
    """docs/reproduction.md's Table 3 rows are those of docs/results/rmgpc-glass-outliers.json (the
    100-split runs of ``gpc reproduce rmgpc-glass-outliers``, one decimal as printed), and the
    records keep the paper's RMGPC row: each of the seven misclassified in every split where it
    is tested."""
    import pathlib

    from gpc.experiments.sep_common import read_records

    root = pathlib.Path(__file__).resolve().parents[1]
    records = read_records(str(root / "docs" / "results" / "rmgpc-glass-outliers.json"))
    rows = records[1:]
    text = (root / "docs" / "reproduction.md").read_text(encoding="utf-8")

    def doc_row(label):
        line = next(x for x in text.splitlines() if x.startswith(f"| {label} |"))
        return [c.strip() for c in line.strip("|").split("|")[1:]]

    assert doc_row("instance") == [str(r["instance"]) for r in rows]
    assert doc_row("times in the test part (of 100)") == [str(r["times_in_test"]) for r in rows]
    for label, model in (("RMGPC, ours", "robust"), ("SMGPC, ours", "standard"),
                         ("HTPC, ours", "heavy-tailed")):
        assert doc_row(label) == [f"{r[f'test_error_{model}']:.1f}" for r in rows], model
    assert all(r["n_splits"] == 100 and r["test_error_robust"] == 100.0 for r in rows)


@pytest.mark.slow
def test_full_table2_rmgpc_beats_smgpc_at_20_percent():
    recs = rmgpc_table2.main(_args(splits=100, etas=[0.2], datasets=list(rmgpc_table2.DATASETS)))
    by = {(r["dataset"], r["model"]): r["bcr_mean"] for r in recs}
    for name in rmgpc_table2.DATASETS:
        assert by[(name, "robust")] >= by[(name, "standard")]


def test_glass_outliers_figure1_and_paper_instances(tmp_path):
    """`gpc reproduce rmgpc-glass-outliers` without Table 3's splits, MultiClassGPC's default EP
    (about 3 s CPU).  The issue's bar: at least 5 of the paper's 7 instances with P(z = 1) > 0.5 (the
    paper has all 7 between 0.51 and 1.00); each within 0.1 of the paper's value (ours are 0.00-0.06
    above it: the fitted length scale and EP's tolerance differ from the paper's run); and RMGPC
    flags few instances overall (the paper's Fig. 1: most probabilities near 0), so the seven must
    be among the 10 most probable outliers."""
    from gpc.experiments import rmgpc_glass_outliers as go
    args = argparse.Namespace(splits=0, max_iter=500, tol=1e-4, methods=None, datasets=None, seed=0,
                              plots=str(tmp_path))
    recs = go.main(args)
    head, rows = recs[0], recs[1:]
    assert len(head["outlier_probability"]) == 214
    assert [r["instance"] for r in rows] == sorted(go.PAPER_PROBABILITY)
    assert sum(r["outlier_probability"] > 0.5 for r in rows) >= 5
    for r in rows:
        assert abs(r["outlier_probability"] - go.PAPER_PROBABILITY[r["instance"]]) < 0.1
    assert all(r["rank"] <= 10 for r in rows)
    assert np.mean(np.asarray(head["outlier_probability"]) < 0.1) > 0.8
    assert 0.0 < head["rho_mean"] < 0.2      # the Beta(1, 9) prior's mean is 0.1
    assert all(r["times_in_test"] == 0 and r["test_error_robust"] is None for r in rows)
    assert (tmp_path / "rmgpc_glass_outliers.png").stat().st_size > 1000


def test_glass_outliers_table3_counts_use_the_table2_partition(monkeypatch):
    """Table 3's bookkeeping: an instance counts for a split exactly when rmgpc-table2's partition
    puts it in the test part, and a wrong prediction there counts as an error (a stand-in model
    that predicts class 0 everywhere: wrong exactly for instances not of class index 0)."""
    from gpc.experiments import rmgpc_glass_outliers as go
    monkeypatch.setattr(rmgpc_table2, "fit_predict",
                        lambda model, part, *a: np.zeros(len(part.y_test), dtype=int))
    counts = go.misclassified_in_test(["robust"], splits=4, seed=0)["robust"]
    y = np.unique(rmgpc_table2.DATASETS["glass"](binary=False).y, return_inverse=True)[1]
    for i, (wrong, seen) in counts.items():
        parts = [rmgpc_table2.split_data("glass", 0.0, s, 0) for s in range(4)]
        expected_seen = sum(i - 1 in p.test for p in parts)
        assert seen == expected_seen
        assert wrong == (seen if y[i - 1] != 0 else 0)
    assert sum(seen for _, seen in counts.values()) > 0     # splits 2 and 3 hold some of the seven
