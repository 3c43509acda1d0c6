"""The sparse trainers behind one interface, and the interface of the rows they train on.

A sparse fit holds one state per problem (a binary fit one for two classes, one per class
one-vs-rest; a multi-class fit one): θ, Z and q(u) with whatever the method keeps besides (SEP's
sites, SVI's (μ, L_q)).  A :class:`Trainer` advances all of them, epoch by epoch, on a
:class:`TrainingRows` source: the model's rows in this process or their shards on an engine
(``client=``; gpc.sparse._train.InProcessRows and EngineRows, gpc.multiclass.sparse.MultiClassRows,
gpc.multiclass._sparse_distributed.EngineClassRows).  The estimator asks nothing else of a method,
so it never looks at a state's type, and the SEP trainers run the core's step loop
(gpc.sparse.core.steps) on any model's state:

* :class:`SEPBatch`: one parallel site pass over all rows, then one inner Adadelta step (SEP §2.3);
  at fixed parameters Anderson-accelerated, and with ``tol`` stopping once the sites settle.
* :class:`SEPMinibatch`: per-row sites refined and swapped in q one minibatch at a time, each
  followed by a stochastic step (SEP eq. (6)).
* :class:`SEPTied`: one shared average site (stochastic EP), a step per block of rows; it keeps no
  per-row state, so ``partial_fit`` may bring rows the fit never saw (``streams``).
* :class:`SVIMinibatch`: Adadelta on the minibatch estimate of SVI's bound (SEP eq. (8)).
* :class:`LBFGSTrainer` (GFITC; SVI in batch): L-BFGS-B on the problems' objectives together,
  one evaluation per epoch, ending on the best point it evaluated.

Every trainer trains inside ``threads()``, gpc._parallel.block_threads(n_jobs): the engine's
blocks of rows and column panels on ``n_jobs`` threads, BLAS on one thread per call.
"""

import warnings
from abc import ABC, abstractmethod

import numpy as np
from scipy.optimize import Bounds, minimize

from ... import _parallel
from ..._parallel import BLOCK_ROWS
from ...exceptions import ConvergenceWarning, NumericalError
from ...optimize import stop_message
from .steps import batch_index, iteration, random_batches, take_rows, tied_iteration


# -- where the rows are ------------------------------------------------------------------------
class TrainingRows(ABC):
    """The training rows of every problem of a fit, and their labels in the model's form.

    ``batches(size, rng)`` draws an epoch's minibatches; the other methods give what a step of
    problem ``k`` runs on: every row (a batch step), one minibatch (``batch``, an item of
    ``batches``) for SEP, tied sites or SVI, and all rows with their labels for an L-BFGS-B
    objective."""

    n: int

    @abstractmethod
    def batches(self, size, rng=None):
        """One epoch's minibatches of about ``size`` rows: random subsets of the rows, which
        together cover every row once (:func:`random_batches`); with ``rng`` None the rows in
        order (consecutive ranges)."""

    @abstractmethod
    def all_rows(self, k, state, likelihood):
        """Every row of problem k (:class:`gpc.sparse.core.rows.Rows`)."""

    @abstractmethod
    def batch_rows(self, k, state, likelihood, batch, sites=True):
        """One minibatch of problem k (:class:`gpc.sparse.core.rows.Rows`); with ``sites=False``
        for tied sites (no per-row sites)."""

    @abstractmethod
    def svi_rows(self, k, likelihood, batch):
        """(rows, labels) of a minibatch for SVI's objective."""

    @abstractmethod
    def objective_rows(self, k, likelihood):
        """(rows, labels) of every row for an L-BFGS-B objective."""

    @abstractmethod
    def start_minibatches(self, k, state):
        """Get SEP's sites ready for minibatch steps (their directions, SEP §2.3)."""

    def close(self, states, interrupted=False):
        """The end of a training run; whether every state has its per-row sites (in process: yes)."""
        return True


