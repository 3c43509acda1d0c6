"""``gpc reproduce``: a reduced run of every experiment (CI), the full runs behind ``slow``.

Reduced runs use few folds, one data set, a small grid; together they stay well under a minute.
An unknown method name fails with a message naming it and the known ones.
"""

import json

import numpy as np
import pytest
from scipy.stats import multivariate_normal

from helpers import run_cli
from gpc.experiments._ais import ais_log_z, ais_log_z_from_gaussian
from gpc.experiments._common import map_tasks
from gpc.inference import infer

PL_KEYS = {"dataset", "likelihood", "method", "error_mean", "error_se", "n_folds"}


def reproduce(name, tmp_path, capsys, *extra):
    out = tmp_path / f"{name}.json"
    code, stdout, err = run_cli(["reproduce", name, "--quiet", "--out", str(out), "--plots",
                                 str(tmp_path / "figs"), *extra], capsys)
    assert code == 0, err
    return json.loads(out.read_text()), stdout


def pngs(tmp_path):
    return sorted(p.name for p in (tmp_path / "figs").glob("*.png") if p.stat().st_size > 2000)


# -- pl-table1 ------------------------------------------------------------------------------------
def test_pl_table1_reduced_laplace(tmp_path, capsys):
    recs, stdout = reproduce("pl-table1", tmp_path, capsys, "--methods", "laplace", "--datasets", "crabs",
                             "--folds", "2")
    assert "(0.050)" in stdout                      # the paper's number printed next to ours
    assert [(r["likelihood"], r["method"]) for r in recs] == [("probit", "laplace"), ("logit", "laplace")]
    for r in recs:
        assert PL_KEYS <= set(r) and r["dataset"] == "crabs" and r["n_folds"] == 2
        assert 0.0 <= r["error_mean"] < 0.2
    assert pngs(tmp_path) == ["pl-table1.png"]


def test_pl_table1_reduced_all_methods(tmp_path, capsys):
    # one EP and one PL schedule keep this under ~20 s; the full table is the slow test
    recs, _ = reproduce("pl-table1", tmp_path, capsys, "--datasets", "crabs", "--folds", "2",
                        "--likelihoods", "probit", "--methods", "pep", "spl")
    assert {(r["likelihood"], r["method"]) for r in recs} == {("probit", "pep"), ("probit", "spl")}
    for r in recs:
        assert r["n_folds"] == 2 and r["error_mean"] is not None and r["error_mean"] < 0.15, r


def test_pl_table1_names_unknown_methods(capsys):
    code, _, err = run_cli(["reproduce", "pl-table1", "--datasets", "crabs", "--folds", "2",
                            "--methods", "pep", "no-such-method"], capsys)
    assert code == 2
    assert "'no-such-method'" in err and "pep" in err.split("choose from", 1)[-1]


def test_pl_table1_gh_order_default_adds_logit_rows(tmp_path, capsys):
    recs, _ = reproduce("pl-table1", tmp_path, capsys, "--methods", "laplace", "--datasets", "crabs",
                        "--folds", "2", "--likelihoods", "logit", "--gh-order", "10", "default")
    assert sorted(r["gh_order"] for r in recs)[0] == 10 and len(recs) == 2


# -- pl-figure1 -----------------------------------------------------------------------------------
def test_pl_figure1(tmp_path, capsys):
    recs, stdout = reproduce("pl-figure1", tmp_path, capsys, "--iterations", "6")
    by = {r["method"]: r for r in recs}
    exact = np.asarray(by["exact"]["mean"])
    pl = np.asarray(by["pl-parallel"]["mean"])
    assert np.allclose(pl, by["pl-sequential"]["mean"], atol=1e-3)
    assert pl[0] > 0 or pl[1] > exact[1]            # moved off the prior towards the likelihood's mass
    assert by["ep sequential (1, 2)"]["failed"]
    assert by["ep sequential (1, 2)"]["without_fixes"]["cavity_variance"] == pytest.approx(-117.9, abs=0.05)
    assert "EP" in stdout
    assert pngs(tmp_path) == ["pl-figure1.png"]


