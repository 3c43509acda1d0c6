"""Kernels bound to inducing inputs (Kernel._bound_to): the sparse engine's K_uu, K_bu, diag K_bb
and their gradients, the squared exponential's compiled path against independent code, finite
differences and bad input."""

import numpy as np
import pytest
from sklearn.gaussian_process import kernels as sk

from gpc import _kernels
from gpc.kernels import RBF, ConstantKernel, Kernel, Matern, WhiteKernel, as_kernel
from gpc.kernels.base import BoundKernel

LS3 = np.array([0.6, 1.3, 2.1])

# the squared exponential alone and times a constant, isotropic and ARD, with every combination
# of free and fixed hyperparameters (which decides which entries θ and its gradient have)
COMPILED = {
    "rbf_iso": lambda: RBF(1.3),
    "rbf_ard": lambda: RBF(LS3),
    "rbf_fixed": lambda: RBF(LS3, "fixed"),
    "const_rbf_ard": lambda: ConstantKernel(2.5) * RBF(LS3),
    "const_rbf_iso": lambda: ConstantKernel(0.4) * RBF(0.9),
    "rbf_ard_const": lambda: RBF(LS3) * ConstantKernel(2.5),
    "rbf_iso_const": lambda: RBF(1.7) * ConstantKernel(0.3),
    "fixed_const_rbf": lambda: ConstantKernel(2.5, "fixed") * RBF(LS3),
    "const_fixed_rbf": lambda: ConstantKernel(2.5) * RBF(LS3, "fixed"),
    "fixed_rbf_const": lambda: RBF(1.2, "fixed") * ConstantKernel(2.5),
    "all_fixed": lambda: ConstantKernel(2.5, "fixed") * RBF(LS3, "fixed"),
    "sk_const_rbf": lambda: as_kernel(sk.ConstantKernel(2.5) * sk.RBF(LS3)),
}


def _problem(b=23, m=7, seed=0):
    # off-centre inputs (|x| ~ 5): the shift by the mean of Z must keep the distances exact
    rng = np.random.default_rng(seed)
    X, Z = rng.normal(size=(b, 3)) + 5.0, rng.normal(size=(m, 3)) + 5.0
    return X, Z, rng.normal(size=(b, m)), rng.normal(size=b)


def _objective(kernel, X, Z, G, w):
    """F = Σ G ∘ K(X, Z) + Σ w ∘ diag K(X, X) through the kernel's public calls."""
    return float(np.vdot(G, kernel(X, Z)) + w @ kernel.diag(X))


def _central_differences(f, x, h=1e-6):
    """∂f/∂x of a scalar function of an array, by central differences entry by entry."""
    g = np.empty_like(x)
    for at in np.ndindex(*x.shape):
        up, down = x.copy(), x.copy()
        up[at] += h
        down[at] -= h
        g[at] = (f(up) - f(down)) / (2 * h)
    return g


@pytest.mark.parametrize("name", sorted(COMPILED))
def test_the_compiled_bound_agrees_with_the_generic_path(name):
    # the generic bound object forwards to the kernel's Python methods; the reference for the
    # gradient is Kernel._cross_gradient, the stacked contraction over [X; Z] (gradient_contract
    # and gradient_inputs, independent code).  Both sides are the same sums in another order of
    # rounding (dgemm against NumPy's products, shifts by the mean of Z or of X): on O(1) terms,
    # O(100) of them, 1e-12 of the largest entry is rounding with a margin
    kernel = COMPILED[name]()
    X, Z, G, w = _problem()
    bound = kernel._bound_to(Z)
    assert type(bound) is not BoundKernel and bound.nogil and bound.row_work > 0
    generic = BoundKernel(kernel, Z)
    close(bound.cross(X), kernel(X, Z), 1e-12)
    close(bound.diag(X), kernel.diag(X), 1e-15)
    close(bound.gram(), generic.gram(), 1e-12)
    np.testing.assert_array_equal(np.diag(bound.gram()), kernel.diag(Z))      # exact diagonal
    stacked = Kernel._cross_gradient(kernel, X, Z, G, w)
    for K in (None, kernel(X, Z)):
        g_theta, g_Z = bound.cross_gradient(X, G.copy(), w, None if K is None else K.copy())
        assert g_theta.shape == kernel.theta.shape
        close(g_theta, stacked[0], 1e-12)
        close(g_Z, stacked[1], 1e-12)
    # the K_uu part against K(Z)'s own gradient tensor (eval_gradient, independent code)
    Gs = G[:7] + G[:7].T
    K, dK = kernel(Z, eval_gradient=True)
    g_theta, g_Z = bound.gram_gradient(Gs.copy(), bound.gram())
    close(g_theta, np.einsum("ij,ijk->k", Gs, dK), 1e-12)
    close(g_Z, generic.gram_gradient(Gs.copy(), bound.gram())[1], 1e-12)
    # in Z by central differences of Σ G ∘ K(Z) (step 1e-6: see the finite-difference test)
    close(g_Z, _central_differences(lambda Zh: float(np.vdot(Gs, kernel(Zh))), Z), 1e-6)