class LocalTrainingRows(TrainingRows):
    """The rows in this process: any row-sliceable X (NumPy, ``np.memmap``, Dask), read block by
    block, and each problem's labels (``targets[k]``).  A model's subclass gives the rows of a
    step (``all_rows``, ``batch_rows``)."""

    def __init__(self, X, targets):
        self.X, self.targets, self.n = X, targets, X.shape[0]

    def batches(self, size, rng=None):
        return random_batches(self.n, size, rng)

    def svi_rows(self, k, likelihood, batch):
        rows = batch_index(batch)
        return take_rows(self.X, rows), self.targets[k][rows]

    def objective_rows(self, k, likelihood):
        return self.X, self.targets[k]

    def start_minibatches(self, k, state):
        state.start_minibatches(self.X, BLOCK_ROWS)


# -- the trainers --------------------------------------------------------------------------------
class Trainer(ABC):
    """The training of a sparse fit: one state per problem, advanced together.

    Parameters
    ----------
    states : list, one state per binary problem (``SEPState``, ``SVIState`` or ``GFITCState``)
    likelihood : gpc.likelihoods.Likelihood
    rng : numpy Generator, draws each epoch's minibatches
    n_jobs : int, default 1
        Threads of the engine's blocks (:meth:`threads`); the estimator gives its resolved
        ``n_jobs``.
    """

    #: ``partial_fit`` may bring rows that ``fit`` never saw (no per-row state)
    streams = False
    #: epochs one ``partial_fit`` call runs
    partial_epochs = 1

    def __init__(self, states, likelihood, rng, n_jobs=1):
        self.states, self.likelihood, self.rng = states, likelihood, rng
        self.n_jobs = n_jobs

    def threads(self):
        """The context a training runs in: the sparse engine's blocks of rows and column panels on
        ``n_jobs`` threads, BLAS on one thread per call (gpc._parallel.block_threads)."""
        return _parallel.block_threads(self.n_jobs)

    @abstractmethod
    def steps_per_epoch(self, rows):
        """The steps (``tick`` calls) of one epoch on ``rows``, all problems together."""

    @abstractmethod
    def train(self, rows, epochs, tick, record):
        """Run ``epochs`` epochs on ``rows`` (a :class:`TrainingRows`): ``tick()`` after every step,
        ``record(objective)`` after every epoch with log Z_q (or SVI's bound) summed over the
        problems; the states hold the model of the last completed step at any time."""


class StepTrainer(Trainer):
    """Trainers that take steps, each problem's epoch after the other's (one epoch of all problems
    is one ``record``)."""

    def train(self, rows, epochs, tick, record):
        with self.threads():
            for _ in range(epochs):
                record(sum(self.epoch(rows, k, state, tick) for k, state in enumerate(self.states)))
                self.end_epoch()

    @abstractmethod
    def epoch(self, rows, k, state, tick):
        """One epoch of problem k; returns its objective."""

    def end_epoch(self):
        """After every epoch of all problems."""


class _Damped:
    """A SEP trainer's ``damping``, multiplied by ``damping_decay`` after every epoch: 1 keeps it
    constant; the batch code of Villacampa-Calvo & Hernández-Lobato (ICML 2017) anneals it by
    0.99 a pass.  The estimators set it after construction."""

    damping_decay = 1.0

    def end_epoch(self):
        self.damping *= self.damping_decay


class SEPBatch(_Damped, StepTrainer):
    """Batch SEP: every site refined from the same q, then one inner step (SEP §2.3); at fixed
    parameters the passes are Anderson-accelerated (gpc.sparse.core.steps.SiteAnderson).

    ``tol``: None runs every epoch asked for; a number ends training after the first epoch whose
    site pass moved no state's sites by more than it (each state's ``mismatch``: the largest
    change of a binary site's τ or ν, the largest undamped moment mismatch of a multi-class
    pair site or P(zᵢ = 1)); the estimators' ``max_iter="auto"`` sets it.
    """

    def __init__(self, states, likelihood, rng, damping, n_jobs=1):
        super().__init__(states, likelihood, rng, n_jobs)
        self.damping = damping
        self.tol = None

    def train(self, rows, epochs, tick, record):
        with self.threads():
            for _ in range(epochs):
                record(sum(self.epoch(rows, k, state, tick) for k, state in enumerate(self.states)))
                self.end_epoch()
                if self.tol is not None and all(s.mismatch < self.tol for s in self.states):
                    return

    @staticmethod
    def iterate(state, rows, damping):
        """The step: the core's :func:`gpc.sparse.core.steps.iteration`, for every model."""
        return iteration(state, rows, damping)

    def steps_per_epoch(self, rows):
        return len(self.states)

    def epoch(self, rows, k, state, tick):
        value = self.iterate(state, rows.all_rows(k, state, self.likelihood), self.damping)
        tick()
        return value


