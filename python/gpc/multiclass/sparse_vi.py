"""Sparse multi-class variational inference: the baseline of the scalable multi-class EP paper.

The model is that of :mod:`gpc.multiclass.sparse` with fixed label noise ε (Villacampa-Calvo &
Hernández-Lobato, ICML 2017): C latent functions, m inducing points per class held whitened,
u_k = L_k w_k, and the likelihood

    p(yᵢ | fᵢ) = (1 − ε) pᵢ + ε/(C − 1) (1 − pᵢ),   pᵢ = 1[yᵢ is the argmax of fᵢ₁ … f_iC],

the robust-max of Hensman, Matthews, Filippone & Ghahramani (2015, "MCMC for variationally sparse
Gaussian processes").  The approximation is variational (Hensman, Matthews & Ghahramani 2015,
SVGP, one per class): q(w_k) = N(μ_k, L_q,k L_q,kᵀ), independent across classes (or, with
``whiten=False``, q(u_k) held in u-space and seen through its whitened image: the same bound,
:func:`gpc.sparse.core.variational.svi_finish_u`), and the bound

    F = Σᵢ E_q[log p(yᵢ | fᵢ)] − Σ_k KL[q(w_k) ‖ N(0, I)]

with fᵢₖ ~ N(a_ikᵀμ_k, s_ik + |L_q,kᵀ a_ik|²) under q (no FITC term: s_ik is the conditional
variance, part of q's marginal).  Since p(yᵢ | fᵢ) takes two values,

    E_q[log p(yᵢ | fᵢ)] = log(ε/(C − 1)) + κ Pᵢ,   κ = log(1 − ε) − log(ε/(C − 1)),

    Pᵢ = ∫ N(f | μ_iy, σ²_iy) Π_{k≠y} Φ((f − μ_ik)/σ_ik) df      (RMGPC eq. (19)'s integral),

one Gauss–Hermite rule in f (:func:`argmax_probability`, with its derivatives in every μ_ik and
σ²_ik; docs/derivations-sparse-multiclass.md §11).  Everything per class is the binary SVI's
(the sparse core's, :mod:`gpc.sparse.core.variational`): q's marginals (``Posterior.marginals``),
the chain rule to A, μ_k and L_q,k (``svi_block``, handed each class's row coefficients through
:class:`_ClassCoefficients`), the KL and the K_uu part (``svi_finish``), and the kernel and Z
gradient (``InducingFactor.block_gradient``).  Training is the binary SVI's too: L-BFGS-B in batch
(:class:`gpc.sparse.core.trainers.LBFGSTrainer`) or Adadelta on minibatches with the data terms
scaled by n/|M| (:class:`gpc.sparse.core.trainers.SVIMinibatch`), the rows those of
:class:`gpc.multiclass.sparse.MultiClassRows`.

The noiseless argmax (ε = 0) has no bound: log p(yᵢ | fᵢ) = −∞ where yᵢ is not the argmax, a set
of positive mass under any Gaussian q.  So the method needs ε > 0 (fixed or learnt).
"""

import math

import numpy as np
from .. import _lapack, _sparse
from .._sparse_multiclass import argmax_quadrature
from ..exceptions import NotPositiveDefiniteError
from ..sparse.core.natural import Posterior, times_lower_rows
from ..sparse.core.passes import add_parts, as_block, block_ranges
from ..sparse.core.trainers import LBFGSTrainer, SVIMinibatch
from ..sparse.core.variational import (VariationalState, svi_block, svi_finish, svi_finish_u,
                                        whitened_q)
from .predict import N_NODES
from .sparse import (RANGE_ROWS, SERIAL, ArgmaxLikelihood, RowBlock, SparseMultiClassState,
                     theta_bounds, unpack_params)

#: the Gauss–Hermite rule of the expected log likelihood: RMGPC eq. (19)'s order (the predictive's)
_GH_X, _GH_W = np.polynomial.hermite.hermgauss(N_NODES)
_GH_W = _GH_W / math.sqrt(math.pi)
#: the floor of a latent variance (a unit prior's rounding level): the rule's nodes need σ > 0
MIN_VARIANCE = 1e-12


