"""Tests of gpc.kernels: values and gradients against scikit-learn, finite differences, algebra."""

import pickle

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp
from numpy.testing import assert_allclose
from sklearn.base import clone
from sklearn.gaussian_process import kernels as sk

from gpc.kernels import (RBF, ConstantKernel, Kernel, Linear, Matern, Polynomial, Product, Sum,
                         WhiteKernel, as_kernel, user_kernel)

RNG = np.random.default_rng(20240601)
X = RNG.normal(size=(25, 3))
Y = RNG.normal(size=(7, 3))
LS3 = np.array([0.6, 1.3, 2.1])


def close_to(actual, desired, rtol=1e-12):
    """Relative agreement at ``rtol``, with an absolute floor of rtol * max|desired|.

    The floor is needed because gpc forms squared distances as |x|^2 + |y|^2 - 2 x.y (BLAS) while
    scikit-learn uses exact differences (pdist): entries of dK that are ~0 (near-coincident points)
    then differ by rounding of the larger terms, i.e. relative to the matrix scale, not to the entry.
    """
    desired = np.asarray(desired)
    scale = np.abs(desired).max() if desired.size else 0.0
    assert_allclose(actual, desired, rtol=rtol, atol=rtol * scale)


# pairs (gpc kernel, equivalent scikit-learn kernel)
PAIRS = {
    "rbf_iso": (lambda: RBF(0.8), lambda: sk.RBF(0.8)),
    "rbf_ard": (lambda: RBF(LS3), lambda: sk.RBF(LS3)),
    "matern15_iso": (lambda: Matern(0.9, nu=1.5), lambda: sk.Matern(0.9, nu=1.5)),
    "matern15_ard": (lambda: Matern(LS3, nu=1.5), lambda: sk.Matern(LS3, nu=1.5)),
    "matern25_iso": (lambda: Matern(1.1, nu=2.5), lambda: sk.Matern(1.1, nu=2.5)),
    "matern25_ard": (lambda: Matern(LS3, nu=2.5), lambda: sk.Matern(LS3, nu=2.5)),
    "matern05_ard": (lambda: Matern(LS3, nu=0.5), lambda: sk.Matern(LS3, nu=0.5)),
    "const_rbf_white": (lambda: ConstantKernel(2.5) * RBF(LS3) + WhiteKernel(0.3),
                        lambda: sk.ConstantKernel(2.5) * sk.RBF(LS3) + sk.WhiteKernel(0.3)),
    "linear": (lambda: Linear(1.7),
               lambda: sk.ConstantKernel(1.7) * sk.DotProduct(0.0, sigma_0_bounds="fixed")),
    "poly_scale1": (lambda: Polynomial(3, scale=1.0),
                    lambda: sk.DotProduct(1.0, sigma_0_bounds="fixed") ** 3),
    "fixed_ls": (lambda: ConstantKernel(2.0) * RBF(0.7, "fixed"),
                 lambda: sk.ConstantKernel(2.0) * sk.RBF(0.7, "fixed")),
}

# gpc kernels with free hyperparameters, for gradient checks
GRAD_KERNELS = {
    "rbf_iso": lambda: RBF(0.8),
    "rbf_ard": lambda: RBF(LS3),
    "matern05_ard": lambda: Matern(LS3, nu=0.5),
    "matern15_iso": lambda: Matern(0.9, nu=1.5),
    "matern15_ard": lambda: Matern(LS3, nu=1.5),
    "matern25_ard": lambda: Matern(LS3, nu=2.5),
    "linear": lambda: Linear(0.7),
    "const": lambda: ConstantKernel(1.9),
    "white": lambda: WhiteKernel(0.4),
    "sum_product": lambda: ConstantKernel(2.0) * Matern(LS3, nu=2.5) + WhiteKernel(0.1),
    "product_of_stationary": lambda: RBF(1.5) * Matern(0.7, nu=1.5),
    "poly_times_const": lambda: Polynomial(2) * ConstantKernel(0.5) + Linear(0.3),
    # c * stationary: the constant's gradient comes from the stationary pass's sum of M o K
    "const_times_rbf_iso": lambda: ConstantKernel(1.3) * RBF(0.8),
    "rbf_ard_times_const": lambda: RBF(LS3) * ConstantKernel(0.6),
    "fixed_const_times_matern05_iso": lambda: ConstantKernel(2.0, "fixed") * Matern(0.6, nu=0.5),
    "matern05_iso": lambda: Matern(0.6, nu=0.5),
    "matern25_iso": lambda: Matern(1.1, nu=2.5),
}

# kernels for which gradient_inputs is implemented (white and constant: derivative 0)
INPUT_KERNELS = dict(GRAD_KERNELS, poly3=lambda: Polynomial(3), poly_scaled=lambda: Polynomial(2, 4.0))


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_values_and_gradient_tensor_match_sklearn(name):
    ours, theirs = PAIRS[name][0](), PAIRS[name][1]()
    assert_allclose(ours.theta, theirs.theta, rtol=0, atol=0)
    assert_allclose(ours.bounds, np.reshape(theirs.bounds, (-1, 2)), rtol=1e-15)
    K, dK = ours(X, eval_gradient=True)
    K_sk, dK_sk = theirs(X, eval_gradient=True)
    close_to(K, K_sk)
    assert dK.shape == dK_sk.shape
    close_to(dK, dK_sk)
    close_to(ours(X, Y), theirs(X, Y))
    close_to(ours.diag(X), theirs.diag(X))