class _Minibatches(StepTrainer):
    """A step per minibatch of ``batch_size`` rows.  Each epoch draws a new permutation of the
    rows from ``rng`` and cuts it into consecutive slices of ``batch_size`` rows; a minibatch is
    the rows of one slice, in row order (``rows.batches``), so minibatches are random subsets
    whatever the order of the rows (class-sorted rows give mixed minibatches).

    The epoch's objective is the mean of its steps' estimates (each an estimate over all n rows);
    the state's ``log_z`` is that mean over the epoch's steps so far, so after a full epoch it is
    the epoch's objective (``history_``), not one minibatch's noisy estimate."""

    def __init__(self, states, likelihood, rng, batch_size, n_jobs=1):
        super().__init__(states, likelihood, rng, n_jobs)
        self.batch_size = batch_size

    def steps_per_epoch(self, rows):
        return len(self.states) * len(rows.batches(self.batch_size))

    def epoch(self, rows, k, state, tick):
        self.start(rows, k, state)
        values = []
        for batch in rows.batches(self.batch_size, self.rng):
            values.append(self.step(rows, k, state, batch))
            state.log_z = float(np.mean(values))
            tick()
        return state.log_z

    def start(self, rows, k, state):
        """Before an epoch's steps."""

    @abstractmethod
    def step(self, rows, k, state, batch):
        """One minibatch step; returns its estimate of the objective over all n rows."""


class SEPMinibatch(_Damped, _Minibatches):
    """Minibatch SEP (SEP eq. (6)): each site kept with its direction, swapped in q along it."""

    def __init__(self, states, likelihood, rng, batch_size, damping, n_jobs=1):
        super().__init__(states, likelihood, rng, batch_size, n_jobs)
        self.damping = damping

    iterate = staticmethod(SEPBatch.iterate)

    def start(self, rows, k, state):
        rows.start_minibatches(k, state)

    def step(self, rows, k, state, batch):
        return self.iterate(state, rows.batch_rows(k, state, self.likelihood, batch), self.damping)


class SEPTied(_Damped, _Minibatches):
    """Stochastic EP: one shared average site, refreshed by every block of rows."""

    streams = True

    def __init__(self, states, likelihood, rng, batch_size, damping, n_jobs=1):
        super().__init__(states, likelihood, rng, batch_size, n_jobs)
        self.damping = damping

    @staticmethod
    def iterate(state, rows, damping):
        """The step: the core's :func:`gpc.sparse.core.steps.tied_iteration`."""
        return tied_iteration(state, rows, damping)

    def step(self, rows, k, state, batch):
        return self.iterate(state, rows.batch_rows(k, state, self.likelihood, batch, sites=False),
                            self.damping)


class SVIMinibatch(_Minibatches):
    """SVI's bound (8) by Adadelta on minibatch estimates (data terms scaled by n/|M|)."""

    def __init__(self, states, likelihood, rng, batch_size, learning_rate, n_jobs=1):
        super().__init__(states, likelihood, rng, batch_size, n_jobs)
        self.learning_rate = learning_rate

    def step(self, rows, k, state, batch):
        Xb, yb = rows.svi_rows(k, self.likelihood, batch)
        return state.minibatch_step(self.likelihood, Xb, yb, rows.n, self.learning_rate)


class _BudgetSpent(Exception):
    """Ends L-BFGS-B after the evaluations it was given."""


