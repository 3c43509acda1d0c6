"""SparseMultiClassGPC's ``step_rule`` and ``damping_decay`` (python/gpc/sparse/core/steps.py's
AdaptiveRates, python/gpc/sparse/core/trainers.py's damping decay): the schedule of the ICML 2017
authors' batch EP and SEP, which gpc's smgpc-authors comparison runs.

* AdaptiveRates' steps: rate times gradient, each rate ×1.02 (capped) while its gradient keeps
  its sign and ×0.5 when it flips;
* the damping after k epochs is damping · decay^k in batch, tied and minibatch schedules, and the
  default decay 1 leaves a fit bit for bit as it was;
* in batch on a small problem the adaptive rates reach a higher log Z in 30 passes than Adadelta;
* a callable ``step_rule`` makes the optimiser, which gets log Z's gradient over every packed
  parameter once per pass and moves them by what it returns.
"""

import numpy as np
import pytest

from gpc import SparseMultiClassGPC
from gpc.datasets import load_thyroid
from gpc.kernels import RBF, ConstantKernel
from gpc.sparse.core import steps


def _thyroid():
    data = load_thyroid(binary=False)
    return (data.X - data.X.mean(axis=0)) / data.X.std(axis=0), data.y


def test_adaptive_rates_grow_while_the_sign_holds_and_halve_when_it_flips():
    opt = steps.AdaptiveRates(3, rate=0.01, up=1.02, down=0.5, max_rate=0.0103)
    g = np.array([2.0, -1.0, 4.0])
    np.testing.assert_array_equal(opt.step(g), 0.01 * g)
    g2 = np.array([1.0, 3.0, 2.0])                  # 1st and 3rd keep their sign, 2nd flips
    np.testing.assert_allclose(opt.step(g2), [0.0102 * 1.0, 0.005 * 3.0, 0.0102 * 2.0])
    np.testing.assert_allclose(opt.step(g2), [0.0103, 0.0051 * 3.0, 0.0103 * 2.0])   # capped
    opt.lr = 0.5
    np.testing.assert_allclose(opt.step(-g2), 0.5 * np.array([0.00515, 0.00255, 0.00515]) * -g2)


@pytest.mark.parametrize("batch_size,tied", [(None, False), (None, True), (100, False)])
def test_the_damping_decays_by_its_factor_every_epoch(batch_size, tied):
    X, y = _thyroid()
    clf = SparseMultiClassGPC(n_inducing=8, model="standard", batch_size=batch_size,
                              tied_sites=tied, damping=0.5, damping_decay=0.9, max_iter=3,
                              random_state=0, progress=False).fit(X, y)
    assert clf._trainer.damping == pytest.approx(0.5 * 0.9 ** 3, rel=1e-12)
    assert clf._state.skipped_passes == 0


def test_the_default_decay_and_step_rule_leave_the_fit_unchanged():
    X, y = _thyroid()
    common = dict(n_inducing=8, model="standard", batch_size=None, max_iter=5, random_state=0,
                  progress=False)
    a = SparseMultiClassGPC(**common).fit(X, y)
    b = SparseMultiClassGPC(step_rule="adadelta", damping_decay=1.0, **common).fit(X, y)
    assert isinstance(b._state.optimizer, steps.Adadelta)
    assert a.log_marginal_likelihood_value_ == b.log_marginal_likelihood_value_
    np.testing.assert_array_equal(a.predict_proba(X[:20]), b.predict_proba(X[:20]))


def test_adaptive_rates_climb_log_z_faster_than_adadelta_in_batch():
    X, y = _thyroid()
    common = dict(n_inducing=10, model="standard", batch_size=None, max_iter=30, random_state=0,
                  progress=False)
    ada = SparseMultiClassGPC(**common).fit(X, y)
    rates = SparseMultiClassGPC(step_rule="adaptive", **common).fit(X, y)
    assert isinstance(rates._state.optimizer, steps.AdaptiveRates)
    assert rates.log_marginal_likelihood_value_ > ada.log_marginal_likelihood_value_ + 1.0


class _Frozen:
    """A step rule that records its gradients and never moves the parameters."""

    made = []

    def __init__(self, size, lr):
        self.size, self.lr, self.grads = size, lr, []
        _Frozen.made.append(self)

    def step(self, grad):
        self.grads.append(np.array(grad))
        return np.zeros(self.size)


def test_a_callable_step_rule_makes_the_optimiser_that_moves_the_parameters():
    X, y = _thyroid()
    _Frozen.made.clear()
    kernel = ConstantKernel(2.0) * RBF(1.5)
    Z = X[::36]                                     # 6 rows, each class's starting Z
    common = dict(kernel=kernel, n_inducing=len(Z), inducing_points=Z, batch_size=None,
                  max_iter=4, random_state=0, progress=False)
    clf = SparseMultiClassGPC(step_rule=_Frozen, learning_rate=0.3, **common).fit(X, y)
    opt, = _Frozen.made
    assert clf._state.optimizer is opt and opt.lr == 0.3
    # every class's log θ (constant and length-scale: 3 x 2), then Z (3 x 6 x 5), each pass
    assert len(opt.grads) == 4 and all(g.shape == (6 + 90,) for g in opt.grads)
    assert np.all(np.isfinite(opt.grads[-1])) and np.any(opt.grads[-1] != 0)
    # zero steps: the kernels and inducing points end where they started; Adadelta's do not
    for k, Zk in zip(clf.kernels_, clf.inducing_points_):
        np.testing.assert_array_equal(k.theta, kernel.theta)
        np.testing.assert_array_equal(Zk, Z)
    moved = SparseMultiClassGPC(learning_rate=0.3, **common).fit(X, y)
    assert not np.array_equal(moved.kernels_[0].theta, kernel.theta)


@pytest.mark.parametrize("kwargs", [dict(step_rule="rprop"), dict(step_rule=["adaptive"]),
                                    dict(damping_decay=0.0), dict(damping_decay=1.5)])
def test_bad_step_rule_or_decay_raises(kwargs):
    X, y = _thyroid()
    with pytest.raises(ValueError):
        SparseMultiClassGPC(n_inducing=5, max_iter=1, progress=False, **kwargs).fit(X, y)