@pytest.mark.parametrize("name", sorted(GRAD_KERNELS))
def test_gradient_contract_equals_einsum_and_finite_differences(name):
    k = GRAD_KERNELS[name]()
    Xs = X[:12]
    M = RNG.normal(size=(12, 12))  # general, not symmetric
    g = k.gradient_contract(Xs, M)
    _, dK = k(Xs, eval_gradient=True)
    g_tensor = np.einsum("ij,ijk->k", M, dK)
    assert g.shape == (k.n_dims,)
    assert_allclose(g, g_tensor, rtol=1e-10, atol=1e-12 * np.abs(g_tensor).max())
    # Central differences in theta = log(hyperparameters).  Truncation error ~ h^2 |f'''| / 6 and
    # rounding error ~ eps |f| / h; h = 1e-5 (about eps^(1/3)) balances them at ~1e-10 relative for
    # these O(1) hyperparameters, so rtol 1e-6 fails any real error (a wrong factor or sign is O(1))
    # and still leaves a 1e4 margin.
    h = 1e-5
    theta = k.theta
    fd = np.empty_like(theta)
    for j in range(theta.size):
        e = np.zeros_like(theta)
        e[j] = h
        fd[j] = (np.sum(M * k.clone_with_theta(theta + e)(Xs))
                 - np.sum(M * k.clone_with_theta(theta - e)(Xs))) / (2 * h)
    assert_allclose(g, fd, rtol=1e-6, atol=1e-8 * np.abs(fd).max())


def test_gradient_contract_symmetric_M_and_no_free_hyperparameters():
    M = RNG.normal(size=(25, 25))
    M = M + M.T
    k = RBF(LS3)
    _, dK = k(X, eval_gradient=True)
    assert_allclose(k.gradient_contract(X, M), np.einsum("ij,ijk->k", M, dK), rtol=1e-10)
    assert k.gradient_contract(X, M).shape == (3,)
    assert RBF(1.0, "fixed").gradient_contract(X, M).shape == (0,)
    assert Polynomial(2).gradient_contract(X, M).shape == (0,)


@pytest.mark.parametrize("path", ["direct", "gram"])
@pytest.mark.parametrize("name", sorted(GRAD_KERNELS))
def test_gradient_contract_with_K_and_symmetric_M(name, path, monkeypatch):
    # K = k(X) handed in (as an evidence gradient does) and the promise that M is symmetric change
    # where the values and M's entries are read from, not the result: 1e-10 relative, as against
    # the tensor above.  The diagonal of K carries jitter, which must not be read.
    import gpc.kernels.matrices as gk
    if path == "gram":
        monkeypatch.setattr(gk, "DIRECT_MAX_D", 0)
    k = GRAD_KERNELS[name]()
    Xs = X[:14]
    M = RNG.normal(size=(14, 14))
    _, dK = k(Xs, eval_gradient=True)
    K_jittered = k(Xs)
    K_jittered.flat[:: 15] += 0.1
    for Ms, symmetric in ((M, False), (M + M.T, True)):
        g_tensor = np.einsum("ij,ijk->k", Ms, dK)
        g = k.gradient_contract(Xs, Ms, K=K_jittered, symmetric=symmetric)
        assert_allclose(g, g_tensor, rtol=1e-10, atol=1e-12 * np.abs(g_tensor).max())


@pytest.mark.parametrize("path", ["direct", "gram"])
def test_gradient_contract_reads_the_values_from_K(path, monkeypatch):
    # For the squared exponential W = f, so with K = c A for an arbitrary symmetric A the
    # contraction must be (sum M o A, sum M o A o r^2) scaled as for c * RBF: proof that the values
    # come from K and not from recomputed exponentials.
    import gpc.kernels.matrices as gk
    if path == "gram":
        monkeypatch.setattr(gk, "DIRECT_MAX_D", 0)
    ls, c = 0.8, 1.3
    A = RNG.uniform(0.1, 1.0, size=(25, 25))
    A = A + A.T
    M = RNG.normal(size=(25, 25))
    r2 = np.sum((X[:, None, :] - X[None, :, :]) ** 2, axis=2) / ls ** 2
    off = ~np.eye(25, dtype=bool)
    expected = [c * (np.trace(M) + np.sum((M * A)[off])), c * np.sum(M * A * r2)]
    g = (ConstantKernel(c) * RBF(ls)).gradient_contract(X, M, K=c * A)
    assert_allclose(g, expected, rtol=1e-12)
    assert not np.allclose(g, (ConstantKernel(c) * RBF(ls)).gradient_contract(X, M))
    # plus white noise (diagonal only): the sum hands its K on, as its off-diagonal is c A
    K_sum = c * A + 0.3 * np.eye(25)
    for k, order in ((ConstantKernel(c) * RBF(ls) + WhiteKernel(0.3), slice(None)),
                     (WhiteKernel(0.3) + ConstantKernel(c) * RBF(ls), [1, 2, 0])):
        g = k.gradient_contract(X, M, K=K_sum)
        assert_allclose(g[order], expected + [0.3 * np.trace(M)], rtol=1e-12)


def test_gradient_contract_symmetric_reads_the_lower_triangle_only():
    # symmetric=True is a promise: a non-symmetric M is then contracted as its mirrored lower
    # triangle (what a caller breaking the promise gets, and proof that the upper is not read)
    M = RNG.normal(size=(25, 25))
    M_lower = np.tril(M) + np.tril(M, -1).T
    for k in (RBF(0.8), RBF(LS3), Matern(0.7, nu=1.5), ConstantKernel(2.0) * RBF(0.9)):
        assert_allclose(k.gradient_contract(X, M, symmetric=True), k.gradient_contract(X, M_lower),
                        rtol=1e-12)


