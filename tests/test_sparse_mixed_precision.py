"""precision="mixed" of minibatch SEP: the rows' b x m x m products in float32 (gpc._sparse's
float specialisations), the marginals, sites, q and evidence in float64.

Tolerances: float32 rounds to a relative 2^-24 ≈ 6e-8.  A block's products (a whitened row, its
marginals, a Gram sum) add m terms each, so their relative error is at most about m · 6e-8
(1e-5 at m = 200, usually √m · 6e-8); the marginals and sums built from them, and a fit of a few
epochs that follows them, carry errors of that order, far below the float64 fit's own distance
from the optimum.
"""

import numpy as np
import pytest
from sklearn.base import clone

from gpc import SparseGaussianProcessClassifier, _sparse
from gpc.inference.rules import Rule
from gpc.kernels import RBF, ConstantKernel
from gpc.likelihoods import get_likelihood


def _problem(n=3000, seed=3):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, 3))
    f = np.sin(2 * X[:, 0]) + X[:, 1] ** 2 - 1
    return X, (f + 0.3 * rng.standard_normal(n) > 0).astype(int)


def _fit(X, y, **kw):
    params = dict(kernel=ConstantKernel(1.0) * RBF([1.0] * 3), n_inducing=40, batch_size=500,
                  max_iter=3, random_state=0, progress=False, n_jobs=2)
    params.update(kw)
    return SparseGaussianProcessClassifier(**params).fit(X, y)


def _nll(clf, X, y):
    p = np.clip(clf.predict_proba(X)[:, 1], 1e-12, 1 - 1e-12)
    return -np.mean(np.log(np.where(y == clf.classes_[1], p, 1 - p)))


@pytest.mark.parametrize("method", ["ep", "pl"])
def test_mixed_fit_agrees_with_float64(method):
    X, y = _problem()
    Xt, yt = _problem(1000, seed=4)
    ref = _fit(X, y, method=method)
    mixed = _fit(X, y, method=method, precision="mixed")
    assert mixed._problems[0][0].state.dtype == np.float32
    # the float32 path ran: not the float64 bits
    assert mixed.log_marginal_likelihood_value_ != ref.log_marginal_likelihood_value_
    # log Z_q sums n terms of O(1): relative 1e-5 is the blocks' m · 2^-24 bound
    assert mixed.log_marginal_likelihood_value_ == pytest.approx(
        ref.log_marginal_likelihood_value_, rel=1e-5)
    np.testing.assert_allclose(mixed.inducing_points_, ref.inducing_points_, atol=1e-4)
    np.testing.assert_allclose(mixed.predict_proba(Xt), ref.predict_proba(Xt), atol=1e-4)
    assert abs(_nll(mixed, Xt, yt) - _nll(ref, Xt, yt)) < 1e-5


def _block(k=70, m=30, seed=0):
    """One block of whitened rows against a proper q, with kept sites along old directions."""
    rng = np.random.default_rng(seed)
    M = rng.standard_normal((m, m)) / np.sqrt(m)
    L = np.linalg.cholesky(M @ M.T + np.eye(m))
    Li = np.linalg.inv(L)
    Ri = np.linalg.inv(np.linalg.cholesky(np.eye(m) + 0.3 * M @ M.T))
    K = rng.standard_normal((k, m)) @ L.T * 0.2
    A = K @ Li.T
    y = np.where(rng.standard_normal(k) > 0, 1.0, -1.0)
    tau = np.abs(rng.standard_normal(k)) * 0.3
    tau[::5] = 0.0
    nu = 0.2 * y * (tau > 0)
    V_old = np.ascontiguousarray(((A + 0.01 * rng.standard_normal((k, m))) @ Li), np.float32)
    return dict(K=K, A=A, y=y, s=np.full(k, 0.2), Ri=np.tril(Ri), mu=0.3 * rng.standard_normal(m),
                tau=tau, nu=nu, V_old=V_old, L=L, Li=np.tril(Li), kdiag=np.full(k, 2.0))