@pytest.mark.parametrize("name", ["rbf_iso", "rbf_ard", "const_rbf_ard", "rbf_iso_const",
                                  "fixed_const_rbf", "const_fixed_rbf"])
def test_the_compiled_gradient_is_the_finite_difference(name):
    # central differences of F in log θ and in Z; step h = 1e-6 on O(1) quantities: truncation
    # ~h² = 1e-12, rounding ~1e-14 |F| / h ~ 1e-8, so 1e-6 of the largest entry (a wrong factor
    # or sign is O(1))
    kernel = COMPILED[name]()
    X, Z, G, w = _problem(seed=3)
    g_theta, g_Z = kernel._bound_to(Z).cross_gradient(X, G.copy(), w)
    close(g_theta, _central_differences(
        lambda theta: _objective(kernel.clone_with_theta(theta), X, Z, G, w), kernel.theta), 1e-6)
    close(g_Z, _central_differences(lambda Zh: _objective(kernel, X, Zh, G, w), Z), 1e-6)


@pytest.mark.parametrize("edges", [list(range(24)), [0, 1, 9, 10, 23], [0, 20, 23]])
def test_chunks_of_any_size_make_the_whole_block(edges):
    # chunks of one row and of uneven sizes: K_bu row by row is the whole block's bits (each
    # entry comes from its own row and V only); the gradients' chunk sums are the whole to
    # rounding (1e-13 of the largest entry: a few more additions in another order)
    kernel = COMPILED["const_rbf_ard"]()
    X, Z, G, w = _problem()
    bound = kernel._bound_to(Z)
    whole = bound.cross(X)
    K = np.full_like(whole, np.nan)
    g_theta, g_Z = np.zeros(kernel.n_dims), np.zeros_like(Z)
    for a, c in zip(edges[:-1], edges[1:]):
        bound.cross(X[a:c], K[a:c])
        gt, gz = bound.cross_gradient(X[a:c], G[a:c].copy(), w[a:c], whole[a:c])
        g_theta += gt
        g_Z += gz
    np.testing.assert_array_equal(K, whole)
    expected = bound.cross_gradient(X, G.copy(), w, whole)
    close(g_theta, expected[0], 1e-13)
    close(g_Z, expected[1], 1e-13)


def test_an_empty_chunk_contributes_nothing():
    kernel = COMPILED["const_rbf_ard"]()
    X, Z, G, w = _problem()
    bound = kernel._bound_to(Z)
    assert bound.cross(X[:0]).shape == (0, 7)
    g_theta, g_Z = bound.cross_gradient(X[:0], G[:0].copy(), w[:0])
    np.testing.assert_array_equal(g_theta, np.zeros(kernel.n_dims))
    np.testing.assert_array_equal(g_Z, np.zeros_like(Z))


@pytest.mark.parametrize("kernel, compiled", [
    (RBF(1.0), True),
    (ConstantKernel(2.0) * RBF(LS3), True),
    (RBF(LS3) * ConstantKernel(2.0), True),
    (as_kernel(sk.ConstantKernel(2.0) * sk.RBF(1.0)), True),
    (Matern(1.0, nu=1.5), False),
    (ConstantKernel(2.0) * Matern(1.0), False),
    (RBF(1.0) + WhiteKernel(0.1), False),
    (RBF(1.0) * RBF(2.0), False),
    (ConstantKernel(2.0) * ConstantKernel(3.0), False),
    (as_kernel(sk.RationalQuadratic(1.5, 2.0)), False),
])
def test_the_kernel_chooses_its_bound_object(kernel, compiled):
    # the compiled path is the kernel's own choice; every other kernel gets the generic object,
    # which computes what the kernel's methods compute
    X, Z, G, w = _problem()
    bound = kernel._bound_to(Z)
    assert bound.nogil is compiled and (type(bound) is BoundKernel) is not compiled
    close(bound.cross(X), kernel(X, Z), 1e-12)
    close(bound.diag(X), kernel.diag(X), 1e-15)


