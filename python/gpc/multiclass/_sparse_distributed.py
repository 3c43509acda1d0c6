"""Sparse multi-class EP in batch on a distributed engine (SEP §2.3, Fig. 1 right; gpc.distributed).

The master (the estimator) holds θ, Z, ε and every class's q(w_k); the engine's shards hold rows, their
class labels and their pair sites (5 C + 3 numbers per point, :class:`gpc.multiclass.ep._Sites`).  A
batch iteration (:func:`gpc.sparse.core.steps.iteration`) is two rounds of pure shard steps that run the
same per-block functions as the in-process fit:

* :func:`site_task`: every pair site of the shard refined against q (and, under the Beta treatment,
  the shard's ψ̃ᵢ in turn, starting from the master's Q(ρ) = Beta(a, b)), returning per class the sums
  (P_k − I, h_k) of its new sites with the current factors and the sums of its ψ̃ᵢ's exponents (Q's
  new Beta is the prior times all of them).  Each of K shards moves its ψ̃ᵢ by 1/K of its sweep's
  change (:func:`share_outlier_change`), so Q's new Beta is the mean of the K Betas the shards
  reached, each proper; a sum of K full changes from the same Beta need not be (two shards took
  Beta(1, 9) to Beta(53.5, −7.01)).
* :func:`evidence_task`: the shard's :class:`gpc.multiclass.sparse.EvidenceParts`.

The master adds the shards' parts in shard order.  The pair sites are refined in parallel in process
too, so the fit equals the in-process one up to the order of the sums, except for the ψ̃ᵢ: in
process they are refined one after another over all points, here one after another within each shard
and the shards in parallel from the same Beta, each shard's change shared out by 1/K (an EP schedule
with the same fixed points: a ψ̃ᵢ stays where its own refinement leaves it; with one shard the two are
the same).  Minibatches and tied sites train in process only.
"""

import numpy as np

from .._parallel import BLOCK_ROWS
from ..sparse.core.rows import Rows
from ..sparse.core.shards import light, sites_home
from ..sparse.core.trainers import TrainingRows
from .ep import _Sites
from .sparse import EvidenceParts, evidence_pass, refines_outliers, site_pass


def pack(sites):
    """A :class:`_Sites`' arrays as one (n, 5 C + 3) array (what the engine shards by rows)."""
    return np.column_stack([getattr(sites, name) for name in _Sites.ARRAYS])


def unpack(packed, y, C):
    """:func:`pack`'s inverse for class labels ``y`` (copies)."""
    sites = _Sites(np.ascontiguousarray(y, dtype=np.intp), C)
    at = 0
    for name in _Sites.ARRAYS:
        width = 1 if getattr(sites, name).ndim == 1 else C
        block = packed[:, at:at + width]
        setattr(sites, name, np.ascontiguousarray(block[:, 0] if width == 1 else block))
        at += width
    return sites


def _no_sites(n_rows):
    """A shard's first sites: None, meaning those of the persisted packed columns."""
    return None


def _current(y, S0, sites, C, lam_prior):
    """The shard's sites (the first ones unpacked from S0), with the fixed rate's log-odds λᵢ."""
    if sites is None:
        sites = unpack(np.asarray(S0), y, C)
    if lam_prior is not None:
        sites.lam_i[:] = lam_prior
    return sites


def share_outlier_change(old, new, share):
    """Move ``new``'s ψ̃ᵢ (αᵢ, βᵢ, λᵢ) back to ``old`` + ``share`` × (new − old), in place.

    A shard's sweep from Q's Beta(a, b) ends at a proper Beta(a + Δa, b + Δb) (each damped step
    of the sweep is a convex combination of proper Betas); with ``share`` = 1/K the K shards'
    changes add up to Beta(a + Σ Δa/K, b + Σ Δb/K), the mean of the K proper Betas, proper too.
    A ψ̃ᵢ is unchanged exactly when its refinement leaves it unchanged, so the fixed points are
    those of the in-process sweep."""
    for name in ("alpha", "beta", "lam_i"):
        before, after = getattr(old, name), getattr(new, name)
        after[...] = before + share * (after - before)


def site_task(X, y, S0, qs, theta, sites):
    """Round 1 of a batch iteration on one shard: its sites refined (:func:`site_pass`) and
    (per-class sums, Σ αᵢ, Σ βᵢ, the shard's largest moment mismatch); under the Beta treatment
    the ψ̃ᵢ move by ``share`` (1/K of K shards) of their sweep's change."""
    model, factors, damping, block_rows, ab, lam_prior, share, outliers = theta
    current = _current(y, S0, sites, model.n_classes, lam_prior)
    new, sums, _, mismatch = site_pass(X, y, current, factors, qs, model, ab, damping, block_rows,
                                       outliers=outliers)
    if model.beta and share != 1.0:
        share_outlier_change(current, new, share)
    return new, (sums, float(np.sum(new.alpha)), float(np.sum(new.beta)), mismatch)