def _run_block(b, dtype):
    """whiten_block, refine_block (SUMS_SWAP) and evidence_block (u-space) in ``dtype``."""
    spec, codes = get_likelihood("probit").compiled_spec(), Rule("ep").codes
    k, m = b["A"].shape
    f = {name: np.ascontiguousarray(b[name], dtype) for name in ("Ri", "L", "Li")}
    A, s = np.empty((k, m), dtype), np.empty(k)
    _sparse.whiten_block(f["Li"], np.ascontiguousarray(b["K"], dtype), A, b["kdiag"], s)
    t_new, n_new, dP, dh = np.empty(k), np.empty(k), np.empty((m, m)), np.empty(m)
    V = np.empty((k, m), dtype)
    status = _sparse.refine_block(*spec, *codes, 1.0, _sparse.SUMS_SWAP, b["y"], A, b["s"],
                                  f["Ri"], b["mu"], b["tau"], b["nu"], t_new, n_new, dP, dh,
                                  b["V_old"], f["L"], f["Li"], V)[0]
    assert status == 0
    RiLi = np.ascontiguousarray(np.tril(b["Ri"] @ b["Li"]), dtype)
    g_s, G, AtG = np.empty(k), np.empty((k, m), dtype), np.empty((m, m))
    total, bad = _sparse.evidence_block(*spec, codes[0], True, b["y"], A, b["s"], f["Ri"],
                                        b["mu"], t_new, n_new, g_s, G, AtG, f["Li"], RiLi, V)
    assert bad == 0
    return dict(A=A, s=s, tau=t_new, nu=n_new, dP=np.tril(dP), dh=dh, V=V, total=total, g_s=g_s,
                G=G, AtG=AtG)


def test_float_blocks_agree_with_double_blocks():
    """The float32 specialisations compute the double ones' quantities, to the float32 rounding
    of m-term sums (m = 30: 30 · 2^-24 ≈ 2e-6 relative to the terms' scale)."""
    b = _block()
    ref, mixed = _run_block(b, np.float64), _run_block(b, np.float32)
    assert mixed["A"].dtype == np.float32 and mixed["V"].dtype == np.float32
    assert mixed["G"].dtype == np.float32
    for name in ref:
        x, r = np.asarray(mixed[name], dtype=np.float64), np.asarray(ref[name])
        assert not np.array_equal(x, r) or name in ("tau", "nu")   # really rounded
        np.testing.assert_allclose(x, r, rtol=0, atol=2e-5 * max(1.0, np.max(np.abs(r))),
                                   err_msg=name)


def test_float64_is_the_default_and_unchanged():
    X, y = _problem()
    assert SparseGaussianProcessClassifier().get_params()["precision"] == "float64"
    default, explicit = _fit(X, y, max_iter=2), _fit(X, y, max_iter=2, precision="float64")
    assert default._problems[0][0].state.dtype == np.float64
    assert default.log_marginal_likelihood_value_ == explicit.log_marginal_likelihood_value_
    np.testing.assert_array_equal(default.predict_proba(X[:200]), explicit.predict_proba(X[:200]))


def test_precision_is_a_parameter():
    clf = SparseGaussianProcessClassifier(precision="mixed")
    assert clf.get_params()["precision"] == "mixed"
    assert clone(clf).precision == "mixed"
    assert clf.set_params(precision="float64").precision == "float64"


@pytest.mark.parametrize("precision", ["float32", "half", None, "Mixed"])
def test_invalid_precision_raises(precision):
    X, y = _problem(600)
    with pytest.raises(ValueError, match="precision must be one of"):
        _fit(X, y, precision=precision, max_iter=1)


@pytest.mark.parametrize("kw, match", [
    (dict(batch_size=None), "minibatch SEP only"),
    (dict(batch_size=5000), "minibatch SEP only"),          # n rows or more: batch training
    (dict(tied_sites=True), "per-row sites only"),
    (dict(method="svi"), "per-row sites only"),
    (dict(method="gfitc", batch_size=None), "per-row sites only"),
])
def test_mixed_outside_minibatch_sep_raises(kw, match):
    X, y = _problem(600)
    with pytest.raises(ValueError, match=match):
        _fit(X, y, precision="mixed", max_iter=1, **kw)