def argmax_probability(means, varis, y):
    """Pᵢ = P(yᵢ is the argmax) under independent N(μ_ik, σ²_ik), and its derivatives.

    With the nodes f_j = μ_iy + √2 σ_iy x_j and weights w_j/√π of the Gauss–Hermite rule,
    z_jk = (f_j − μ_ik)/σ_ik and R_jk = φ(z_jk) Π_{l≠y,k} Φ(z_jl) (derivation §11):

        Pᵢ ≈ Σ_j w_j Π_{k≠y} Φ(z_jk),
        ∂Pᵢ/∂μ_ik  = −Σ_j w_j R_jk / σ_ik,                  k ≠ y,
        ∂Pᵢ/∂σ²_ik = −Σ_j w_j R_jk z_jk / (2 σ²_ik),        k ≠ y,
        ∂Pᵢ/∂μ_iy  = −Σ_{k≠y} ∂Pᵢ/∂μ_ik,
        ∂Pᵢ/∂σ²_iy = Σ_j w_j (x_j / (√2 σ_iy)) Σ_{k≠y} R_jk / σ_ik,

    the derivatives of the rule itself (the nodes move with μ_iy and σ_iy), so the gradient is
    that of the value returned.  R is formed as
    exp(Σ_{l≠y} log Φ(z_jl) − log Φ(z_jk) + log φ(z_jk)), finite where Φ(z_jk) underflows.  The
    loops over rows, classes and nodes are compiled (gpc._sparse_multiclass.argmax_quadrature).

    Parameters
    ----------
    means, varis : (b, C) the marginal means and variances (variances floored at MIN_VARIANCE)
    y : (b,) class indices

    Returns
    -------
    P (b,), dP_dmean (b, C), dP_dvar (b, C)
    """
    means = np.ascontiguousarray(means, dtype=np.float64)
    b, C = means.shape
    P, d_mean, d_var = np.empty(b), np.empty((b, C)), np.empty((b, C))
    argmax_quadrature(means, np.ascontiguousarray(varis, dtype=np.float64),
                      np.ascontiguousarray(y, dtype=np.intp), _GH_X, _GH_W, MIN_VARIANCE, P,
                      d_mean, d_var, np.empty((len(_GH_X), C)))
    return P, d_mean, d_var