def evidence_task(X, y, S0, qs, theta, sites):
    """Round 2 on one shard: its :class:`EvidenceParts` (as nested tuples) at q; the sites are
    returned as they are (the engine logs nothing)."""
    model, factors, ab, rho, block_rows, gradient, held, lam_prior = theta
    current = _current(y, S0, sites, model.n_classes, lam_prior)
    parts = evidence_pass(X, y, current, factors, qs, model, ab, rho, block_rows, gradient, held)
    out = parts.as_tuple()
    if not gradient:                      # no None leaves: the engine adds every leaf
        out = (out[0], 0.0, out[2], out[3])
    return sites, out


def _home(sites):
    """What comes home of a shard's sites: packed, or None for a shard that never changed them."""
    return None if sites is None else pack(sites)


class MultiClassShards:
    """The shards of one batch fit: X, the class labels and the sites, loaded once on ``client``.

    Parameters
    ----------
    client : dask.distributed.Client or an engine of gpc.distributed (InProcessEngine(n_shards=K))
    X : (n, d) NumPy, memmap or Dask array
    y : (n,) class indices
    state : :class:`gpc.multiclass.sparse.SparseMultiClassState`, whose sites start the shards
    timeout : float, seconds any wait on the cluster may take
    """

    def __init__(self, client, X, y, state, timeout=300.0):
        from ..distributed import make_engine

        self.engine = make_engine(client, timeout=timeout)
        self.y = np.ascontiguousarray(y, dtype=np.intp)
        self.initial = pack(state.sites)
        self.engine.load((X, self.y, self.initial), _no_sites)
        state.remote_beta = state.beta_posterior()

    def finish(self, state, interrupted=False):
        """Bring the sites home into ``state`` and release the shards; whether they came home (an
        interrupted fit waits a few seconds and does not recover lost workers)."""
        try:
            shards = sites_home(self.engine, _home, interrupted)
            if shards is None:
                return False
            bounds = self.engine.bounds
            parts = [self.initial[lo:hi] if s is None else s
                     for s, lo, hi in zip(shards, bounds[:-1], bounds[1:])]
            state.sites = unpack(np.concatenate(parts), self.y, state.C)
            if state.model.noise == "fixed":     # ε may have moved after the last shard step
                state.sites.lam_i[:] = state.prior_log_odds
            state.remote_beta = None
            return True
        finally:
            self.engine.close()


class ShardedClassRows(Rows):
    """All the rows of a batch step on the engine: the core's rows (:class:`gpc.sparse.core.rows.Rows`)
    for its step loop, as :class:`gpc.multiclass.sparse.LocalClassRows` (batch only)."""

    def __init__(self, shards, state, model):
        self.shards, self.state, self.model = shards, state, model
        self.size = shards.engine.n_rows
        self._ab = None

    def _light(self):
        pairs = [light(q, f) for q, f in zip(self.state.qs, self.state.factors)]
        return [q for q, _ in pairs], [f for _, f in pairs]

    def _lam_prior(self):
        return self.state.prior_log_odds if self.model.noise == "fixed" else None

    def update_sites(self, damping):
        st, model = self.state, self.model
        qs, factors = self._light()
        share = 1.0 / (len(self.shards.engine.bounds) - 1)
        sums, a_sum, b_sum, mismatch = self.shards.engine.step(
            site_task, qs, (model, factors, float(damping), BLOCK_ROWS, st.beta_posterior(),
                            self._lam_prior(), share, refines_outliers(st)))
        self._ab = (model.a0 + a_sum, model.b0 + b_sum)
        st.mismatch = float(mismatch)      # the sum of the shards' largest: a bound on the largest
        return sums

    def commit(self):
        if self.model.beta:
            self.state.remote_beta = self._ab

    def revert(self):
        self.shards.engine.revert()

    def evidence_parts(self, gradient, held):
        st, model = self.state, self.model
        qs, factors = self._light()
        out = self.shards.engine.step(
            evidence_task, qs, (model, factors, st.beta_posterior(), st.rho, BLOCK_ROWS,
                                bool(gradient), held, self._lam_prior()))
        log_terms, classes, excess, n_bad = out
        return EvidenceParts(float(log_terms), classes if gradient else None, float(excess),
                             int(n_bad))


class EngineClassRows(TrainingRows):
    """The rows of a multi-class fit on an engine's shards (batch training only)."""

    def __init__(self, shards):
        self.shards, self.n = shards, shards.engine.n_rows

    def batches(self, size):
        raise ValueError("sparse multi-class training on client= runs in batch: use "
                         "batch_size=None")

    def all_rows(self, k, state, likelihood):
        return ShardedClassRows(self.shards, state, likelihood)

    def batch_rows(self, k, state, likelihood, batch, sites=True):
        return self.batches(None)

    def svi_rows(self, k, likelihood, batch):
        return self.batches(None)

    def objective_rows(self, k, likelihood):
        return self.batches(None)

    def start_minibatches(self, k, state):
        return self.batches(None)

    def close(self, states, interrupted=False):
        return self.shards.finish(states[0], interrupted)