def test_gradient_contract_bad_K_raises():
    k = ConstantKernel(2.0) * RBF(0.8)
    M = RNG.normal(size=(25, 25))
    with pytest.raises(ValueError, match="K must have shape"):
        k.gradient_contract(X, M, K=np.ones((24, 24)))
    K = k(X)
    K[3, 1] = np.nan
    with pytest.raises(ValueError, match="K contains NaN"):
        k.gradient_contract(X, M, K=K)


@pytest.mark.parametrize("name", sorted(INPUT_KERNELS))
def test_gradient_inputs_finite_differences(name):
    k = INPUT_KERNELS[name]()
    Xs, Ys = X[:6], Y[:5]
    M = RNG.normal(size=(6, 5))
    G = k.gradient_inputs(Xs, Ys, M)
    assert G.shape == Xs.shape
    # central differences in x, same step and reasoning as for theta above (inputs are O(1))
    h = 1e-5
    fd = np.empty_like(Xs)
    for i in range(Xs.shape[0]):
        for d in range(Xs.shape[1]):
            Xp, Xm = Xs.copy(), Xs.copy()
            Xp[i, d] += h
            Xm[i, d] -= h
            fd[i, d] = (np.sum(M * k(Xp, Ys)) - np.sum(M * k(Xm, Ys))) / (2 * h)
    assert_allclose(G, fd, rtol=1e-6, atol=1e-8 * max(np.abs(fd).max(), 1.0))


def test_gradient_inputs_both_arguments():
    """d/dZ sum_ij M_ij k(z_i, z_j) = gradient_inputs(Z, Z, M) + gradient_inputs(Z, Z, M.T)."""
    k = ConstantKernel(1.5) * RBF(LS3)
    Z = X[:5]
    M = RNG.normal(size=(5, 5))
    G = k.gradient_inputs(Z, Z, M) + k.gradient_inputs(Z, None, M.T)
    h = 1e-5
    fd = np.empty_like(Z)
    for i in range(5):
        for d in range(3):
            Zp, Zm = Z.copy(), Z.copy()
            Zp[i, d] += h
            Zm[i, d] -= h
            fd[i, d] = (np.sum(M * k(Zp)) - np.sum(M * k(Zm))) / (2 * h)
    assert_allclose(G, fd, rtol=1e-6, atol=1e-9)


def test_gradient_inputs_not_implemented_for_untranslated_foreign_kernel():
    with pytest.raises(NotImplementedError, match="foreign kernel"):
        as_kernel(sk.Matern(1.0, nu=0.7)).gradient_inputs(X, Y, np.ones((25, 7)))


PSD_KERNELS = [RBF(0.5), RBF(LS3), Matern(0.7, nu=0.5), Matern(LS3, nu=1.5), Matern(2.0, nu=2.5),
               Linear(2.0), Polynomial(3), ConstantKernel(0.5) * RBF(1.0) + WhiteKernel(1e-3),
               Matern(1.0, nu=2.5) * Linear(1.0)]


@settings(max_examples=25, deadline=None)
@given(data=hnp.arrays(np.float64, st.tuples(st.integers(1, 12), st.just(3)),
                       elements=st.floats(-5, 5, allow_nan=False)),
       which=st.integers(0, len(PSD_KERNELS) - 1))
def test_kernel_matrix_symmetric_psd(data, which):
    k = PSD_KERNELS[which]
    K = k(data)
    assert np.array_equal(K, K.T)
    assert np.all(np.isfinite(K))
    ev = np.linalg.eigvalsh(K)
    assert ev.min() >= -1e-10 * max(np.trace(K), 1e-300)
    assert_allclose(np.diag(K), k.diag(data), rtol=1e-12, atol=1e-12)


KERNELS_FOR_ROUNDTRIP = [RBF(LS3, (1e-3, 1e3)), Matern(0.4, nu=2.5), Linear(3.0), Polynomial(4, 2.0),
                         WhiteKernel(0.2, "fixed"),
                         ConstantKernel(2.0) * RBF(0.7) + WhiteKernel(0.1)]


@pytest.mark.parametrize("k", KERNELS_FOR_ROUNDTRIP, ids=repr)
def test_clone_get_params_pickle_round_trips(k):
    k2 = k.clone_with_theta(k.theta)  # exp(log(v)) may differ from v in the last bit
    assert type(k2) is type(k) and k2 is not k
    assert_allclose(k2.theta, k.theta, rtol=1e-15)
    assert_allclose(k2(X), k(X), rtol=1e-14)
    k3 = type(k)(**k.get_params(deep=False))
    assert k3 == k
    k4 = clone(k)
    assert k4 == k and k4 is not k
    assert_allclose(k4(X), k(X), rtol=0, atol=0)
    k5 = pickle.loads(pickle.dumps(k))
    assert k5 == k
    assert_allclose(k5(X), k(X), rtol=0, atol=0)
    assert type(k).__name__ in repr(k) or " + " in repr(k)
    # new theta changes the value, the copy does not touch the original
    if k.n_dims:
        t = k.theta.copy()
        k6 = k.clone_with_theta(t + 0.1)
        assert_allclose(k6.theta, t + 0.1, rtol=1e-14)
        assert_allclose(k.theta, t, rtol=0)
        assert k6 != k


