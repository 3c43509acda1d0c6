"""The sparse core's step loop and its one failure rule (python/gpc/sparse/core/steps.py), on a
model made of the least a state and its rows must give, so that what is checked is the loop."""

import pytest

from gpc.exceptions import DivergenceError
from gpc.sparse.core import steps
from gpc.sparse.core.rows import Rows


class State(steps.SparseState):
    """Sites are one number; q "has no factor" when the rows' sum is negative."""

    def __init__(self, n):
        super().__init__(n, 0, 1.0)
        self.sites, self.q = 0.0, 0.0

    def rebuild(self, sums):
        if sums < 0:
            return False
        self.q = sums
        return True

    def snapshot(self):
        return self.sites, self.q

    def restore(self, before):
        self.sites, self.q = before

    def log_normaliser(self):
        return 0.0

    def data_terms(self, parts):
        return parts, 0


class BatchRows(Rows):
    """All rows: each pass hands out the next of ``sums`` and reports ``log_terms``."""

    undoable = True

    def __init__(self, state, sums, log_terms):
        self.state, self.size, self.sums, self.log_terms = state, state.n, list(sums), log_terms
        self.dampings, self.committed, self.reverted = [], 0, 0

    def update_sites(self, damping):
        self.dampings.append(damping)
        self._pending = self.sums.pop(0)
        self.state.mismatch = abs(self._pending - self.state.sites)
        return self._pending

    def commit(self):
        self.state.sites = self._pending
        self.committed += 1

    def revert(self):
        self.reverted += 1

    def evidence_parts(self, gradient, held):
        return self.log_terms(self.state)


def test_a_pass_without_a_factor_is_reverted_counted_and_halves_the_damping():
    state = State(10)
    rows = BatchRows(state, [1.0, -1.0, 2.0], lambda st: -1.0)
    for _ in range(3):
        steps.iteration(state, rows, 0.5)
    assert rows.dampings == [0.5, 0.5, 0.25]
    assert (rows.committed, rows.reverted, state.skipped_passes) == (2, 1, 1)
    assert state.sites == state.q == 2.0 and state.damping_scale == 0.5


def test_a_pass_whose_log_z_is_not_a_log_probability_is_undone():
    # log Z is -q below q = 1 and +q above: the pass to q = 3 is undone, the state before it kept
    state = State(10)
    rows = BatchRows(state, [0.5, 3.0, 0.2], lambda st: -st.q if st.q < 1.0 else st.q)
    values = [steps.iteration(state, rows, 1.0) for _ in range(3)]
    assert values == [-0.5, -0.5, -0.2]
    assert state.sites == state.q == 0.2 and state.skipped_passes == 1
    assert rows.dampings == [1.0, 1.0, 0.5]


def test_the_undo_raises_once_the_damping_would_fall_below_its_floor():
    state = State(10)
    rows = BatchRows(state, [1.0] * 20, lambda st: 1.0)
    with pytest.raises(DivergenceError):
        for _ in range(20):
            steps.iteration(state, rows, 1.0)
    assert state.damping_scale < steps.MIN_DAMPING_SCALE and state.q == 0.0


def test_run_ep_stops_when_the_sites_settle():
    state = State(10)
    rows = BatchRows(state, [1.0, 1.5, 1.5, 1.5], lambda st: -1.0)
    assert steps.run_ep(state, rows, damping=1.0, tol=1e-12, max_iter=10) == (3, True)
