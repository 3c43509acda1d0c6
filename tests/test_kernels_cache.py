"""Kernels keep their validated θ entries between changes (Kernel._hyper_entries), and the
generic bound object of k + white noise takes k's blocks from k's compiled bound: both must give
exactly what the kernel's own methods give, after any change of the hyperparameters."""

import numpy as np
import pytest

from gpc.kernels import RBF, ConstantKernel, WhiteKernel
from gpc.kernels.base import BoundKernel

LS3 = np.array([0.6, 1.3, 2.1])


def _problem(b=23, m=7, seed=0):
    rng = np.random.default_rng(seed)
    X, Z = rng.normal(size=(b, 3)) + 5.0, rng.normal(size=(m, 3)) + 5.0
    G = rng.normal(size=(m, m))
    return X, Z, rng.normal(size=(b, m)), rng.normal(size=b), G + G.T


def test_theta_follows_an_in_place_write_to_a_hyperparameter_array():
    k = RBF(LS3.copy(), (1e-3, 1e3))
    assert np.allclose(k.theta, np.log(LS3))
    k.length_scale[1] = 7.0                       # no set_params: the snapshot sees the bytes
    np.testing.assert_array_equal(k.theta, np.log([0.6, 7.0, 2.1]))
    k.length_scale_bounds = (1e-3, 5.0)           # plain assignment of the bounds
    np.testing.assert_array_equal(k.bounds[:, 1], np.log(5.0))


def test_a_bad_value_set_after_a_read_is_still_refused():
    k = ConstantKernel(2.0, (np.exp(-10.0), np.exp(10.0)))     # NumPy-float bounds are kept too
    assert k.theta[0] == np.log(2.0)
    k.constant_value = -1.0
    with pytest.raises(ValueError, match="must be > 0"):
        k.theta
    k.constant_value = np.nan
    with pytest.raises(ValueError, match="finite"):
        k.theta


def test_kept_entries_cannot_be_written_by_their_readers():
    k = RBF(LS3.copy())
    for _, values, bounds in k._hyper_entries():
        assert not values.flags.writeable and not bounds.flags.writeable
    assert k.length_scale.flags.writeable         # the kernel's own array is untouched


def test_a_theta_step_gives_the_entries_a_full_clone_gives():
    k = ConstantKernel(2.0, (np.exp(-10.0), np.exp(10.0))) * RBF(LS3.copy()) + WhiteKernel(0.5)
    theta = k.theta + np.linspace(-0.3, 0.4, len(k.theta))
    stepped, cloned = k._with_theta(theta), k.clone_with_theta(theta)
    np.testing.assert_array_equal(stepped.theta, cloned.theta)
    np.testing.assert_array_equal(stepped.bounds, cloned.bounds)
    assert stepped.hyperparameter_names == cloned.hyperparameter_names
    np.testing.assert_array_equal(k.theta, np.log([2.0, *LS3, 0.5]))     # the original kept


@pytest.mark.parametrize("kernel", [
    lambda: ConstantKernel(2.5) * RBF(LS3) + WhiteKernel(0.3),
    lambda: WhiteKernel(0.3) + RBF(1.2) * ConstantKernel(0.7),
    lambda: ConstantKernel(2.5, "fixed") * RBF(LS3) + WhiteKernel(0.3, "fixed"),
    lambda: RBF(LS3, "fixed") + WhiteKernel(0.3),
])
def test_the_noise_split_gives_the_kernels_own_bits(kernel):
    # the generic object (no compiled path of its own) against the kernel's methods, to the bit
    X, Z, G, w, Guu = _problem()
    k = kernel()
    bound = k._bound_to(Z)
    assert type(bound) is BoundKernel and not bound.nogil and bound._inner is not None
    np.testing.assert_array_equal(bound.gram(), k(Z))
    np.testing.assert_array_equal(bound.cross(X), k._cross(X, Z))
    np.testing.assert_array_equal(bound.diag(X), k.diag(X))
    K = k._cross(X, Z)
    g_theta, g_Z = bound.cross_gradient(X, G.copy(), w, K)
    ref_theta, ref_Z, _ = k._cross_gradient(X, Z, G.copy(), w, K, overwrite=True)
    np.testing.assert_array_equal(g_theta, ref_theta)
    np.testing.assert_array_equal(g_Z, ref_Z)
    Kuu = bound.gram()
    g_theta, g_Z = bound.gram_gradient(Guu.copy(), Kuu)
    ref_theta, ref_Z = k._gram_gradient(Z, Guu.copy(), Kuu)
    np.testing.assert_array_equal(g_theta, ref_theta)
    np.testing.assert_array_equal(g_Z, ref_Z)
    assert len(g_theta) == len(k.theta)