def test_theta_setter_and_names():
    k = ConstantKernel(2.0) * RBF(LS3) + WhiteKernel(0.1)
    assert k.hyperparameter_names == ["k1__k1__constant_value", "k1__k2__length_scale[0]",
                                      "k1__k2__length_scale[1]", "k1__k2__length_scale[2]",
                                      "k2__noise_level"]
    k.theta = np.log([3.0, 1.0, 2.0, 4.0, 0.5])
    assert_allclose(k.k1.k2.length_scale, [1.0, 2.0, 4.0])
    assert_allclose(k.k2.noise_level, 0.5)
    assert isinstance(k.k2.noise_level, float)
    assert k.bounds.shape == (5, 2)
    assert_allclose(k.bounds[0], np.log([1e-5, 1e5]))


def test_fixed_hyperparameters_drop_out_of_theta():
    k = ConstantKernel(2.0, "fixed") * RBF([1.0, 2.0]) + WhiteKernel(0.1, "fixed")
    assert k.n_dims == 2
    assert k.hyperparameter_names == ["k1__k2__length_scale[0]", "k1__k2__length_scale[1]"]
    X2 = X[:, :2]
    K, dK = k(X2, eval_gradient=True)
    assert dK.shape == (25, 25, 2)
    M = RNG.normal(size=(25, 25))
    assert_allclose(k.gradient_contract(X2, M), np.einsum("ij,ijk->k", M, dK), rtol=1e-10)
    k.theta = np.log([3.0, 4.0])
    assert k.k1.k1.constant_value == 2.0 and k.k2.noise_level == 0.1
    assert RBF(1.0, "fixed").theta.shape == (0,) and RBF(1.0, "fixed").bounds.shape == (0, 2)


def test_set_params_nested_and_arithmetic_with_numbers():
    k = 2.0 * RBF(1.0) + 0.5
    assert isinstance(k, Sum) and isinstance(k.k1, Product)
    assert isinstance(k.k1.k1, ConstantKernel) and k.k1.k1.constant_value == 2.0
    assert isinstance(k.k2, ConstantKernel) and k.k2.constant_value == 0.5
    k.set_params(k1__k2__length_scale=3.0)
    assert k.k1.k2.length_scale == 3.0
    assert k.get_params()["k1__k2__length_scale"] == 3.0
    assert_allclose(k(X), 2.0 * np.exp(-0.5 * np.sum((X[:, None] - X[None]) ** 2, -1) / 9.0) + 0.5,
                    rtol=1e-12)
    assert_allclose((RBF(1.0) * 3)(X), 3 * RBF(1.0)(X), rtol=0)
    assert_allclose((1 + RBF(1.0))(X), 1 + RBF(1.0)(X), rtol=0)
    with pytest.raises(ValueError, match="invalid parameter"):
        k.set_params(foo=1)
    with pytest.raises(ValueError, match="length_scale"):
        k.set_params(k1__k2__length_scale=-1.0)


def test_white_kernel_diagonal_only_for_same_inputs():
    w = WhiteKernel(0.3)
    assert_allclose(w(X), 0.3 * np.eye(25))
    assert_allclose(w(X, X), 0.3 * np.eye(25))
    assert_allclose(w(X, X.copy()), 0.0)
    assert_allclose(w(X, Y), 0.0)


def test_polynomial_default_scale_is_n_features():
    K = Polynomial(3)(X, Y)
    assert_allclose(K, (1 + X @ Y.T / 3) ** 3, rtol=1e-13)
    assert Polynomial(3).n_dims == 0
    assert not Polynomial(3).is_stationary() and RBF().is_stationary()
    assert not (RBF() * Linear()).is_stationary() and (RBF() + WhiteKernel()).is_stationary()


def test_as_kernel_adapts_sklearn_kernels():
    r = RBF(LS3)
    assert as_kernel(r) is r
    a = as_kernel(sk.ConstantKernel(2.0) * sk.RBF(LS3))
    ours = ConstantKernel(2.0) * RBF(LS3)
    M = RNG.normal(size=(25, 25))
    assert_allclose(a.gradient_contract(X, M), ours.gradient_contract(X, M), rtol=1e-10)
    assert_allclose(a.theta, ours.theta) and a.n_dims == 4
    assert_allclose(a.bounds, ours.bounds)
    assert a.hyperparameter_names == ["k1__constant_value"] + [f"k2__length_scale[{i}]" for i in range(3)]
    b = a.clone_with_theta(a.theta + 1)
    assert_allclose(b(X), ours.clone_with_theta(ours.theta + 1)(X), rtol=1e-12)
    assert_allclose(a.diag(X), ours.diag(X))
    mixed = RBF(LS3) + sk.WhiteKernel(0.2)
    assert mixed.n_dims == 4
    assert_allclose(mixed.gradient_contract(X, M),
                    np.einsum("ij,ijk->k", M, mixed(X, eval_gradient=True)[1]), rtol=1e-10)
    with pytest.raises(TypeError, match="not a kernel"):
        as_kernel("rbf")



class _MyRBF(sk.RBF):
    """A subclass, which may change the formula: called as is, not translated."""


