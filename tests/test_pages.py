"""gpc._pages.zeros: NumPy's zeros in base-size pages, for arrays written a block at a time."""

import copy
import pickle

import numpy as np
import pytest

from gpc import _pages


@pytest.mark.parametrize("shape", [(10, 3), (40_000, 50)])     # under and over 4 MiB
def test_zeros_is_a_writable_zero_array_that_copies_and_pickles(shape):
    V = _pages.zeros(shape, np.float32)
    assert V.shape == shape and V.dtype == np.float32 and V.flags.c_contiguous
    assert not V.any()
    V[1] = 2.5
    for other in (copy.deepcopy(V), pickle.loads(pickle.dumps(V)),
                  pickle.loads(pickle.dumps(V, protocol=5))):
        np.testing.assert_array_equal(other, V)
        other[2] = 1.0                     # writable, and its own memory
        assert other.flags.writeable and not V[2].any()


def test_a_slice_keeps_the_pages_alive():
    V = _pages.zeros((40_000, 50), np.float64)
    V[7] = 3.0
    row = V[7]
    del V
    assert np.all(row == 3.0)


def test_a_minibatch_fit_pickles_with_its_directions_and_continues_the_same():
    # the sites' directions (30,000 x 50 float32, 6 MB: base-size pages) travel with the pickled
    # model; partial_fit on both copies gives the same bits
    from gpc import SparseGaussianProcessClassifier

    rng = np.random.default_rng(0)
    X = rng.standard_normal((30_000, 3))
    y = (X[:, 0] + 0.3 * rng.standard_normal(30_000) > 0).astype(int)
    clf = SparseGaussianProcessClassifier(n_inducing=50, batch_size=500, max_iter=1,
                                          random_state=0, progress=False).fit(X, y)
    V = clf._trainer.states[0].V
    assert V.nbytes >= _pages.SMALL and V.any()
    copy_ = pickle.loads(pickle.dumps(clf))
    clf.partial_fit(X, y)
    copy_.partial_fit(X, y)
    np.testing.assert_array_equal(clf.predict_proba(X[:200]), copy_.predict_proba(X[:200]))
