"""gpc reproduce smgpc-authors: gpc's side of the comparison with the authors' R code, on one small
split, and the set-up details that must match the R scripts."""

import argparse
import json

import numpy as np
import pytest
from scipy.spatial.distance import pdist

from gpc.experiments import reproduce, smgpc_authors
from gpc.experiments.smgpc_authors import (EPS_AUTHORS, authors_lbfgsb, class_rows, kernel,
                                           length_scale, make_classifier, read_authors,
                                           standardise, summarise)


def _args(*argv):
    parser = argparse.ArgumentParser()
    reproduce.add_parsers(parser.add_subparsers(dest="cmd"))
    return parser.parse_args(["reproduce", "smgpc-authors", *argv])


def test_their_kernel_is_gpc_kernel_at_sqrt_l():
    # R: sigma * exp(-0.5 * ||x/sqrt(l) - x'/sqrt(l)||^2) + sigma0 on the diagonal, l = median distance
    rng = np.random.default_rng(0)
    X = rng.normal(size=(30, 4))
    l_r = np.median(pdist(X))
    ell = length_scale(X)
    assert ell == pytest.approx(np.sqrt(l_r))
    K = kernel(4, ell)(X)
    D2 = ((X[:, None, :] - X[None, :, :]) ** 2).sum(-1)
    assert np.allclose(K, np.exp(-0.5 * D2 / l_r) + np.eye(30))


def test_standardise_uses_r_sd():
    X = np.array([[1.0, 5.0], [2.0, 5.0], [4.0, 5.0]])
    Xs, Xt = standardise(X, X[:1])
    assert np.allclose(Xs[:, 0].std(ddof=1), 1.0) and np.allclose(Xs[:, 1], 0.0)
    assert np.allclose(Xt, Xs[:1])


def test_vi_label_noise_is_theirs():
    # their likelihood: (1 - eps) + eps/C on the argmax class; gpc's: 1 - label_noise
    for C in (3, 6):
        clf = make_classifier("vi", np.zeros((C, 3, 2)), 1.0, C, 5, 0)
        assert 1 - clf.label_noise == pytest.approx(1 - EPS_AUTHORS + EPS_AUTHORS / C)
        assert clf.label_noise_bounds == "fixed"
    Zs = np.zeros((3, 3, 2))
    assert make_classifier("ep", Zs, 1.0, 3, 5, 0).model == "standard"
    assert make_classifier("sep", Zs, 1.0, 3, 5, 0).tied_sites


def test_each_class_starts_at_its_own_random_rows():
    rows = class_rows(50, 10, 4, seed=3)
    assert rows.shape == (4, 10)
    for r in rows:
        assert len(np.unique(r)) == 10 and np.all(np.diff(r) > 0) and r.max() < 50
    assert not np.array_equal(rows[0], rows[1])
    np.testing.assert_array_equal(rows, class_rows(50, 10, 4, seed=3))


def test_authors_lbfgsb_steps_in_log_l():
    """L-BFGS-B's first step is steepest descent in its coordinates: in log l = 2 log ℓ, a
    length-scale entry moves by a quarter of what it would in log ℓ (relative to the others)."""
    target = np.array([1.0, -2.0, 0.5, 3.0])
    seen = []

    def obj_func(theta, eval_gradient=True):
        seen.append(np.array(theta))
        r = theta - target
        return 0.5 * r @ r, r

    mask = [False, True, True]
    bounds = np.tile([-np.inf, np.inf], (4, 1))
    theta, _ = authors_lbfgsb(obj_func, np.zeros(4), bounds, mask, 50)
    np.testing.assert_allclose(theta, target, atol=1e-6)
    step, grad = seen[1] - seen[0], seen[0] - target
    ratio = step / -grad
    assert np.all(ratio > 0)
    np.testing.assert_allclose(ratio[[1, 2]], ratio[0] / 4, rtol=1e-12)
    np.testing.assert_allclose(ratio[3], ratio[0], rtol=1e-12)
    boxed, _ = authors_lbfgsb(obj_func, np.zeros(4), np.array([[-1, 0.5]] * 4), mask, 50)
    np.testing.assert_allclose(boxed, np.clip(target, -1, 0.5), atol=1e-8)