# scikit-learn kernels whose training step moves the translation only (_ForeignKernel._with_theta),
# and two whose step clones: DotProduct's free σ0 (its translation holds σ0²) and an untranslated
# subclass
STEP_KERNELS = {
    "const_rbf_ard": lambda: sk.ConstantKernel(2.0) * sk.RBF(LS3),
    "matern_sum_white": lambda: sk.Matern(0.9, nu=1.5) + sk.WhiteKernel(0.3),
    "fixed_ls": lambda: sk.ConstantKernel(2.0) * sk.RBF(0.7, "fixed"),
    "dot_fixed_sigma": lambda: sk.ConstantKernel(1.7) * sk.DotProduct(1.5, sigma_0_bounds="fixed"),
    "dot_free_sigma": lambda: sk.DotProduct(1.0) + sk.WhiteKernel(0.2),
    "untranslated": lambda: _MyRBF(0.8),
}


@pytest.mark.parametrize("name", sorted(STEP_KERNELS))
def test_sklearn_kernel_step_equals_its_clone(name):
    """A training step's kernel (_with_theta) is clone_with_theta's: the same θ, the same K to the
    bit (both hold exp(θ)) and, once asked for, the same scikit-learn kernel; three steps in a
    row clone from the kernel the user gave, and the original is left as it was."""
    user = STEP_KERNELS[name]()
    before = user.get_params()
    k = as_kernel(user)
    lazy = name not in ("dot_free_sigma", "untranslated")
    assert k._same_theta() is lazy
    step, full = k, k
    for shift in (0.3, -0.1, 0.2):                 # steps with nothing asked of the kernel between
        theta = k.theta + shift
        step, full = step._with_theta(theta), full.clone_with_theta(theta)
        assert (step._kernel is None) is lazy and (step._root is user) is lazy
    assert np.array_equal(step(X), full(X)) and np.array_equal(step.diag(X), full.diag(X))
    assert np.array_equal(step(X, Y), full(X, Y))
    assert np.array_equal(step.theta, full.theta)
    assert repr(user_kernel(step)) == repr(user_kernel(full))
    assert np.array_equal(user_kernel(step).theta, user_kernel(full).theta)
    assert step._kernel is not None and step._root is None
    assert user.get_params().keys() == before.keys()
    assert all(np.array_equal(user.get_params()[p], v) for p, v in before.items()
               if not isinstance(v, sk.Kernel))
    # set_params on the adapter reaches the scikit-learn kernel and its translation
    k.set_params(kernel=STEP_KERNELS[name]())
    assert np.array_equal(k(X), as_kernel(STEP_KERNELS[name]())(X))
    if name == "const_rbf_ard":
        k.set_params(kernel__k2__length_scale=2 * LS3)
        assert np.array_equal(k(X), as_kernel(sk.ConstantKernel(2.0) * sk.RBF(2 * LS3))(X))
    # pickled before its scikit-learn kernel is made, it makes the same one after
    again = pickle.loads(pickle.dumps(k._with_theta(k.theta + 0.5)))
    assert repr(user_kernel(again)) == repr(user_kernel(k.clone_with_theta(k.theta + 0.5)))


BAD_CONSTRUCTORS = [
    lambda: RBF(-1.0), lambda: RBF(0.0), lambda: RBF(np.nan), lambda: RBF(np.inf),
    lambda: RBF([1.0, -2.0]), lambda: RBF(1.0, (0.0, 1.0)), lambda: RBF(1.0, (1.0, np.inf)),
    lambda: RBF(1.0, (2.0, 1.0)), lambda: RBF(1.0, "free"), lambda: RBF(1.0, (1, 2, 3)),
    lambda: Matern(1.0, nu=1.0), lambda: Matern(-1.0), lambda: ConstantKernel(-2.0),
    lambda: ConstantKernel(1.0, (-1.0, 1.0)), lambda: WhiteKernel(0.0), lambda: WhiteKernel(np.nan),
    lambda: Linear(-1.0), lambda: Linear(1.0, (np.nan, 1.0)), lambda: Polynomial(0),
    lambda: Polynomial(2.5), lambda: Polynomial(2, scale=-1.0), lambda: RBF("abc"),
    lambda: Sum(RBF(), 3.0), lambda: RBF() + "abc",
]


@pytest.mark.parametrize("make", BAD_CONSTRUCTORS)
def test_bad_hyperparameters_raise(make):
    with pytest.raises(ValueError):
        make()


def test_bad_theta_and_inputs_raise():
    k = ConstantKernel() * RBF([1.0, 1.0, 1.0])
    for bad in ([0.0, 0.0], [0.0, np.nan, 0.0, 0.0], [np.inf, 0, 0, 0], [1e6, 0, 0, 0]):
        with pytest.raises(ValueError, match="theta"):
            k.theta = bad
    with pytest.raises(ValueError, match="features"):
        RBF([1.0, 2.0])(X)
    with pytest.raises(ValueError, match="features"):
        RBF(1.0)(X, Y[:, :2])
    with pytest.raises(ValueError, match="2-dimensional"):
        RBF(1.0)(X[:, 0])
    Xn = X.copy()
    Xn[3, 1] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        RBF(1.0)(Xn)
    Yi = Y.copy()
    Yi[0, 0] = np.inf
    with pytest.raises(ValueError, match="inf"):
        Linear()(X, Yi)
    with pytest.raises(ValueError, match="Y is None"):
        RBF(1.0)(X, Y, eval_gradient=True)
    with pytest.raises(ValueError, match="shape"):
        RBF(1.0).gradient_contract(X, np.ones((3, 3)))
    with pytest.raises(ValueError, match="NaN"):
        RBF(1.0).gradient_contract(X, np.full((25, 25), np.nan))
    with pytest.raises(ValueError, match="shape"):
        RBF(1.0).gradient_inputs(X, Y, np.ones((25, 25)))


