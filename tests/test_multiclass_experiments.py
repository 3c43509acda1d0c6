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
    """The CI run: new-thyroid, η = 20 %, 2 splits, EP capped at 50 iterations with tol 1e-3 (about
    5 s CPU; the default 500/1e-4 gives the same BCRs on these splits but 4× the time).

    RMGPC's claim (Table 2, §4.1) is that it beats SMGPC under label noise.  On these two paired
    splits the full-precision run gives RMGPC +3.0 and +8.3 BCR points over SMGPC; the test demands
    a mean margin of 3 points, so it fails if the outlier indicators stop helping (RMGPC falling
    back to SMGPC's behaviour gives a margin near 0)."""
    recs = rmgpc_table2.main(_args(splits=2, max_iter=50, tol=1e-3))
    assert [(r["dataset"], r["eta"], r["model"]) for r in recs] == [
        ("new-thyroid", 0.2, "robust"), ("new-thyroid", 0.2, "standard")]
    by = {r["model"]: r for r in recs}
    for r in recs:
        assert r["n_splits"] == 2 and r["bcr_sd"] >= 0
        # the paper reports 85.9-89.5 % at η = 20 %; two splits of 72 test points can be ±15 % off
        assert 70.0 < r["bcr_mean"] <= 100.0
    assert by["robust"]["bcr_mean"] >= by["standard"]["bcr_mean"] + 3.0
    # two paired splits that differ in the same direction: the signed-rank test's smallest p, 0.5
    assert by["standard"]["wilcoxon_p_vs_robust"] == pytest.approx(0.5)


def test_unknown_names_raise():
    with pytest.raises(ValueError, match="SVMguide2"):
        rmgpc_table2.main(_args(datasets=["svmguide2"]))
    with pytest.raises(ValueError, match="unknown model"):
        rmgpc_table2.main(_args(methods=["htpc"]))
    with pytest.raises(ValueError, match="--max-iter"):
        rmgpc_table2.main(_args(max_iter=0))


@pytest.mark.slow
def test_full_table2_rmgpc_beats_smgpc_at_20_percent():
    recs = rmgpc_table2.main(_args(splits=100, etas=[0.2], datasets=list(rmgpc_table2.DATASETS)))
    by = {(r["dataset"], r["model"]): r["bcr_mean"] for r in recs}
    for name in rmgpc_table2.DATASETS:
        assert by[(name, "robust")] >= by[(name, "standard")]