def test_command_on_one_split(tmp_path, capsys):
    rec = {"dataset": "wine", "method": "ep", "split": 1, "m": 100, "error": 0.25, "nll": 0.5,
           "cpu_s": 12.0}
    (tmp_path / "wine.jsonl").write_text(json.dumps(rec) + "\n")
    assert read_authors(str(tmp_path)) == [rec]
    args = _args("--datasets", "wine", "--methods", "ep", "vi", "--n-inducing", "10",
                 "--iterations", "3", "--authors", str(tmp_path), "--quiet")
    ours = smgpc_authors.main(args)
    assert [(r["dataset"], r["method"], r["split"], r["m"]) for r in ours] == [
        ("wine", "ep", 1, 10), ("wine", "vi", 1, 10)]
    for r in ours:
        assert 0.0 <= r["error"] <= 1.0 and r["nll"] > 0
    # EP: 3 passes; VI: 3 L-BFGS-B iterations, each of one evaluation or more (and the start's)
    assert ours[0]["n_iter"] == 3 and 4 <= ours[1]["n_iter"] <= 3 * 3
    out = capsys.readouterr().out
    assert "wine" in out and "0.250" in out
    rows = summarise(ours[:1], [rec])
    assert rows[0]["n_both"] == 1 and rows[0]["authors_cpu_s_mean"] == 12.0
    assert rows[0]["gpc_error_mean"] == ours[0]["error"]


def test_every_set_has_its_rows_and_a_set_without_r_records_is_not_fitted(tmp_path):
    rec = {"dataset": "wine", "method": "ep", "split": 2, "m": 100, "error": 0.1, "nll": 0.3,
           "cpu_s": 10.0}
    (tmp_path / "wine.jsonl").write_text(json.dumps(rec) + "\n")
    args = _args("--datasets", "satellite", "wine", "--methods", "ep", "--n-inducing", "10",
                 "--iterations", "2", "--authors", str(tmp_path), "--quiet")
    ours = smgpc_authors.main(args)
    # only the split the R records hold, and nothing on satellite, which they do not cover
    assert [(r["dataset"], r["split"]) for r in ours] == [("wine", 2)]
    rows = smgpc_authors.every_cell(summarise(ours, [rec]))
    assert [(r["dataset"], r["method"]) for r in rows] == [
        (name, meth) for name in smgpc_authors.SETS for meth in smgpc_authors.METHODS]
    lines = smgpc_authors.doc_tables(rows)["smgpc-authors:table"].splitlines()
    cells = {tuple(c.strip() for c in line.strip("|").split("|"))[:2]: line for line in lines}
    assert cells[("satellite", "VI")].count("—") == 8        # splits and every value column
    assert cells[("wine", "SEP")].count("—") == 8
    wine_ep = cells[("wine", "EP")]
    assert "—" not in wine_ep and "0.100 ± 0.000" in wine_ep


def test_authors_rates_quarter_length_scale_steps_and_sum_sign():
    # entries: [log sigma2, log ell_0, log ell_1, log sigma0^2]; theirs move log l = 2 log ell
    from gpc.experiments.smgpc_authors import AuthorsRates
    opt = AuthorsRates(4, 1.0, [False, True, True, False])
    g1 = np.array([1.0, 2.0, -1.0, 1.0])
    assert np.allclose(opt.step(g1), 0.01 * g1 * [1, 0.25, 0.25, 1])
    # the l gradients now sum to +2: log ell_0's own sign flips (+ to -) but its previous sign
    # has the sum's, so its rate grows (R: sign$l == sign(sum(grad$gr_log_l))); log ell_1's
    # previous sign (-) has not, so its rate halves; the others compare their own two signs
    opt.step(np.array([-1.0, -1.0, 3.0, 1.0]))
    assert np.allclose(opt.rates, [0.005, 0.0102, 0.005, 0.0102])
    opt.step(np.array([1.0, 1.0, 1.0, 1.0]))       # sum +: log ell_0's previous sign (-) has not
    assert np.allclose(opt.rates, [0.0025, 0.0051, 0.0051, 0.0102 * 1.02])


def test_authors_rates_mark_every_class_length_scales():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(30, 2))
    y = np.repeat([0, 1, 2], 10)
    clf = make_classifier("ep", np.stack([X[:4], X[4:8], X[8:12]]), 1.0, 3, 1, 0).fit(X, y)
    opt = clf._state.optimizer
    assert type(opt).__name__ == "AuthorsRates"
    # per class [constant, ell_0, ell_1, noise], then the three Z's (4 x 2 each)
    per_class = [False, True, True, False]
    assert opt.length_scales.tolist() == per_class * 3 + [False] * 24
