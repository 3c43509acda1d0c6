"""Every method's result keeps its evidence gradient through pickling (no closures as gradient_matrix)."""

import pickle

import numpy as np
import pytest

from gpc.inference import METHODS, infer
from helpers import rbf, toy


@pytest.mark.parametrize("method", sorted(METHODS))
def test_gradient_matrix_survives_pickling(method):
    X, y = toy(25, seed=2)
    K = rbf(X, 1.0, 2.0)
    lik = "heaviside" if method.startswith("mf") else "probit"
    res = infer(K, y, likelihood=lik, method=method)
    back = pickle.loads(pickle.dumps(res))
    if res.gradient_matrix is None:
        assert METHODS[method].has_gradient is False and back.gradient_matrix is None
        return
    assert METHODS[method].has_gradient
    # the same computation on the same numbers: equal to rounding of the O(n³) products (1e-12)
    np.testing.assert_allclose(back.gradient_matrix(), res.gradient_matrix(), rtol=0, atol=1e-12)