def test_a_bound_object_is_made_from_the_parameters_as_they_are():
    # nothing is cached on the kernels: a product bound after set_params sees the new values
    kernel = ConstantKernel(2.0) * RBF(1.0)
    X, Z, _, _ = _problem()
    before = kernel._bound_to(Z).cross(X)
    kernel.set_params(k1__constant_value=3.0, k2__length_scale=0.5)
    close(kernel._bound_to(Z).cross(X), kernel(X, Z), 1e-12)
    kernel.k2 = Matern(0.5)
    assert not kernel._bound_to(Z).nogil
    assert not np.allclose(kernel._bound_to(Z).cross(X), before)


@pytest.mark.parametrize("name", ["rbf_iso", "rbf_ard", "const_rbf_ard", "rbf_iso_const",
                                  "fixed_const_rbf"])
def test_the_float32_block_is_the_float64_one_rounded(name):
    # the sparse models' mixed precision: K_bu and its contraction with float32 blocks.  The
    # exponent's uᵀv is a d-term float32 sum of O(|u||v|) = O(10) terms on these off-centre
    # inputs (|u - z̄| ~ 2 per feature), so its absolute error is ~1e-6 and K's relative error
    # the same; the contraction adds b·m = 161 float32 products: 1e-5 of the largest entry
    # bounds both with a margin, and a float64 or a wrong result misses it by far
    kernel = COMPILED[name]()
    X, Z, G, w = _problem()
    bound = kernel._bound_to(Z)
    K64 = bound.cross(X)
    K32 = bound.cross(X, np.empty(K64.shape, dtype=np.float32))
    assert K32.dtype == np.float32 and not np.array_equal(K32, K64.astype(np.float32))
    close(K32, K64, 1e-5)
    ref = bound.cross_gradient(X, G.copy(), w, K64)
    got = bound.cross_gradient(X, G.astype(np.float32), w, K32)
    for g, r in zip(got, ref):
        assert g.dtype == np.float64 and not np.array_equal(g, r)
        close(g, r, 1e-5)
    # a float32 G against a float64 K (or the reverse) runs in float64
    np.testing.assert_array_equal(
        bound.cross_gradient(X, G.astype(np.float32), w, K64)[0],
        bound.cross_gradient(X, G.astype(np.float32).astype(np.float64), w, K64)[0])


def test_bad_input_is_a_clear_error():
    kernel = ConstantKernel(2.0) * RBF(LS3)
    X, Z, G, w = _problem()
    bound = kernel._bound_to(Z)
    with pytest.raises(ValueError, match="X has 2 features but the inducing inputs have 3"):
        bound.cross(X[:, :2])
    with pytest.raises(ValueError, match="X has 2 features"):
        bound.cross_gradient(X[:, :2], G.copy(), w)
    with pytest.raises(ValueError, match="K must be 23 x 7"):
        bound.cross(X, np.empty((23, 6)))
    with pytest.raises(ValueError, match="G must be 23 x 7"):
        bound.cross_gradient(X, G[:, :6].copy(), w)
    with pytest.raises(ValueError, match="K must be 23 x 7 like G"):
        bound.cross_gradient(X, G.copy(), w, np.ones((22, 7)))
    with pytest.raises(ValueError, match="length_scale has 3 entries"):
        kernel._bound_to(Z[:, :2])
    # the compiled entry points check what the bound object hands them
    V, vv = np.empty((7, 3)), np.empty(7)
    with pytest.raises(ValueError, match="shift and length_scale need 3 entries"):
        _kernels.scaled_inputs(Z, np.zeros(2), np.ones(3), V, vv)
    with pytest.raises(ValueError, match="U must be 7 x 3"):
        _kernels.scaled_inputs(Z, np.zeros(3), np.ones(3), V[:6], vv)
    _kernels.scaled_inputs(Z, np.zeros(3), np.ones(3), V, vv)
    with pytest.raises(ValueError, match="vv needs 7 entries"):
        _kernels.squared_exponential_exponents(X, np.zeros(3), np.ones(3), V, vv[:5], 0.0,
                                               np.empty((23, 7)))
    with pytest.raises(ValueError, match="shift and length_scale need 3 entries"):
        _kernels.squared_exponential_exponents(X, np.zeros(3), np.ones(2), V, vv, 0.0,
                                               np.empty((23, 7)))
    with pytest.raises(ValueError, match="g_Z must be 7 x 3"):
        _kernels.squared_exponential_gradient(X, np.zeros(3), np.ones(3), V, G.copy(),
                                              np.ones((23, 7)), None, 1.0, True, np.empty(3),
                                              np.empty((7, 2)))
    with pytest.raises(ValueError, match="w needs 23 entries"):
        _kernels.squared_exponential_gradient(X, np.zeros(3), np.ones(3), V, G.copy(),
                                              np.ones((23, 7)), w[:5], 1.0, True, np.empty(3),
                                              np.empty((7, 3)))
    with pytest.raises(ValueError, match="V must be a non-empty"):
        _kernels.squared_exponential_exponents(X, np.zeros(3), np.ones(3), np.empty((0, 3)),
                                               np.empty(0), 0.0, np.empty((23, 0)))
    with pytest.raises(TypeError):
        _kernels.squared_exponential_gradient(X, np.zeros(3), np.ones(3), V, G.copy(), None,
                                              None, 1.0, True, np.empty(3), np.empty((7, 3)))