class SparseMultiClassVIState(VariationalState):
    """A variational fit: each class's kernel, inducing inputs, factor and q(w_k) = N(μ_k, L_kL_kᵀ),
    and ε; what :class:`gpc.sparse.core.trainers.LBFGSTrainer` and ``SVIMinibatch`` train.

    Parameters
    ----------
    kernels : list of gpc kernels, one per kernel group (1: shared by all classes, or C)
    Zs : list of (m, d) arrays, one per inducing group (1 or C)
    n : int, the number of training rows
    n_classes : int, C
    label_noise : float, ε in (0, (C − 1)/C)
    noise_bounds : (low, high) of ε when it is learnt, or None to hold it
    jitter, optimize_inducing : as in gpc.multiclass.sparse.SparseMultiClassState
    whiten : bool, default True
        True: q(w_k) = N(μ_k, L_kL_kᵀ) in whitened coordinates w_k = L_K⁻¹u_k, started at N(0, I).
        False: q(u_k) = N(μ_k, L_kL_kᵀ) in u-space (SVGP without whitening,
        :func:`gpc.sparse.core.variational.svi_finish_u`), started at the prior N(0, K_uu):
        the same bound and start, another gradient in θ and Z (q stays put in u, not in w, when
        K_uu moves).

    The parameters, in order: every group's log θ, every group's Z (with ``optimize_inducing``),
    log ε (when learnt), then per class μ_k and the lower triangle of L_k (row by row).  The state
    keeps nothing per row.
    """

    name = "VI"
    _model = ("kernels", "Zs", "factors", "means", "Lqs", "eps", "log_z")
    #: no per-row state, so no outlier probabilities of the training rows and no tied sites
    tied = False
    y = None
    sites = None

    def __init__(self, kernels, Zs, n, n_classes, label_noise, noise_bounds, jitter,
                 optimize_inducing, whiten=True):
        C = int(n_classes)
        if len(kernels) not in (1, C) or len(Zs) not in (1, C):
            raise ValueError(f"kernels and Zs must hold 1 or {C} entries")
        if not 0.0 < label_noise < (C - 1) / C:
            raise ValueError(f"label_noise must be in (0, (C - 1)/C) = (0, {(C - 1) / C:.4g}), "
                             f"got {label_noise!r}")
        self.model = ArgmaxLikelihood(C, "fixed")
        self.n, self.C, self.jitter = int(n), C, jitter
        self.kernels = list(kernels)
        self.theta_bounds = theta_bounds(self.kernels)
        self.Zs = [np.array(Z, dtype=np.float64) for Z in Zs]
        self.optimize_inducing = bool(optimize_inducing)
        self.factors = self._factors(self.kernels, self.Zs)
        self.eps = float(label_noise)
        self.eps_bounds = None if noise_bounds is None else np.log(np.asarray(noise_bounds, float))
        self.whiten = bool(whiten)
        self.means = [np.zeros(f.m) for f in self.factors]
        self.Lqs = [np.eye(f.m) if self.whiten else f.L.copy() for f in self.factors]
        self._trils = [np.tril_indices(f.m) for f in self.factors]
        self.log_z = np.nan
        self.reverted = 0
        self.tasks = SERIAL           # the trainer's thread pool while it trains
        self._bounds = None

    # the classes' geometry, ε and the hyperparameters' order: the EP state's
    _factors = SparseMultiClassState._factors
    kernel_of = SparseMultiClassState.kernel_of
    Z_of = SparseMultiClassState.Z_of
    rho = SparseMultiClassState.rho
    _hyperparameters = SparseMultiClassState._params
    assemble = SparseMultiClassState.assemble

    def whitened(self):
        """Every class's q(w_k) as (means, Cholesky factors) in the current factors' whitened
        coordinates: the parameters themselves, or with ``whiten=False`` their image
        (L_K⁻¹μ_k, L_K⁻¹L_k) (:func:`gpc.sparse.core.variational.whitened_q`)."""
        if self.whiten:
            return self.means, self.Lqs
        pairs = [whitened_q(f, m, L) for f, m, L in zip(self.factors, self.means, self.Lqs)]
        return [p[0] for p in pairs], [p[1] for p in pairs]

    @property
    def qs(self):
        """q(w_k) of every class (means and covariances, whitened)."""
        return [Posterior(mean=m, cov=L @ L.T) for m, L in zip(*self.whitened())]

    # -- parameters ------------------------------------------------------------------------------
    def params(self):
        parts = [self._hyperparameters()]
        for mean, Lq, tril in zip(self.means, self.Lqs, self._trils):
            parts += [mean, Lq[tril]]
        return np.concatenate(parts)

    def bounds(self):
        """(low, high) of every parameter as one (p, 2) array, ±inf where free: built once (the
        kernels' bounds do not move), since with d = 784 Z alone has C·m·d entries and a minibatch
        step reads the bounds every time."""
        if self._bounds is None:
            theta = [np.asarray(k.bounds, dtype=float).reshape(-1, 2) for k in self.kernels
                     if len(k.theta)]
            out = np.tile([-np.inf, np.inf], (len(self.params()), 1))
            at = sum(len(r) for r in theta)
            if theta:
                out[:at] = np.concatenate(theta)
            if self.eps_bounds is not None:
                at += sum(Z.size for Z in self.Zs) if self.optimize_inducing else 0
                out[at] = self.eps_bounds
            self._bounds = out
        return self._bounds

    def _set(self, p):
        """Move to the packed parameters p (the trainers keep them within ``bounds``); raises
        NotPositiveDefiniteError when a K_uu has no factor."""
        kernels, Zs, eps, at = unpack_params(p, self.kernels, self.Zs, self.optimize_inducing,
                                             self.eps, self.eps_bounds, self.theta_bounds)
        factors = self._factors(kernels, Zs)
        means, Lqs = [], []
        for f, tril in zip(factors, self._trils):
            means.append(p[at:at + f.m].copy())
            at += f.m
            Lq = np.zeros((f.m, f.m))
            Lq[tril] = p[at:at + len(tril[0])]
            at += len(tril[0])
            Lqs.append(Lq)
        self.kernels, self.Zs, self.factors, self.eps = kernels, Zs, factors, eps
        self.means, self.Lqs = means, Lqs

    # -- the bound -------------------------------------------------------------------------------
    def objective(self, likelihood, X, y, p, block_rows, scale=1.0):
        """The bound F and its gradient at the packed parameters p (which become the state's),
        the data terms scaled by ``scale`` (n/|M| for a minibatch); -inf where a K_uu has no
        factor or the bound is not finite (``failure`` then holds the cause).  ``likelihood`` is
        the trainers' argument; the state holds its own (fixed ε)."""
        try:
            self._set(p)
        except NotPositiveDefiniteError as exc:
            self.reverted += 1
            self.failure = exc
            return -np.inf, np.zeros_like(p)
        y = np.ascontiguousarray(y, dtype=np.intp)
        means, Lqs = self.whitened()
        qs = [Posterior(mean=m, cov=L @ L.T) for m, L in zip(means, Lqs)] if self.whiten else None
        parts, e_sum, p_sum = None, 0.0, 0.0
        for start, stop in block_ranges(len(y), block_rows):
            e, psum, block_parts = self._block(as_block(X, start, stop), y[start:stop],
                                               (means, Lqs, qs))
            e_sum += e
            p_sum += psum
            parts = block_parts if parts is None else [add_parts(a, b)
                                                       for a, b in zip(parts, block_parts)]
        value, class_grads, q_grads = scale * e_sum, [], []
        finish = svi_finish if self.whiten else svi_finish_u
        for k, (factor, mean, Lq) in enumerate(zip(self.factors, means, Lqs)):
            neg_kl, gt, gz, g_m, G_L = finish(factor, mean, Lq, (0.0, *parts[k]), scale)
            value += neg_kl
            class_grads.append((gt, gz))
            q_grads += [g_m, G_L[self._trils[k]]]
        # ∂/∂ log ε of Σᵢ [log(ε/(C − 1)) + κ Pᵢ] = Σᵢ (1 − Pᵢ/(1 − ε))   (derivation §11)
        g_eps = scale * (len(y) - p_sum / (1.0 - self.eps))
        grad = np.concatenate([self.assemble(class_grads, g_eps), *q_grads])
        if not (np.isfinite(value) and np.all(np.isfinite(grad))):
            self.reverted += 1
            self.failure = FloatingPointError(f"the variational bound is not finite ({value})")
            return -np.inf, np.zeros_like(p)
        self.log_z = value
        return value, grad

    @staticmethod
    def _marginals(qs, block, tasks):
        """Every class's marginals under q(w_k) (``qs``) at a :class:`RowBlock`, (b, C) means and
        variances a_ikᵀμ_k and s_ik + a_ikᵀS_k a_ik (the binary SVI's ``Posterior.marginals``)."""
        out = tasks.map(lambda k: qs[k].marginals(block.A[k]), range(len(qs)))
        means = np.ascontiguousarray(np.column_stack([o[0] for o in out]))
        varis = np.ascontiguousarray(np.column_stack([o[1] for o in out])) + block.s
        return means, varis

    @staticmethod
    def _factor_marginals(means, Lqs, block, tasks):
        """:meth:`_marginals` from q(w_k)'s Cholesky factors: a_ikᵀμ_k and s_ik + |L_kᵀa_ik|², and
        the rows A_k L_k (one triangular product per class, which the gradient reuses)."""
        def one(k):
            AL = np.array(block.A[k], dtype=np.float64, order="C")
            times_lower_rows(Lqs[k], AL, True)                      # rows L_kᵀ a_ik
            mean, var = np.empty(len(AL)), np.empty(len(AL))
            _lapack.rows_dot(block.A[k], means[k], mean)
            _sparse.row_dots(AL, AL, var)
            return mean, var, AL
        out = tasks.map(one, range(len(means)))
        mean = np.ascontiguousarray(np.column_stack([o[0] for o in out]))
        var = np.ascontiguousarray(np.column_stack([o[1] for o in out])) + block.s
        return mean, var, [o[2] for o in out]

    @staticmethod
    def _probabilities(means, varis, y, tasks):
        """:func:`argmax_probability` over fixed ranges of points (the threads' unit)."""
        out = tasks.map(lambda r: argmax_probability(means[r[0]:r[1]], varis[r[0]:r[1]],
                                                     y[r[0]:r[1]]),
                        block_ranges(len(y), RANGE_ROWS))
        return tuple(np.concatenate([o[i] for o in out]) for i in range(3))

    def _block(self, Xb, y, q=None):
        """A block's Σᵢ E_q[log p(yᵢ | fᵢ)], Σᵢ Pᵢ, and per class the summed data parts
        (g_θ, g_Z, AᵀG_A, ∂/∂μ, ∂/∂L_q) before :func:`gpc.sparse.core.variational.svi_finish`,
        at the whitened q(w_k): ``q`` = (means, Cholesky factors, Posteriors or None) (default:
        the state's, :meth:`whitened`).  The marginal variances are a_ikᵀ(L_kL_kᵀ)a_ik with
        ``whiten`` and |L_kᵀa_ik|² without, where the rows A_k L_k serve the gradient too."""
        q_means, q_Lqs, qs = (*self.whitened(), None) if q is None else q
        tasks = self.tasks
        block = RowBlock(Xb, self.factors, tasks, keep_cross=True)
        if self.whiten:
            qs = qs or [Posterior(mean=m, cov=L @ L.T) for m, L in zip(q_means, q_Lqs)]
            means, varis = self._marginals(qs, block, tasks)
            rows_L = [None] * self.C
        else:
            means, varis, rows_L = self._factor_marginals(q_means, q_Lqs, block, tasks)
        P, d_mean, d_var = self._probabilities(means, varis, y, tasks)
        eps, C = self.eps, self.C
        log_other = math.log(eps / (C - 1))
        kappa = math.log1p(-eps) - log_other
        e_sum = len(y) * log_other + kappa * float(np.sum(P))
        rows = np.arange(len(y), dtype=np.float64)

        def grad(k):
            coefficients = _ClassCoefficients(kappa * d_mean[:, k], kappa * d_var[:, k])
            _, G_A, e_v, AtG, g_m, G_L = svi_block(coefficients, rows, block.A[k],
                                                   block.s[:, k].copy(), q_means[k], q_Lqs[k],
                                                   rows_L[k])
            G_A = np.ascontiguousarray(G_A)
            g_theta, g_Z = self.factors[k].block_gradient(Xb, G_A, np.ascontiguousarray(e_v),
                                                          block.Kbu[k], overwrite=True)
            return g_theta, g_Z, AtG, g_m, G_L

        return e_sum, float(np.sum(P)), tasks.map(grad, range(C))

    # -- per-row quantities ------------------------------------------------------------------------
    def outlier_probability(self):
        raise AttributeError("method='vi' keeps no per-row state: call outlier_probability(X, y) "
                             "for any rows")

    def latent_moments(self, Xb, tasks=SERIAL):
        """q's predictive moments of every f_k at rows Xb: means a_*ᵀμ_k and variances
        a_*ᵀS_k a_* + s_*k, (b, C) each (the SVGP predictive)."""
        block = RowBlock(np.ascontiguousarray(Xb, dtype=np.float64), self.factors, tasks)
        return self._marginals(self.qs, block, tasks)

    def outlier_rows(self, Xb, y, tasks=SERIAL):
        """E_q[p(zᵢ = 1 | yᵢ, fᵢ)] of labelled rows: with ρ = Cε/(C − 1) the outlier indicator's
        posterior is ρ/(C (1 − ε)) where yᵢ is the argmax and 1 elsewhere (RMGPC eq. (21) at
        known f), so its q-average is 1 − Pᵢ (1 − ρ/(C (1 − ε)))."""
        means, varis = self.latent_moments(Xb, tasks)
        P = self._probabilities(means, varis, np.ascontiguousarray(y, dtype=np.intp), tasks)[0]
        return 1.0 - P * (1.0 - self.rho / (self.C * (1.0 - self.eps)))