def test_pl_figure1_exact_posterior_by_grid():
    """The grid's log Z equals the orthant probabilities of the prior weighted by the likelihood."""
    from gpc.experiments.pl_figure1 import EPS, PRIOR_COV, PRIOR_MEAN, exact_posterior

    mvn = multivariate_normal(PRIOR_MEAN, PRIOR_COV)
    p_nn = mvn.cdf([0.0, 0.0])                       # both negative
    p1n = multivariate_normal(PRIOR_MEAN[0], 1.0).cdf(0.0)
    p2n = multivariate_normal(PRIOR_MEAN[1], 1.0).cdf(0.0)
    p_pp = 1 - p1n - p2n + p_nn
    p_pn, p_np = p2n - p_nn, p1n - p_nn
    hi, lo = 1 - EPS, EPS
    Z = p_pp * hi * hi + (p_pn + p_np) * hi * lo + p_nn * lo * lo
    assert exact_posterior(n_grid=800)["log_z"] == pytest.approx(np.log(Z), abs=1e-3)


# -- mf-pima / mf-online --------------------------------------------------------------------------
def test_mf_pima_reduced(tmp_path, capsys):
    recs, stdout = reproduce("mf-pima", tmp_path, capsys, "--max-iter", "3")
    assert "paper" in stdout
    assert {(r["minimised"], r["method"]) for r in recs} == {
        (a, b) for a in ("mf-ensemble", "mf-naive") for b in ("mf-ensemble", "mf-naive")}
    for r in recs:
        assert 0 < r["test_errors"] < 332 * 0.4 and r["n_test"] == 332
    assert pngs(tmp_path) == ["mf-pima.png"]


def test_mf_online_reduced(tmp_path, capsys):
    recs, stdout = reproduce("mf-online", tmp_path, capsys, "--datasets", "crabs", "--sweeps", "2")
    r = recs[0]
    assert r["dataset"] == "crabs" and len(r["train_error"]) == 2 * r["n_train"] == 160
    assert r["relative_difference_vs_n_sweeps"] < 1e-8     # streaming = the method's own re-use sweeps
    assert r["test_error_end_of_sweep"][0] < 0.15
    assert pngs(tmp_path) == ["mf-online.png"]


# -- nr-bounds ------------------------------------------------------------------------------------
def test_ais_matches_exact_two_points():
    K = np.array([[2.0, 1.2], [1.2, 1.5]])
    y = np.array([1.0, -1.0])
    D = np.diag(y)
    log_z = np.log(multivariate_normal([0, 0], D @ K @ D + np.eye(2)).cdf([0, 0]))
    lz, se, _ = ais_log_z(K, y, "probit", n_temps=200, n_chains=64, seed=1)
    assert abs(lz - log_z) < max(4 * se, 0.05)
    q = infer(K, y, "probit", "laplace")
    lz, se, _ = ais_log_z_from_gaussian(K, y, "probit", q.mean, q.site_precision, n_temps=100,
                                        n_chains=64, seed=1)
    assert abs(lz - log_z) < max(4 * se, 0.02)