def test_is_kernel_subclass():
    for k in PSD_KERNELS:
        assert isinstance(k, Kernel) and k.requires_vector_input


@pytest.mark.parametrize("name", sorted(GRAD_KERNELS))
def test_duplicate_inputs(name):
    # repeated rows give r = 0 off the diagonal, where Matern 1/2 has W = e^-r / r; its products with
    # r^2 and with (u_d - u'_d)^2 vanish there, so the contraction must stay finite and exact
    k = GRAD_KERNELS[name]()
    Xd = np.vstack([X[:6], X[:3]])
    M = RNG.normal(size=(9, 9))
    K, dK = k(Xd, eval_gradient=True)
    assert np.all(np.isfinite(K)) and np.array_equal(K, K.T)
    assert_allclose(K[6:, 3:6], K[:3, 3:6], rtol=1e-14, atol=1e-15)   # duplicated rows, other columns
    g = k.gradient_contract(Xd, M)
    assert_allclose(g, np.einsum("ij,ijk->k", M, dK), rtol=1e-10, atol=1e-12 * np.abs(dK).max())


@pytest.mark.parametrize("name", ["rbf_iso", "rbf_ard", "matern05_iso", "matern05_ard", "matern15_ard",
                                  "matern25_iso", "const_times_rbf_iso", "sum_product"])
def test_direct_and_gram_paths_agree(name, monkeypatch):
    # Few input dimensions use direct differences, many a BLAS Gram matrix |u|^2 + |v|^2 - 2 u.v
    # (gpc.kernels.matrices.DIRECT_MAX_D).  Both must give the same K and contraction: the Gram form loses
    # ~1e-16 |u|^2 to cancellation, so 1e-12 relative to the largest entry.
    import gpc.kernels.matrices as gk
    k = GRAD_KERNELS[name]()
    M = RNG.normal(size=(25, 25))
    direct = k(X), k.gradient_contract(X, M)
    monkeypatch.setattr(gk, "DIRECT_MAX_D", 0)
    gram = k(X), k.gradient_contract(X, M)
    close_to(gram[0], direct[0])
    assert_allclose(gram[1], direct[1], rtol=1e-12, atol=1e-12 * np.abs(direct[1]).max())


def test_wide_inputs_match_sklearn():
    # d = 12 > DIRECT_MAX_D: the Gram path, values and contraction against scikit-learn's tensor
    Xw = RNG.normal(size=(30, 12))
    ours, theirs = ConstantKernel(1.7) * RBF(np.linspace(0.5, 3.0, 12)), sk.ConstantKernel(1.7) * sk.RBF(np.linspace(0.5, 3.0, 12))
    K_sk, dK_sk = theirs(Xw, eval_gradient=True)
    close_to(ours(Xw), K_sk)
    M = RNG.normal(size=(30, 30))
    g = ours.gradient_contract(Xw, M)
    assert_allclose(g, np.einsum("ij,ijk->k", M, dK_sk), rtol=1e-10, atol=1e-12 * np.abs(g).max())


# scikit-learn kernels that run on gpc's compiled kernels inside the adapter (as_kernel)
TRANSLATED = {
    "rbf_iso": lambda: sk.RBF(0.8),
    "rbf_ard": lambda: sk.RBF(LS3),
    "matern05": lambda: sk.Matern(0.9, nu=0.5),
    "matern15_ard": lambda: sk.Matern(LS3, nu=1.5),
    "matern25": lambda: sk.Matern(1.1, nu=2.5),
    "matern_inf": lambda: sk.Matern(0.7, nu=np.inf),
    "const_rbf": lambda: sk.ConstantKernel(1.7) * sk.RBF(0.8),
    "rbf_const": lambda: sk.RBF(LS3) * sk.ConstantKernel(0.4),
    "const_rbf_white": lambda: sk.ConstantKernel(1.7) * sk.RBF(LS3) + sk.WhiteKernel(0.1),
    "matern_plus_rbf": lambda: sk.Matern(0.9, nu=2.5) + sk.RBF(1.4),
    "product_of_stationary": lambda: sk.Matern(0.9, nu=1.5) * sk.RBF(LS3),
    "fixed_parts": lambda: sk.ConstantKernel(2.0, "fixed") * sk.RBF(0.8, (1e-2, 1e2)),
    "rational_quadratic": lambda: sk.RationalQuadratic(0.8, 1.5),
    "rq_fixed_alpha": lambda: sk.ConstantKernel(1.3) * sk.RationalQuadratic(0.8, 1.5, alpha_bounds="fixed"),
    "dot_product": lambda: sk.DotProduct(0.7),
    "const_dot_product_white": lambda: sk.ConstantKernel(0.5) * sk.DotProduct(1.2) + sk.WhiteKernel(0.3),
    "rbf_squared": lambda: sk.RBF(0.8) ** 2,
    "power_of_sum": lambda: (sk.ConstantKernel(0.5) * sk.Matern(LS3, nu=2.5) + sk.DotProduct(0.4)) ** 2,
}