def test_far_rows_give_zero_not_nan():
    # rows far from every inducing input: the exponent is very negative and K underflows to 0;
    # the gradient stays finite (0 · distance terms)
    kernel = ConstantKernel(2.0) * RBF(0.01)
    X, Z, G, w = _problem()
    bound = kernel._bound_to(Z)
    K = bound.cross(X + 1e3)
    np.testing.assert_array_equal(K, 0.0)
    g_theta, g_Z = bound.cross_gradient(X + 1e3, G.copy(), w, K)
    assert np.all(np.isfinite(g_theta)) and np.all(np.isfinite(g_Z))


def close(actual, desired, rtol):
    """Agreement to ``rtol`` of the largest entry of ``desired`` (sums with cancelling terms)."""
    desired = np.asarray(desired)
    scale = np.abs(desired).max() if desired.size else 0.0
    np.testing.assert_allclose(actual, desired, rtol=rtol, atol=rtol * scale)


def test_a_factor_sums_the_compiled_chunks_in_order(monkeypatch):
    # InducingFactor on the squared exponential's fine chunks (on two threads) against the same
    # kernel bound generically (kernel_chunks of >= 512 rows): K_bu is the same bits (each entry
    # comes from its own row), the gradients' chunk sums agree to rounding (1e-12 of the largest
    # entry: the same terms added in other groups); and the threaded sums are one thread's bits
    from gpc import _parallel
    from gpc.sparse.core.inducing import InducingFactor

    rng = np.random.default_rng(4)
    X, Z = rng.normal(size=(3000, 4)), rng.normal(size=(200, 4))
    G, g_s = rng.normal(size=(3000, 200)), rng.normal(size=3000)
    kernel = ConstantKernel(1.7) * RBF(np.array([0.8, 1.1, 1.6, 2.0]))
    fast = InducingFactor(kernel, Z)
    assert fast.bound.nogil and len(fast.chunks(len(X))) == 11
    results = {}
    for threads in (1, 2):
        with _parallel.block_threads(threads):
            K = fast.cross(X)
            results[threads] = (K, *fast.kernel_gradient(X, G.copy(), g_s, K),
                                *fast.uu_gradient(G[:200] + G[:200].T))
    for a, b in zip(results[1], results[2]):
        np.testing.assert_array_equal(a, b)
    monkeypatch.setattr(type(kernel), "_bound_to", lambda self, Z: BoundKernel(self, Z))
    slow = InducingFactor(kernel, Z)
    assert not slow.bound.nogil and len(slow.chunks(len(X))) == 6
    K = slow.cross(X)
    np.testing.assert_array_equal(K, results[1][0])
    for a, b in zip(results[1][1:], (*slow.kernel_gradient(X, G.copy(), g_s, K),
                                     *slow.uu_gradient(G[:200] + G[:200].T))):
        close(a, b, 1e-12)