def test_nr_bounds_reduced(tmp_path, capsys):
    recs, stdout = reproduce("nr-bounds", tmp_path, capsys, "--methods", "laplace", "kl", "vb",
                             "--grid", "2", "2", "--n-train", "40", "--ais-temps", "100",
                             "--ais-chains", "8", "--ais-start", "kl")
    ais = [r for r in recs if r["method"] == "ais"]
    assert len(ais) == 4 and all(np.isfinite(r["log_evidence"]) for r in ais)
    for m in ("laplace", "kl", "vb"):
        rs = [r for r in recs if r["method"] == m]
        assert len(rs) == 4 and all(0 <= r["test_error"] <= 1 and r["test_loglik"] < 0 for r in rs)
    for a in ais:                                    # the bounds: VB ≤ KL ≤ ln Z (within AIS error)
        kl, vb = (next(r for r in recs if r["method"] == m and r["ln_ell"] == a["ln_ell"]
                       and r["ln_sigma_f"] == a["ln_sigma_f"]) for m in ("kl", "vb"))
        assert vb["log_evidence"] <= kl["log_evidence"] + 1e-6
        if not a["ais_unreliable"]:
            assert kl["log_evidence"] <= a["log_evidence"] + 3 * a["log_evidence_se"] + 0.1
    assert pngs(tmp_path) == ["nr-bounds-error.png", "nr-bounds-evidence.png", "nr-bounds-gap.png",
                              "nr-bounds-testll.png"]


def _blas_threads(_):
    from threadpoolctl import threadpool_info
    return max(p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas")


def test_parallel_workers_share_the_cores():
    # --jobs N workers must not each start one BLAS thread per core (they spin against each other)
    import os
    per_worker = max(1, (os.cpu_count() or 1) // 2)
    assert map_tasks(_blas_threads, [0, 1, 2], jobs=2, show=False) == [per_worker] * 3


# -- the full runs ----------------------------------------------------------------------------------
@pytest.mark.slow
def test_pl_table1_full(tmp_path, capsys):
    recs, _ = reproduce("pl-table1", tmp_path, capsys, "--jobs", "2")
    assert len(recs) == 6 * 14
    for r in recs:
        assert r["n_folds"] == 10
        # every cell within 0.05 of the paper's error where the paper's method worked (paper < 0.15)
        # and the method reaches its fixed point in the protocol's 10 iterations; undamped parallel
        # PL with the noisy threshold on thyroid does not (docs/reproduction.md §1), and there the
        # claim is only that it beats guessing the majority class (error 0.30)
        if (r["dataset"], r["likelihood"], r["method"]) == ("thyroid", "noisy_threshold", "ppl"):
            assert r["error_mean"] < 0.30, r
        elif r["paper"] is not None and r["paper"] < 0.15:
            assert r["error_mean"] < r["paper"] + 0.05, r
        else:                                        # the paper's failures (PEP): ours must not fail
            assert r["error_mean"] < 0.15, r


@pytest.mark.slow
def test_mf_pima_full(tmp_path, capsys):
    recs, _ = reproduce("mf-pima", tmp_path, capsys)
    for r in recs:
        assert abs(r["test_errors"] - r["paper_test_errors"]) <= 10
    own = [r for r in recs if r["minimised"] == r["method"]]
    for r in own:
        assert r["free_energy"] == pytest.approx(r["paper_free_energy"], abs=1.0)


@pytest.mark.slow
def test_mf_online_full(tmp_path, capsys):
    recs, _ = reproduce("mf-online", tmp_path, capsys)
    sonar = next(r for r in recs if r["dataset"] == "sonar")
    assert sonar["train_error_end_of_sweep"][0] == 0.0     # MF: one sweep reaches zero training error


@pytest.mark.slow
def test_nr_bounds_full(tmp_path, capsys):
    recs, _ = reproduce("nr-bounds", tmp_path, capsys)
    assert len([r for r in recs if r["method"] == "ais"]) == 25


@pytest.mark.slow
def test_pl_figure1_full(tmp_path, capsys):
    recs, _ = reproduce("pl-figure1", tmp_path, capsys)
    by = {r["method"]: r for r in recs}
    for label in ("ep sequential (1, 2)", "ep parallel"):     # (2, 1): see docs/reproduction.md
        r = by[label]["without_fixes"]
        assert r["failed"] and r["cavity_variance"] == pytest.approx(by[label]["paper_cavity_variance"],
                                                                     rel=0.01)
        assert by[label]["failed"]                        # gpc's EP raises NegativeVarianceError