@pytest.mark.parametrize("name", sorted(TRANSLATED))
def test_translated_sklearn_kernels_equal_sklearn(name, monkeypatch):
    theirs = TRANSLATED[name]()
    ours = as_kernel(theirs)
    assert ours._fast is not None
    assert_allclose(ours.theta, theirs.theta, rtol=0, atol=0)
    K_sk, dK_sk = theirs(X, eval_gradient=True)
    M = RNG.normal(size=(25, 25))
    expected = np.einsum("ij,ijk->k", M, dK_sk)
    Msym = M + M.T
    expected_sym = np.einsum("ij,ijk->k", Msym, dK_sk)
    # no n x n x p tensor: the scikit-learn object is not asked for its gradient
    monkeypatch.setattr(type(theirs), "__call__", lambda *a, **k: pytest.fail("scikit-learn kernel called"))
    # values and gradients to 1e-12 of the largest entry (the same formulas; only the order of the
    # rounding differs)
    close_to(ours(X), K_sk)
    close_to(ours.diag(X), theirs.diag(X))
    g = ours.gradient_contract(X, M)
    assert_allclose(g, expected, rtol=1e-12, atol=1e-12 * np.abs(expected).max())
    g = ours.gradient_contract(X, Msym, K=K_sk, symmetric=True)
    assert_allclose(g, expected_sym, rtol=1e-12, atol=1e-12 * np.abs(expected_sym).max())
    # a new θ reaches the translation (clone and in-place setting)
    moved = ours.clone_with_theta(ours.theta + 0.3)
    assert_allclose(moved.theta, ours.theta + 0.3, rtol=1e-15)
    ours.theta = ours.theta + 0.3
    close_to(ours(X), moved(X))


def test_untranslated_sklearn_kernels_keep_the_generic_path():
    class Shifted(sk.RBF):   # a subclass may change the formula: it keeps its own code
        pass

    for theirs in (sk.Matern(0.9, nu=0.7), sk.ConstantKernel(1.0) * sk.Matern(0.5, nu=3.5),
                   Shifted(0.8), sk.RBF(0.8) ** 2 + sk.ExpSineSquared()):
        ours = as_kernel(theirs)
        assert ours._fast is None
        M = RNG.normal(size=(25, 25))
        K_sk, dK_sk = theirs(X, eval_gradient=True)
        assert_allclose(ours(X), K_sk, rtol=0, atol=0)
        assert_allclose(ours.gradient_contract(X, M), np.einsum("ij,ijk->k", M, dK_sk), rtol=1e-14)


def test_cross_covariance_comes_from_sklearn():
    # scikit-learn's WhiteKernel is zero between two input sets even when they are the same array
    theirs = sk.RBF(0.8) + sk.WhiteKernel(0.5)
    assert_allclose(as_kernel(theirs)(X, X), theirs(X, X), rtol=0, atol=0)


def test_sklearn_adapters_take_theta_back():
    """The translated RationalQuadratic and Exponentiation accept θ as the other kernels do
    (an optimizer sets θ on whatever kernel it was given)."""
    from gpc.kernels import RBF, _Power, _RationalQuadratic

    rq = _RationalQuadratic(2.0, 3.0, True, False)        # only α free
    rq.theta = np.log([4.0])
    assert (rq.alpha, rq.length_scale) == pytest.approx((4.0, 3.0), rel=1e-15)
    with pytest.raises(ValueError, match="theta has 2 entries"):
        rq.theta = np.log([4.0, 5.0])
    power = _Power(RBF(1.0), 2.0)
    power.theta = np.log([0.5])
    assert power.base.length_scale == pytest.approx(0.5, rel=1e-15)


# -- the b x m blocks of the sparse engine ----------------------------------------------------------
CROSS_KERNELS = {
    "const_rbf_ard": lambda: ConstantKernel(2.0) * RBF(LS3),
    "rbf_const": lambda: RBF(1.3) * ConstantKernel(0.5),
    "rbf_ard": lambda: RBF(LS3),
    "fixed_const_rbf": lambda: ConstantKernel(2.0, "fixed") * RBF(LS3),
    "const_fixed_rbf": lambda: ConstantKernel(2.0) * RBF(1.2, "fixed"),
    "matern05": lambda: Matern(1.2, nu=0.5),
    "const_matern25_white": lambda: ConstantKernel(2.0) * Matern(LS3, nu=2.5) + WhiteKernel(0.1),
    "linear_times_rbf": lambda: Linear(0.3) * RBF(2.0),
    "rbf_times_rbf": lambda: RBF(1.0) * RBF(LS3),
    "poly_plus_linear": lambda: Polynomial(3) + Linear(),
    "sk_const_matern": lambda: as_kernel(sk.ConstantKernel(2.0) * sk.Matern(LS3, nu=1.5)),
    "sk_rational_quadratic": lambda: as_kernel(sk.RationalQuadratic(1.5, 2.0)),
}


@pytest.mark.parametrize("name", sorted(CROSS_KERNELS))
def test_cross_gradient_equals_the_stacked_contraction(name):
    # cross_gradient works on the b x m block (the squared exponential in gpc._sparse, other
    # stationary kernels in NumPy, products and sums from their parts); the reference is the
    # kernel's own gradient_contract over the stacked inputs [X; Z] of the symmetric matrix
    # [[diag w, G/2], [Gᵀ/2, 0]] and gradient_inputs: independent code.  Sums of O(100) O(1)
    # terms on off-centre inputs, so 1e-10 of the largest is rounding with a wide margin.
    kernel = CROSS_KERNELS[name]()
    rng = np.random.default_rng(0)
    Xs, Zs = rng.normal(size=(30, 3)) + 5.0, rng.normal(size=(7, 3)) + 5.0
    G, w = rng.normal(size=(30, 7)), rng.normal(size=30)
    close_to(kernel.cross_covariance(Xs, Zs), kernel(Xs, Zs), rtol=1e-13)
    M = np.zeros((37, 37))
    M[np.arange(30), np.arange(30)] = w
    M[:30, 30:], M[30:, :30] = 0.5 * G, 0.5 * G.T
    expected = kernel.gradient_contract(np.vstack([Xs, Zs]), M)
    for K in (None, kernel(Xs, Zs)):
        g_theta, g_Z = kernel.cross_gradient(Xs, Zs, G, w, K=K)
        assert g_theta.shape == (kernel.n_dims,)
        close_to(g_theta, expected, rtol=1e-10)
        if name == "sk_rational_quadratic":       # scikit-learn gives no gradient in the inputs
            assert g_Z is None and not kernel._has_grad_inputs()
        else:
            assert kernel._has_grad_inputs()
            close_to(g_Z, kernel.gradient_inputs(Zs, Xs, np.ascontiguousarray(G.T)), rtol=1e-10)