class _ClassCoefficients:
    """Class k's share of the robust-max expected log likelihood in the form the binary SVI's
    ``svi_block`` asks of a likelihood: ``expected_log_prob(rows, mean, var)`` gives, at the block's
    rows (labelled by their positions), ∂E/∂μ_ik = κ ∂Pᵢ/∂μ_ik and ∂E/∂σ²_ik = κ ∂Pᵢ/∂σ²_ik, taken
    once for all classes at q's marginals (:func:`argmax_probability`); the values themselves are
    counted once by the caller, so they are 0 here."""

    def __init__(self, e_mean, e_var):
        self.e_mean, self.e_var = e_mean, e_var

    def expected_log_prob(self, rows, mean, var):
        i = np.asarray(rows).astype(np.intp)
        return np.zeros(len(i)), self.e_mean[i], self.e_var[i]


class _OnTheRowsThreads:
    """Trainers whose states run their class blocks on the rows' thread pool while they train."""

    def train(self, rows, epochs, tick, record):
        for state in self.states:
            state.tasks = rows.tasks
        try:
            super().train(rows, epochs, tick, record)
        finally:
            for state in self.states:
                state.tasks = SERIAL


class VIBatch(_OnTheRowsThreads, LBFGSTrainer):
    """L-BFGS-B on the bound over all rows (one evaluation per epoch)."""


class VIMinibatch(_OnTheRowsThreads, SVIMinibatch):
    """Adadelta on the bound's minibatch estimates (data terms scaled by n/|M|)."""