class LBFGSTrainer(Trainer):
    """L-BFGS-B on the sum of the problems' objectives over their parameters stacked (the problems
    are independent, so the optimum is each problem's own), one evaluation per epoch.

    Each state gives ``params()``, ``bounds()``, ``objective(likelihood, X, y, p, block_rows)`` →
    (value, gradient), which moves the state to p when it can be evaluated and returns -inf there
    otherwise (``failure`` then holds the cause), and ``snapshot()`` / ``restore(snapshot)`` of its
    model.  A point that cannot be evaluated, or whose value or gradient is not finite, is handed
    to L-BFGS-B as a finite penalty above every value seen, with a zero gradient, so its line search
    backtracks (the states stay where they were); an infinite value would end
    the optimisation there (scipy's L-BFGS-B stops on it).  Exactly ``epochs`` evaluations run
    (fewer if L-BFGS-B converges); the states end on the best point evaluated.

    ``partial_fit`` runs two evaluations: a restarted L-BFGS-B first evaluates the point it starts
    from.
    """

    partial_epochs = 2
    #: None: scipy's L-BFGS-B; or scikit-learn's ``optimizer(obj_func, initial_theta, bounds)``
    #: convention, stopped by the budget as L-BFGS-B is (:meth:`_minimise`)
    optimizer = None

    def steps_per_epoch(self, rows):
        return 1

    def train(self, rows, epochs, tick, record):
        data = [rows.objective_rows(k, self.likelihood) for k in range(len(self.states))]
        sizes = np.cumsum([0] + [len(s.params()) for s in self.states])
        best, worst, spent = {}, [0.0], [0]

        def fun(p):
            if spent[0] == epochs:
                raise _BudgetSpent
            spent[0] += 1
            value, grad = 0.0, np.empty_like(p)
            for k, (state, (X, y)) in enumerate(zip(self.states, data)):
                part = slice(sizes[k], sizes[k + 1])
                before = state.snapshot()
                v, g = state.objective(self.likelihood, X, y, p[part], BLOCK_ROWS)
                if not (np.isfinite(v) and np.all(np.isfinite(g))):
                    # a finite value with a NaN gradient fails too: L-BFGS-B would step to NaN
                    state.restore(before)
                    tick()
                    if not best:
                        what = "evaluated" if not np.isfinite(v) else "differentiated"
                        raise NumericalError(
                            f"{state.name}: the objective cannot be {what} at the initial "
                            "hyperparameters and inducing points", value=v) from (
                            state.failure if not np.isfinite(v) else None)
                    return worst[0] + 1.0 + abs(worst[0]), np.zeros_like(p)
                value += v
                grad[part] = g
            if not best or value > best["value"]:
                best.update(value=value, states=[s.snapshot() for s in self.states])
            worst[0] = max(worst[0], -value)
            tick()
            record(value)
            return -value, -grad

        p0 = np.concatenate([s.params() for s in self.states])
        try:
            with self.threads():
                self._minimise(fun, p0, epochs, spent)
        except _BudgetSpent:
            pass
        finally:
            if best:              # end on the best point evaluated (also after an interruption)
                for state, snapshot in zip(self.states, best["states"]):
                    state.restore(snapshot)

    def _minimise(self, fun, p0, epochs, spent):
        """L-BFGS-B (or :attr:`optimizer`) on ``fun`` from p0 for at most ``epochs`` evaluations."""
        if len(p0) == 0:          # everything fixed: GFITC's EP alone (SVI has μ, L_q, never empty)
            fun(p0)
            return
        # one (low, high) pair per parameter, None or ±inf where free; as two arrays, since a
        # list of m(m+1)/2 pairs per class is converted by scipy one pair at a time
        lo, hi = np.concatenate([np.array(s.bounds(), dtype=float).reshape(-1, 2)
                                 for s in self.states]).T
        bounds = Bounds(np.where(np.isnan(lo), -np.inf, lo), np.where(np.isnan(hi), np.inf, hi))
        if self.optimizer is not None:

            def obj_func(theta, eval_gradient=True):
                value, grad = fun(np.asarray(theta, dtype=np.float64))
                return (value, grad) if eval_gradient else value

            self.optimizer(obj_func, p0.copy(), np.column_stack([bounds.lb, bounds.ub]))
            return
        res = minimize(fun, p0, jac=True, method="L-BFGS-B", bounds=bounds,
                       options={"maxfun": epochs, "maxiter": epochs})
        if res.status == 2:       # a failed line search (a spent budget ends in _BudgetSpent)
            warnings.warn(stop_message(res, f"of {self.states[0].name}'s objective after "
                                            f"{spent[0]} evaluations",
                                       "method='ep' (its steps need no line search), "
                                       "standardised X, or fewer inducing points if K_uu is "
                                       "near singular"), ConvergenceWarning, stacklevel=5)