@pytest.mark.parametrize("name", sorted(CROSS_KERNELS) + ["rbf_plus_white", "white"])
def test_gram_gradient_is_the_gradient_of_the_gram_matrix(name):
    # F = Σ G ∘ K(Z) for symmetric G, the K_uu part of every sparse gradient: in θ the reference is
    # K(Z)'s own gradient tensor (eval_gradient=True, independent code), in Z central differences
    # of F (step 1e-6 on O(1) entries: truncation ~1e-12, rounding ~1e-10 of |F|, so 1e-6 relative
    # to the largest entry).  White noise sits on K(Z)'s diagonal and not in the cross block, so
    # those kernels must take the other path and still agree.
    kernel = {"rbf_plus_white": lambda: RBF(LS3) + WhiteKernel(0.3),
              "white": lambda: WhiteKernel(0.3)}.get(name, CROSS_KERNELS.get(name))()
    rng = np.random.default_rng(1)
    Zs = rng.normal(size=(7, 3)) + 5.0
    G = rng.normal(size=(7, 7))
    G = G + G.T
    K, dK = kernel(Zs, eval_gradient=True)
    g_theta, g_Z = kernel._gram_gradient(Zs, G.copy(), np.ascontiguousarray(K))
    close_to(g_theta, np.einsum("ij,ijk->k", G, dK), rtol=1e-10)
    assert kernel._gram_is_cross() == (name not in (
        "rbf_plus_white", "white", "const_matern25_white", "matern05", "linear_times_rbf",
        "poly_plus_linear", "sk_rational_quadratic"))
    if not kernel._has_grad_inputs():
        assert g_Z is None
        return
    fd = np.empty_like(Zs)
    for i in range(Zs.shape[0]):
        for d in range(Zs.shape[1]):
            up, down = Zs.copy(), Zs.copy()
            up[i, d] += 1e-6
            down[i, d] -= 1e-6
            fd[i, d] = (np.vdot(G, kernel(up)) - np.vdot(G, kernel(down))) / 2e-6
    close_to(g_Z, fd, rtol=1e-6)


@pytest.mark.parametrize("name", sorted(CROSS_KERNELS))
def test_with_theta_is_a_clone_that_leaves_the_kernel_alone(name):
    # the θ step's shallow copy must compute what a full clone computes, and not touch the kernel
    kernel = CROSS_KERNELS[name]()
    theta = kernel.theta + 0.3
    before = kernel(X, Y)
    fresh = kernel._with_theta(theta)
    assert_allclose(fresh.theta, theta, rtol=1e-14)
    assert fresh._n_free() == kernel.n_dims
    close_to(fresh(X, Y), kernel.clone_with_theta(theta)(X, Y), rtol=1e-14)
    assert_allclose(kernel(X, Y), before, rtol=0, atol=0)
    if kernel.n_dims:
        assert not np.array_equal(before, fresh(X, Y))


def test_cross_gradient_checks_its_inputs():
    kernel = ConstantKernel(2.0) * RBF(1.0)
    with pytest.raises(ValueError, match="features"):
        kernel.cross_gradient(X, Y[:, :2], np.zeros((25, 7)))
    with pytest.raises(ValueError, match="G must have shape"):
        kernel.cross_gradient(X, Y, np.zeros((7, 25)))
    with pytest.raises(ValueError, match="diag_weights"):
        kernel.cross_gradient(X, Y, np.zeros((25, 7)), np.zeros(3))


@pytest.mark.parametrize("kernel, lower", [
    (RBF(1.0), True),
    (ConstantKernel(2.0) * Matern(1.0, nu=1.5), True),
    (as_kernel(sk.ConstantKernel(2.0) * sk.RBF(1.0)), True),
    (RBF(1.0) * RBF(2.0), False),
    (RBF(1.0) + ConstantKernel(1.0), False),
    (Linear(), False),
])
def test_a_kernel_says_whether_its_contraction_reads_only_the_lower_triangle(kernel, lower):
    """The evidence gradient skips mirroring M for the kernels that say so; for them a symmetric M
    with garbage above the diagonal contracts as the full symmetric M does (to rounding)."""
    assert kernel._reads_lower_triangle() is lower
    rng = np.random.default_rng(0)
    X = rng.normal(size=(7, 2))
    A = rng.normal(size=(7, 7))
    M = A + A.T
    junk = np.tril(M) + np.triu(rng.normal(size=(7, 7)), 1)
    full = kernel.gradient_contract(X, M)
    promised = kernel.gradient_contract(X, junk, symmetric=True)
    if lower:
        assert_allclose(promised, full, rtol=1e-12, atol=1e-12)
