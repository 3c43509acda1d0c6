"""Sparse multi-class EP: RMGPC's model on m inducing points per class (docs/derivations-sparse-multiclass.md).

The model (derivation §1): C latent functions with independent GP priors, u_k = f_k(Z_k) held
whitened, u_k = L_k w_k with K_uu^k = L_k L_kᵀ, and the FITC conditional f_k(xᵢ) | w_k ~
N(a_ikᵀw_k, s_ik) (SEP eq. (1), per class); RMGPC's argmax likelihood with outlier indicators zᵢ
(RMGPC eq. (2)-(4)), whose rate ρ has a Beta posterior (``noise="beta"``), is fixed (``"fixed"``:
the label noise ε of the scalable multi-class EP paper, ρ = Cε/(C − 1)), or is absent
(``"none"``).  Per point i and class k ≠ yᵢ the pair factor Φ((t_y − t_k)/√(s_iy + s_ik)) on the
projections t = aᵀw (derivation §1) has a pair site rank one in w_y along a_iy and in w_k along a_ik
(RMGPC eq. (14) in u-space, derivation §2); q(w_k) ∝ N(0, I) Π sites is held by its natural
parameters, P_k = I + A_kᵀ diag(Λ) A_k, h_k = A_kᵀ v (RMGPC eq. (17)'s row totals), as a
:class:`gpc.sparse.core.natural.NaturalPosterior` per class.

One step on a block of rows (derivation §10):

(a) per class the whitened rows A_k = K_bu L_k⁻ᵀ, the FITC variances and the marginals of a_ikᵀw_k
    under q_k (gpc.sparse.core.inducing, gpc.sparse.core.natural: BLAS-3 products, b m² each);
(b) one compiled pass over the block's points (gpc._sparse_multiclass.refine_block: the cavities,
    the pair factor's tilted moments and the damped sites, through the exact engine's pair loop);
(c) with a Beta-distributed ρ RMGPC's ψ̃ᵢ refinement, sequential (gpc._multiclass);
(d) per class q_k rebuilt from its rows' site totals (batch) or the block's sites swapped in along
    their kept directions (minibatch, SEP §2.3);
(e) the evidence's data terms and per-row gradient coefficients in one compiled pass
    (gpc._sparse_multiclass.evidence_block), then per class the core's row gradient
    (gpc.sparse.core.natural.rows_gradient) and the kernel's contraction, and one Adadelta step
    on every class's log θ and Z and on log ε.

The work runs on the threads of gpc._parallel.block_threads(n_jobs), which the trainers and the
estimator's prediction enter (BLAS on one thread per call meanwhile), through
gpc._parallel.over_blocks: the marginals and the site sums of (a) and (d) as every class's fixed
row blocks at once (class blocks × row blocks, one nogil call each), the whitening, the minibatch
swap and the gradient of (e) as one task per class (:class:`Tasks`), and the compiled passes of
(b) and (e) over fixed ranges of points.  Every sum is taken in a fixed order, so the bits do not
depend on the number of threads.  Row blocks follow one another.

The model is a tenant of the sparse core (gpc.sparse.core), as the binary model is: its state
(:class:`SparseMultiClassState`, a :class:`gpc.sparse.core.steps.SparseState`) and its rows
(:class:`LocalClassRows`, a :class:`gpc.sparse.core.rows.Rows`) run the core's one step loop
(``iteration``, ``tied_iteration``, ``run_ep`` and its failure rule) under the core's trainers; the
epochs and minibatches (random subsets of the rows, drawn afresh each epoch) are theirs.  A
variational baseline with the same likelihood and a Gaussian q(u_k) per class can reuse
:class:`MultiClassRows` (``objective_rows``/``svi_rows`` give the rows and their class labels) and
the trainers.
"""

import math

import numpy as np
from scipy.special import betaln, expit

from .. import _lapack, _pages, _parallel, _sparse
from .._parallel import BLOCK_ROWS
from .._multiclass import refine_outlier_prior
from .._sparse_multiclass import evidence_block, local_ep_block, refine_block
from ..exceptions import NotPositiveDefiniteError
from ..sparse.core.inducing import InducingFactor
from ..sparse.core.natural import (NaturalPosterior, rows_gradient, transform_natural,
                                   whitened_sums_blocks)
from ..sparse.core.passes import as_block, block_ranges, finish_evidence
from ..sparse.core.rows import Rows
from ..sparse.core.steps import SparseState, batch_index, site_directions, take_rows, tied_cavity
from ..sparse.core.trainers import LocalTrainingRows
from .ep import _Sites

NOISES = ("beta", "fixed", "none")
#: points per range of a block's compiled passes (the unit that threads share out)
RANGE_ROWS = 256
#: the tied sites' local EP: stop when no moment moves by more than this (prior sd units)
LOCAL_TOL, LOCAL_SWEEPS = 1e-10, 200


class ArgmaxLikelihood:
    """The likelihood of a sparse multi-class fit: C classes, the argmax and the outlier treatment.

    Parameters
    ----------
    n_classes : int, C ≥ 2
    noise : "beta", "fixed" or "none"
        RMGPC's outlier rate ρ ~ Beta(a0, b0) (RMGPC eq. (3)-(4)), a fixed rate ρ = Cε/(C − 1)
        (the state holds ε), or no outliers (SMGPC's likelihood, RMGPC §4).
    a0, b0 : float, the Beta prior (``noise="beta"``)
    """

    def __init__(self, n_classes, noise="beta", a0=1.0, b0=9.0):
        if noise not in NOISES:
            raise ValueError(f"noise must be one of {NOISES}, got {noise!r}")
        if n_classes < 2:
            raise ValueError(f"n_classes must be at least 2, got {n_classes}")
        self.n_classes, self.noise, self.a0, self.b0 = int(n_classes), noise, float(a0), float(b0)
        self.robust = noise != "none"
        self.beta = noise == "beta"
        self.log_c = -math.log(self.n_classes) / (self.n_classes - 1)    # RMGPC eq. (10)


class Tasks:
    """A fit's independent tasks (class blocks, ranges of points) on the threads of the caller's
    gpc._parallel.block_threads context (one thread outside one), through
    gpc._parallel.over_blocks: each thread takes the next task when done with one.

    ``map`` returns the results in the order of its items, so a sum over them is the same whatever
    the number of threads; the binary engine's blocks inside a task run in that task's thread."""

    def map(self, fn, items):
        items = list(items)
        return _parallel.over_blocks(lambda j: fn(items[j]), len(items))


SERIAL = Tasks()


# -- blocks of rows --------------------------------------------------------------------------------
class RowBlock:
    """Rows X_b seen by every class: the whitened rows A_k (shared by classes with one factor), the
    FITC variances s (b, C) and the prior standard deviations √κ (b, C) of f_k(xᵢ).

    Parameters
    ----------
    Xb : (b, d) float64 rows
    factors : list of C :class:`gpc.sparse.core.inducing.InducingFactor` (one object for shared ones)
    tasks : :class:`Tasks`
    keep_cross : keep K_bu for :meth:`InducingFactor.block_gradient`
    """

    def __init__(self, Xb, factors, tasks=SERIAL, keep_cross=False):
        self.Xb = Xb
        unique = list({id(f): f for f in factors}.values())

        def whiten(factor):
            A, s, Kbu = factor.whiten(Xb, keep_cross=True)
            return A, s, (Kbu if keep_cross else None), factor.diag(Xb)

        done = dict(zip([id(f) for f in unique], tasks.map(whiten, unique)))
        self.A = [done[id(f)][0] for f in factors]
        self.Kbu = [done[id(f)][2] for f in factors]
        self.s = np.column_stack([done[id(f)][1] for f in factors])
        self.prior_sd = np.sqrt(np.column_stack([done[id(f)][3] for f in factors]))

    @property
    def size(self):
        return self.s.shape[0]


def class_marginals(block, qs, tasks=SERIAL, moments=False):
    """The marginals of a_ikᵀw_k under every q_k: means and variances (b, C), and with ``moments``
    the rows A_k Σ_k (one b x m array per class) for the gradient; every class's fixed row blocks
    as one set of tasks (``tasks`` is not needed: the caller's threads run them)."""
    plans = [qs[k].moments_blocks(block.A[k], covariance=moments) for k in range(len(qs))]
    _parallel.over_calls([call for calls, _ in plans for call in calls])
    out = [result for _, result in plans]
    means = np.ascontiguousarray(np.column_stack([o[0] for o in out]))
    varis = np.ascontiguousarray(np.column_stack([o[1] for o in out]))
    return (means, varis, [o[2] for o in out]) if moments else (means, varis)


def block_sites(sites, y, rows):
    """Points ``rows`` (a slice or a sorted index array) of ``sites`` as a
    :class:`gpc.multiclass.ep._Sites` of their own (copies), labelled ``y`` (their class
    indices)."""
    out = _Sites(np.ascontiguousarray(y, dtype=np.intp), sites.l)
    for name in _Sites.ARRAYS:
        setattr(out, name, np.array(getattr(sites, name)[rows]))
    return out


def put_sites(sites, block, rows):
    """Write a block's sites (:func:`block_sites`) back into ``sites`` at points ``rows``."""
    for name in _Sites.ARRAYS:
        getattr(sites, name)[rows] = getattr(block, name)


def _ranges(b):
    return block_ranges(b, RANGE_ROWS)


def refine_points(bs, means, varis, block, model, damping, tasks=SERIAL, moved=None):
    """One damped refinement of the block's pair sites ``bs`` in place (derivation §3-§4; the
    compiled :func:`gpc._sparse_multiclass.refine_block` over fixed ranges of points); returns the
    largest undamped moment mismatch.  ``moved`` = (row_tau, row_eta, mean_old, var_old, cross)
    for sites that q holds along earlier directions (a minibatch)."""
    extra = {} if moved is None else dict(zip(("row_tau", "row_eta", "mean_old", "var_old",
                                               "cross"), moved))

    def run(r):
        return refine_block(bs.y, bs.others, bs.tau_t, bs.eta_t, bs.tau_o, bs.eta_o, bs.lam,
                            bs.lam_i, means, varis, block.s, block.prior_sd, float(damping),
                            model.robust, model.log_c, r[0], r[1], **extra)

    return max(tasks.map(run, _ranges(bs.n)), default=0.0)


def refine_outliers(bs, a, b, damping):
    """RMGPC's ψ̃ᵢ of the block's points refined in turn (eq. (15), gpc._multiclass's sweep),
    starting from Q's Beta(a, b); returns the new (a, b) and the largest undamped change of a
    P(zᵢ = 1)."""
    before = expit(bs.z_log_odds())
    a, b = refine_outlier_prior(bs.lam.sum(axis=1), bs.alpha, bs.beta, bs.lam_i, float(a),
                                float(b), float(damping))
    change = float(np.max(np.abs(expit(bs.z_log_odds()) - before), initial=0.0)) / damping
    return a, b, change


def refines_outliers(state):
    """Whether a site update refines the ψ̃ᵢ: not while q is the prior (no point has sites yet).

    Against the prior every pair factor's tilted mass is about ½ and the C − 1 pairs' product
    about 2^{1 − C}, below the argmax's 1/C for C ≥ 3, so each point looks a little more likely
    an outlier than not; the sequential sweep adds n such votes and takes Q(ρ) to ρ̄ ≈ 1 (Beta(139, 0.97)
    from Beta(1, 9) on 5000 clean points), from where the pair sites learn nothing and the next
    passes swing ρ̄ between 0 and 1.  The first update fits the pair sites alone; the fixed
    points, where every ψ̃ᵢ is refined, are the same."""
    return state.n_sited > 0


def class_sums(block, bs, tasks=SERIAL):
    """Per class the block's share of (P_k − I, h_k) for its sites with the current factor:
    (A_kᵀ diag(Λ) A_k, A_kᵀ v) with the row totals (Λ, v) of RMGPC eq. (17)."""
    tau, eta = bs.class_sites()
    return whitened_class_sums(block, tau, eta)


def whitened_class_sums(block, tau, eta):
    """Per class (A_kᵀ diag(τ_k) A_k, A_kᵀ η_k) (τ, η: (b, C)), every class's fixed row blocks as
    one set of tasks on the caller's threads, each class's partials added in block order."""
    plans = [whitened_sums_blocks(block.A[k], tau[:, k].copy(), eta[:, k].copy(),
                                  scratch=f"class_sums_{k}") for k in range(tau.shape[1])]
    _parallel.over_calls([call for calls, _ in plans for call in calls])
    return [finish() for _, finish in plans]


# -- the evidence's parts ------------------------------------------------------------------------
class EvidenceParts:
    """Sums over some rows of log Z's data terms and of its gradient's parts (derivation §5-§6).

    Attributes
    ----------
    log_terms : float, Σ ℓᵢ
    classes : list of C (g_theta, g_Z, AtG) or None without the gradient: each class's K_bu and
        diag K_bb parts in θ and Z and its w-space K_uu part, for
        :func:`gpc.sparse.core.passes.finish_evidence`
    outlier_excess : float, Σ (pᵢ − ρ), pᵢ = Q(zᵢ = 1) (the fixed rate's gradient)
    n_bad : int, pairs left out (no proper cavity)
    """

    def __init__(self, log_terms, classes, outlier_excess, n_bad):
        self.log_terms, self.classes = log_terms, classes
        self.outlier_excess, self.n_bad = outlier_excess, n_bad

    def __add__(self, other):
        classes = None if self.classes is None else [
            tuple(x + y for x, y in zip(a, b)) for a, b in zip(self.classes, other.classes)]
        return EvidenceParts(self.log_terms + other.log_terms, classes,
                             self.outlier_excess + other.outlier_excess, self.n_bad + other.n_bad)

    def as_tuple(self):
        """The parts as nested tuples (what a distributed engine adds leaf by leaf)."""
        return (self.log_terms, self.classes, self.outlier_excess, self.n_bad)


def block_evidence(block, bs, factors, qs, model, ab, rho, gradient, held, tasks=SERIAL):
    """One block's :class:`EvidenceParts` at q (sites along the current rows).

    ``held`` is the gradient's form (gpc.sparse.ep.block_evidence): "sites" (each site follows
    its row, a batch pass) or "cavity" (each site's cavity held in u-space, SEP eq. (4): the
    minibatches).  ``ab`` is Q's Beta (a, b) (``noise="beta"``), ``rho`` the fixed rate."""
    C = len(qs)
    if gradient:
        means, varis, sigma_rows = class_marginals(block, qs, tasks, moments=True)
    else:
        means, varis = class_marginals(block, qs, tasks)
    b = bs.n
    log_terms, d1, e, g_s = np.empty(b), np.empty((b, C)), np.empty((b, C)), np.empty((b, C))
    a_beta, b_beta = ab if model.beta else (1.0, 1.0)

    def run(r):
        return evidence_block(bs.y, bs.others, bs.tau_t, bs.eta_t, bs.tau_o, bs.eta_o, bs.lam,
                              bs.lam_i, bs.alpha, bs.beta, means, varis, block.s, model.robust,
                              model.beta, float(a_beta), float(b_beta), model.log_c, log_terms,
                              d1, e, g_s, r[0], r[1])

    n_bad = int(sum(tasks.map(run, _ranges(b))))
    excess = float(np.sum(expit(bs.z_log_odds()) - rho)) if model.noise == "fixed" else 0.0
    if not gradient:
        return EvidenceParts(float(np.sum(log_terms)), None, excess, n_bad)
    tau, eta = bs.class_sites()
    d1, e, g_s = d1.T.copy(), e.T.copy(), g_s.T.copy()      # one contiguous row per class

    def grad(k):
        G = sigma_rows[k]
        AtG = rows_gradient(block.A[k], qs[k], G, means[:, k].copy(), tau[:, k].copy(),
                            eta[:, k].copy(), g_s[k], d1[k], e[k], held)
        g_theta, g_Z = factors[k].block_gradient(block.Xb, G, g_s[k], block.Kbu[k],
                                                 overwrite=True)
        return g_theta, g_Z, AtG

    return EvidenceParts(float(np.sum(log_terms)), tasks.map(grad, range(C)), excess, n_bad)


# -- passes over rows (in process or on a shard) --------------------------------------------------
def site_pass(X, y, sites, factors, qs, model, ab, damping, block_rows, tasks=SERIAL, keep=None,
              outliers=True):
    """One parallel pass of every pair site from the same q (and the ψ̃ᵢ in turn): the new sites
    (a copy), per class (P_k − I, h_k) of the new sites with the current factors (q is rebuilt
    from them, as the binary batch pass does), Q's new Beta (a, b), and the largest undamped
    moment mismatch.  ``keep``: a dict that receives the :class:`RowBlock` of a one-block pass.
    ``outliers`` False leaves the ψ̃ᵢ as they are (a pass from the prior q,
    :func:`refines_outliers`)."""
    n = len(y)
    new = sites.copy()
    sums = [(np.zeros((f.m, f.m)), np.zeros(f.m)) for f in factors]
    mismatch = 0.0
    for start, stop in block_ranges(n, block_rows):
        block = RowBlock(as_block(X, start, stop), factors, tasks, keep_cross=keep is not None)
        means, varis = class_marginals(block, qs, tasks)
        bs = block_sites(new, y[start:stop], slice(start, stop))
        mismatch = max(mismatch, refine_points(bs, means, varis, block, model, damping, tasks))
        if model.beta and outliers:
            a, b, change = refine_outliers(bs, ab[0], ab[1], damping)
            ab, mismatch = (a, b), max(mismatch, change)
        put_sites(new, bs, slice(start, stop))
        for k, (dP, dh) in enumerate(class_sums(block, bs, tasks)):
            sums[k][0][...] += dP
            sums[k][1][...] += dh
        if keep is not None and start == 0 and stop == n:
            keep["block"] = block
    return new, sums, ab, mismatch


def evidence_pass(X, y, sites, factors, qs, model, ab, rho, block_rows, gradient, held,
                  tasks=SERIAL, block=None):
    """:class:`EvidenceParts` over all rows of X, block by block, added in row order (``block``:
    the whitened rows of a one-block X, if kept)."""
    total = None
    for start, stop in block_ranges(len(y), block_rows):
        rb = block if block is not None else RowBlock(as_block(X, start, stop), factors, tasks,
                                                      keep_cross=True)
        part = block_evidence(rb, block_sites(sites, y[start:stop], slice(start, stop)), factors, qs,
                              model, ab, rho, gradient, held, tasks)
        total = part if total is None else total + part
    return total


# -- the state -------------------------------------------------------------------------------------
def theta_bounds(kernels):
    """Each kernel's log-bounds as an (n_θ, 2) array, n_θ the length of its θ.  Moving θ keeps
    them, so a fit reads them once: the kernels compute θ and its bounds afresh on every read,
    which at m = 100 and 250 iterations was a sizeable part of a small set's fit."""
    return [np.asarray(k.bounds, dtype=np.float64).reshape(-1, 2) for k in kernels]


def unpack_params(p, kernels, Zs, optimize_inducing, eps, eps_bounds, kernel_bounds):
    """The packed parameters p (every kernel's log θ, then every moved Z, then log ε when it is
    learnt) as (kernels, Zs, ε, the entries read), each θ clipped to its ``kernel_bounds``
    (:func:`theta_bounds`) and log ε to ``eps_bounds``; the order of
    :meth:`SparseMultiClassState._params`."""
    at, new_kernels = 0, []
    for kern, b in zip(kernels, kernel_bounds):
        size = len(b)
        if size:
            kern = kern._with_theta(np.clip(p[at:at + size], b[:, 0], b[:, 1]))
        new_kernels.append(kern)
        at += size
    if optimize_inducing:
        moved = []
        for Z in Zs:
            moved.append(p[at:at + Z.size].reshape(Z.shape).copy())
            at += Z.size
        Zs = moved
    if eps_bounds is not None:
        eps = float(np.exp(np.clip(p[at], *eps_bounds)))
        at += 1
    return new_kernels, Zs, eps, at


class SparseMultiClassState(SparseState):
    """Everything a sparse multi-class fit carries between steps: each class's kernel, inducing
    inputs, factor and q(w_k), the sites, the outlier rate, the optimiser (the counters, the
    optimiser and the failure rule are the core's, :class:`gpc.sparse.core.steps.SparseState`).

    Parameters
    ----------
    kernels : list of gpc kernels, one per kernel group (1: shared by all classes, or C)
    Zs : list of (m, d) arrays, one per inducing group (1: shared, or C)
    y : (n,) class indices of the training rows (None with ``tied``: no per-row state)
    n : int, the number of training rows
    model : ArgmaxLikelihood
    jitter, optimize_inducing, lr : as in gpc.sparse._train.SEPState
    tied : bool, one shared average site per class (stochastic EP, derivation §7)
    label_noise : float ε for ``model.noise == "fixed"``
    noise_bounds : (low, high) of ε when it is learnt, or None to hold it
    step_rule : the parameters' optimiser, a key of gpc.sparse.core.steps.STEP_RULES or a
        callable (n_params, lr=lr) that makes one

    The parameters the optimiser moves are, in order, every group's log θ, every group's Z (with
    ``optimize_inducing``) and log ε (when learnt).  Per point the sites are the exact engine's
    (:class:`gpc.multiclass.ep._Sites`, 5 C + 3 numbers); minibatch training also keeps each
    (point, class) row's u-space direction, ``V[k]`` (n x m_k float32), along which q holds that
    row's sites (SEP §2.3; derivation §10).
    """

    def __init__(self, kernels, Zs, y, n, model, jitter, optimize_inducing, lr, tied=False,
                 label_noise=None, noise_bounds=None, step_rule="adadelta"):
        C = model.n_classes
        if len(kernels) not in (1, C) or len(Zs) not in (1, C):
            raise ValueError(f"kernels and Zs must hold 1 or {C} entries")
        self.model, self.n, self.C, self.tied, self.jitter = model, int(n), C, bool(tied), jitter
        self.kernels = list(kernels)
        self.Zs = [np.array(Z, dtype=np.float64) for Z in Zs]
        self.optimize_inducing = bool(optimize_inducing)
        self.theta_bounds = theta_bounds(self.kernels)
        self.factors = self._factors(self.kernels, self.Zs)
        self.qs = [NaturalPosterior(np.eye(f.m), np.zeros(f.m)) for f in self.factors]
        self.y = None if tied else np.ascontiguousarray(y, dtype=np.intp)
        self.eps = None if label_noise is None else float(label_noise)
        if model.noise == "fixed" and self.eps is None:
            raise ValueError("noise='fixed' needs label_noise=ε")
        self.eps_bounds = None if noise_bounds is None else np.log(np.asarray(noise_bounds, float))
        self.sites = None
        if not tied:
            self.sites = _Sites(self.y, C)
            if model.noise == "fixed":
                self.sites.lam_i[:] = self.prior_log_odds
            elif model.beta:      # ψ̃ᵢ from the prior alone, as the exact engine starts
                refine_outlier_prior(self.sites.lam.sum(axis=1), self.sites.alpha,
                                     self.sites.beta, self.sites.lam_i, model.a0, model.b0, 1.0)
        self.remote_beta = None     # Q's Beta while the sites are on an engine's shards
        super().__init__(self.n, (sum(len(k.theta) for k in self.kernels)
                                  + (sum(Z.size for Z in self.Zs) if self.optimize_inducing else 0)
                                  + (1 if self.eps_bounds is not None else 0)), lr, step_rule)

    # -- the classes' geometry ------------------------------------------------------------------
    def kernel_of(self, k):
        return self.kernels[0 if len(self.kernels) == 1 else k]

    def Z_of(self, k):
        return self.Zs[0 if len(self.Zs) == 1 else k]

    def _factors(self, kernels, Zs):
        """One InducingFactor per class; classes with the same kernel and Z share one object."""
        made, out = {}, []
        for k in range(self.C):
            key = (0 if len(kernels) == 1 else k, 0 if len(Zs) == 1 else k)
            if key not in made:
                made[key] = InducingFactor(kernels[key[0]], Zs[key[1]], self.jitter)
            out.append(made[key])
        return out

    # -- the outlier rate ------------------------------------------------------------------------
    @property
    def rho(self):
        """The outlier rate: ρ = Cε/(C − 1) for fixed label noise, Q's mean a/(a + b) under the
        Beta treatment (derivation §8's ρ̄), 0 without outliers."""
        if self.model.noise == "fixed":
            return self.C * self.eps / (self.C - 1)
        if self.model.beta:
            a, b = self.beta_posterior()
            return a / (a + b)
        return 0.0

    @property
    def prior_log_odds(self):
        """logit ρ: for a fixed rate zᵢ's exact prior factor (λᵢ, derivation §2); under the Beta
        treatment that of Q's mean rate."""
        rho = self.rho
        return math.log(rho) - math.log1p(-rho)

    def beta_posterior(self, sites=None):
        """Q's Beta(a, b) of ρ: the prior times the ψ̃ᵢ's exponents (RMGPC eq. (15))."""
        if sites is None and self.remote_beta is not None:
            return self.remote_beta
        sites = self.sites if sites is None else sites
        m = self.model
        return m.a0 + float(np.sum(sites.alpha)), m.b0 + float(np.sum(sites.beta))

    def outlier_probability(self):
        """Q(zᵢ = 1) of every training row (RMGPC eq. (21)); zeros without outliers."""
        if not self.model.robust or self.sites is None:
            return np.zeros(self.n)
        return expit(self.sites.z_log_odds())

    # -- parameters ------------------------------------------------------------------------------
    def _params(self):
        parts = [k.theta for k in self.kernels]
        if self.optimize_inducing:
            parts += [Z.ravel() for Z in self.Zs]
        if self.eps_bounds is not None:
            parts.append([math.log(self.eps)])
        return np.concatenate(parts) if parts else np.empty(0)

    def _set_params(self, p):
        """Move to parameters p: new kernels, Z and factors, each q_k carried over in u-space
        (transform_natural, SEP §2.3); raises when a factor or a q has none."""
        kernels, Zs, eps, _ = unpack_params(p, self.kernels, self.Zs, self.optimize_inducing,
                                            self.eps, self.eps_bounds, self.theta_bounds)
        factors = self._factors(kernels, Zs)
        qs = [NaturalPosterior(*transform_natural(q.P, q.h, old.Li, new.L))
              for q, old, new in zip(self.qs, self.factors, factors)]
        self.kernels, self.Zs, self.factors, self.qs, self.eps = kernels, Zs, factors, qs, eps
        if self.sites is not None and self.model.noise == "fixed":
            self.sites.lam_i[:] = self.prior_log_odds

    def assemble(self, class_grads, g_eps):
        """The gradient in :meth:`_params`' order from each class's (g_theta, g_Z) and the
        derivative in log ε: classes that share a kernel or Z add their parts."""
        g_theta = [np.zeros(len(b)) for b in self.theta_bounds]
        g_Z = [np.zeros_like(Z) for Z in self.Zs]
        for k, (gt, gz) in enumerate(class_grads):
            g_theta[0 if len(self.kernels) == 1 else k] += gt
            g_Z[0 if len(self.Zs) == 1 else k] += gz
        parts = list(g_theta)
        if self.optimize_inducing:
            parts += [g.ravel() for g in g_Z]
        if self.eps_bounds is not None:
            parts.append([g_eps])
        return np.concatenate(parts) if parts else np.empty(0)

    # -- q (what the core's step loop asks of a state) -----------------------------------------
    def set_qs(self, naturals):
        """q_k from natural parameters [(P_k, h_k)]; False and q unchanged if one has no factor."""
        try:
            qs = [NaturalPosterior(0.5 * (P + P.T), h) for P, h in naturals]
        except NotPositiveDefiniteError:
            return False
        self.qs = qs
        return True

    def swap(self, naturals, u_space):
        """q_k from a minibatch's swapped [(P_k, h_k)] (:meth:`LocalClassRows.swap_sites`)."""
        return self.set_qs(naturals)

    def tied_cavity(self):
        """Each class's cavity of a point under tied sites (:func:`tied_cavities`)."""
        return tied_cavities(self)

    def add_tied(self, sums, damping, shrink):
        """Every class's average site moved to (1 − δ|M|/n) T_k + δ Σ_M contributions (``shrink``
        = 1 − δ|M|/n), from the rows' summed sites ``sums``."""
        naturals = []
        for q, (dP, dh) in zip(self.qs, sums):
            P = shrink * q.P + damping * dP
            P.flat[:: P.shape[0] + 1] += 1.0 - shrink
            naturals.append((P, shrink * q.h + damping * dh))
        return self.set_qs(naturals)

    def snapshot(self):
        return self.sites, self.qs, self.V, self.n_sited

    def restore(self, before):
        self.sites, self.qs, self.V, self.n_sited = before

    def site_vector(self):
        """Every site parameter as one vector (:meth:`gpc.multiclass.ep._Sites.vector`; the core's
        batch acceleration)."""
        return self.sites.vector()

    def set_site_vector(self, x):
        """The sites from :meth:`site_vector`'s form, taken if Q's Beta stays proper."""
        sites = self.sites.with_vector(x)
        if self.model.beta and not min(self.beta_posterior(sites)) > 0:
            return False
        self.sites = sites
        return True

    def data_terms(self, parts):
        return parts.log_terms, parts.n_bad

    def gradient(self, parts, scale, held, u_space):
        return evidence_and_gradient(self, parts, scale, held)

    def rebuild(self, sums):
        """q_k = I + Σ, h_k from a batch pass's sums (:func:`site_pass`)."""
        naturals = []
        for dP, dh in sums:
            P = dP.copy()
            P.flat[:: P.shape[0] + 1] += 1.0
            naturals.append((P, dh))
        if self.set_qs(naturals):
            self.V = None           # sites rebuilt with the current factors: no kept directions
            return True
        return False

    def start_minibatches(self, X, block_rows):
        """Get ready for minibatch steps on the rows of X (as the binary state does): each
        class's row directions V[k], and q rebuilt from the sites with the current factors when
        they are not zero."""
        if self.tied or self.V is not None:
            return
        tau, eta = self.sites.class_sites()
        sited = np.any((tau != 0.0) | (eta != 0.0), axis=1)
        self.n_sited = int(np.count_nonzero(sited))
        if not self.n_sited:
            self.V = [_pages.zeros((self.n, f.m), dtype=np.float32) for f in self.factors]
            return
        V, naturals = [], []
        for k, f in enumerate(self.factors):
            P, h = np.eye(f.m), np.zeros(f.m)
            V.append(site_directions(X, f, tau[:, k].copy(), eta[:, k].copy(), block_rows, P, h))
            naturals.append((P, h))
        if not self.set_qs(naturals):     # q keeps its last factorable form
            self.drop_update()
        self.V = V

    def log_normaliser(self):
        """Σ_k [½ h_kᵀP_k⁻¹h_k − ½ log|P_k|] (+ log B(a, b) − log B(a₀, b₀) under the Beta
        treatment): the terms of log Z that come from q (derivation §5)."""
        out = sum(q.log_normaliser_ratio() for q in self.qs)
        if self.model.beta:
            a, b = self.beta_posterior()
            out += betaln(a, b) - betaln(self.model.a0, self.model.b0)
        return out


# -- rows in this process --------------------------------------------------------------------------
class LocalClassRows(Rows):
    """Training rows of a multi-class fit in this process: all of them (``rows`` None, a batch
    step) or one minibatch (``rows`` a slice or a sorted index array, ``y`` their labels: the
    points' sites and directions are gathered and scattered by row).  The core's rows
    (:class:`gpc.sparse.core.rows.Rows`) for its step loop: ``update_sites`` (all rows),
    ``swap_sites`` (a minibatch), ``match_sites`` (tied sites, after which ``evidence_parts`` is
    the tied evidence, :meth:`tied_parts`), ``commit``, ``revert``, ``evidence_parts``."""

    #: a committed batch update can be undone by bringing back the state's old sites and q (the
    #: rows keep nothing of them): the core's loop drops a pass whose log Z is not ≤ 0
    undoable = True
    #: the sites of every row are the state's (:meth:`SparseMultiClassState.site_vector`)
    accelerable = True

    def __init__(self, state, model, X, y, rows=None, tasks=SERIAL, block_rows=BLOCK_ROWS):
        self.state, self.model, self.X, self.tasks, self.block_rows = (
            state, model, X, tasks, block_rows)
        self.y = np.ascontiguousarray(y, dtype=np.intp)
        self.size = len(self.y)
        self.rows = rows
        self._pending = None
        self._block = None
        self._tied = False

    def _whitened(self):
        if self._block is None:
            Xb = (as_block(self.X, 0, self.size) if self.rows is None
                  else take_rows(self.X, self.rows))
            self._block = RowBlock(Xb, self.state.factors, self.tasks, keep_cross=True)
        return self._block

    def update_sites(self, damping):
        """Every site refined from the same q (all rows): per class (P_k − I, h_k) of the new
        sites, pending until commit."""
        st = self.state
        keep = {} if self.size <= self.block_rows else None
        X = self.X if self.rows is None else take_rows(self.X, self.rows)
        new, sums, ab, mismatch = site_pass(X, self.y, st.sites, st.factors, st.qs,
                                            self.model, st.beta_posterior(), damping,
                                            self.block_rows, self.tasks, keep,
                                            refines_outliers(st))
        self._block = None if keep is None else keep.get("block")
        self._pending = ("all", new)
        st.mismatch = mismatch
        return sums

    def swap_sites(self, damping):
        """A minibatch's sites refined against their cavities (q less each row's sites along its
        kept direction, SEP eq. (6)) and swapped in q: per class q's new (P_k, h_k), and the points
        that had no site; the sites and directions pending until commit."""
        st, model, tasks, rows = self.state, self.model, self.tasks, self.rows
        block = self._whitened()
        bs = block_sites(st.sites, self.y, rows)
        old_tau, old_eta = bs.class_sites()
        fresh = ~np.any((old_tau != 0.0) | (old_eta != 0.0), axis=1)
        held = not fresh.all()      # some row's sites are in q along an old direction

        def moved(k):       # marginals of a and of the old direction a' = Lᵀv, and a Σ a'
            q, f = st.qs[k], st.factors[k]
            B = q.solve_rows(block.A[k])
            mean, var, mean_old, var_old, cross = (np.empty(self.size) for _ in range(5))
            _lapack.rows_dot(block.A[k], q.mean, mean)
            _sparse.row_dots(B, B, var)
            if not held:    # no row has a site yet: a' enters with weight 0, V is not read
                zero = np.zeros(self.size)
                return np.zeros_like(block.A[k]), (mean, var, zero, zero, zero)
            A_old = np.array(st.V[k][rows], dtype=np.float64)
            _lapack.multiply_triangular_rows(f.L, A_old, True)
            B_old = q.solve_rows(A_old)
            _lapack.rows_dot(A_old, q.mean, mean_old)
            _sparse.row_dots(B_old, B_old, var_old)
            _sparse.row_dots(B, B_old, cross)
            return A_old, (mean, var, mean_old, var_old, cross)

        out = tasks.map(moved, range(st.C))
        cols = [np.ascontiguousarray(np.column_stack([o[1][j] for o in out])) for j in range(5)]
        means, varis = cols[0], cols[1]
        mismatch = refine_points(bs, means, varis, block, model, damping, tasks,
                                 moved=(old_tau, old_eta, cols[2], cols[3], cols[4]))
        ab = st.beta_posterior()
        if model.beta and refines_outliers(st):
            a, b, change = refine_outliers(bs, ab[0], ab[1], damping)
            ab, mismatch = (a, b), max(mismatch, change)
        tau, eta = bs.class_sites()

        def swap(k):        # q + Σ Λ_new a aᵀ − Σ Λ_old a'a'ᵀ, and the new directions
            f, q = st.factors[k], st.qs[k]
            W = np.concatenate([block.A[k], out[k][0]])
            P, h = q.P.copy(), q.h.copy()
            _lapack.add_weighted_gram(P, W, np.concatenate([tau[:, k], -old_tau[:, k]]),
                                      np.empty_like(W))
            _lapack.mirror_lower(P)
            _lapack.add_transpose_dot(W, np.concatenate([eta[:, k], -old_eta[:, k]]), h)
            V_new = np.array(block.A[k])
            _lapack.multiply_triangular_rows(f.Li, V_new, True)     # v = L⁻ᵀ a
            return (P, h), V_new.astype(np.float32)

        swapped = tasks.map(swap, range(st.C))
        self._pending = ("swap", bs, [s[1] for s in swapped])
        st.mismatch = mismatch
        return [s[0] for s in swapped], int(np.count_nonzero(fresh))

    def commit(self):
        st = self.state
        if self._pending[0] == "all":
            st.sites = self._pending[1]
        else:
            _, bs, V_new = self._pending
            put_sites(st.sites, bs, self.rows)
            for k, V in enumerate(V_new):
                st.V[k][self.rows] = V
        self._pending = None

    def revert(self):
        self._pending = None
        self._block = None

    def evidence_parts(self, gradient, held):
        """:class:`EvidenceParts` over these rows at the state's q (after :meth:`match_sites`,
        the tied evidence at the state's tied cavities)."""
        st = self.state
        if self._tied:
            return self.tied_parts(st.tied_cavity(), gradient)
        if self.rows is None:
            return evidence_pass(self.X, self.y, st.sites, st.factors, st.qs, self.model,
                                 st.beta_posterior(), st.rho, self.block_rows, gradient, held,
                                 self.tasks, self._block)
        return block_evidence(self._whitened(), block_sites(st.sites, self.y, self.rows),
                              st.factors, st.qs, self.model, st.beta_posterior(), st.rho,
                              gradient, held, self.tasks)

    # -- tied sites --------------------------------------------------------------------------------
    def match_sites(self, cavities):
        """Each point's sites fitted by its local EP against the tied ``cavities``: per class the
        sums (Σ τ a aᵀ, Σ η a) of the points' row sites."""
        self._tied = True
        return tied_sums(self._whitened(), self.y, cavities, self.model, self.state, self.tasks)

    def tied_parts(self, cavities, gradient):
        """:class:`EvidenceParts` of the tied evidence over these rows (derivation §7) at the
        state's q and its ``cavities``, and Σ of the points' cavity normalisers' excess."""
        return tied_evidence(self._whitened(), self.y, cavities, self.state.qs, self.model,
                             self.state, gradient, self.tasks)


def evidence_and_gradient(state, parts, scale, held):
    """log Z (its estimate over all n rows from ``parts`` of b rows, SEP eq. (3)/(6)) and its
    gradient in :meth:`SparseMultiClassState._params`' order, the data terms scaled by
    ``scale``: each class's parts finished by gpc.sparse.core.passes.finish_evidence, and
    ∂ log Z/∂ log ε = Σᵢ (pᵢ − ρ)/(1 − ρ) (derivation §6: ρ ∝ ε)."""
    grads = None
    if parts.classes is not None:
        class_grads = []
        for k, (g_theta, g_Z, AtG) in enumerate(parts.classes):
            _, gt, gz, _ = finish_evidence(state.factors[k], state.qs[k],
                                           (0.0, g_theta, g_Z, AtG, 0), scale=scale, held=held)
            class_grads.append((gt, gz))
        g_eps = scale * parts.outlier_excess / (1.0 - state.rho) if state.eps is not None else 0.0
        grads = state.assemble(class_grads, g_eps)
    return grads


# -- tied sites (stochastic EP, derivation §7) ----------------------------------------------------
def tied_cavities(state):
    """Each class's cavity of a point under tied sites: q less one of the n shares of its average
    site (gpc.sparse.core.steps.tied_cavity)."""
    return [tied_cavity(q, state.n) for q in state.qs]


def local_ep(block, y, cavities, model, prior_log_odds, tasks=SERIAL, moments=False):
    """Every point's local EP against ``cavities`` (gpc._sparse_multiclass.local_ep_block):
    a dict of the (b, C) row sites, local marginals and derivatives, the per-point local log Z
    and P(zᵢ = 1), and the cavity marginals (with ``moments`` also the rows A_k Σ_c)."""
    y = np.ascontiguousarray(y, dtype=np.intp)
    b, C = len(y), len(cavities)
    marg = class_marginals(block, cavities, tasks, moments=moments)
    m_c, v_c = marg[0], marg[1]
    lam_i = np.full(b, prior_log_odds if model.robust else 0.0)
    others = _Sites(y, C).others
    names = ("tau_t", "eta_t", "tau_o", "eta_o", "lam", "means", "varis", "site_tau",
             "site_eta", "d_m", "d_v", "d_s")
    out = {name: np.zeros((b, C)) for name in names}
    out["log_z"] = np.zeros(b)

    def run(r):
        return local_ep_block(y, others, m_c, v_c, block.s, block.prior_sd, lam_i, model.robust,
                              model.log_c, LOCAL_TOL, LOCAL_SWEEPS,
                              *(out[name] for name in names[:7]), out["site_tau"],
                              out["site_eta"], out["log_z"], out["d_m"], out["d_v"], out["d_s"],
                              r[0], r[1])

    counts = tasks.map(run, _ranges(b))
    out["n_bad"] = sum(c[0] for c in counts)
    out["unconverged"] = sum(c[1] for c in counts)
    out["p_outlier"] = (expit(lam_i + out["lam"].sum(axis=1)) if model.robust else np.zeros(b))
    out["m_c"], out["v_c"] = m_c, v_c
    if moments:
        out["sigma_rows"] = marg[2]
    return out


def _tied_local_ep(block, y, cavities, model, state, tasks, moments=False):
    """The block's points' local EPs against the tied ``cavities`` (:func:`local_ep`)."""
    return local_ep(block, y, cavities, model, state.prior_log_odds if model.robust else 0.0,
                    tasks, moments=moments)


def tied_sums(block, y, cavities, model, state, tasks=SERIAL):
    """A block's points under tied sites: their local EPs against ``cavities``, and per class the
    sums (Σ τ a aᵀ, Σ η a) of their row sites."""
    loc = _tied_local_ep(block, y, cavities, model, state, tasks)
    return whitened_class_sums(block, loc["site_tau"], loc["site_eta"])


def tied_evidence(block, y, cavities, qs, model, state, gradient, tasks=SERIAL):
    """A block's :class:`EvidenceParts` of the tied evidence (derivation §7) at the current q,
    ``qs``, from its points' local EPs against ``cavities``:

        ℓᵢ = log Z_loc,i + Σ_k (G_k(cavity) − G_k(q)),   G(P, h) = ½ hᵀP⁻¹h − ½ log|P|,

    and with ``gradient`` each class's parts: the rows' cavity-held terms (γ = d_m μ_c +
    2 d_v Σ_c a, the binary "cavity" form on the cavity's moments) and the average term
    ½ Σᵢ (E_i[wwᵀ] − E_q[wwᵀ]) of the points' local posteriors q_i = cavity × the point's sites,
    which is not zero for n > 1 (q is their natural-parameter average, not their moment average).
    By Sherman–Morrison along u = Σ_c a,
    E_i[wwᵀ] = Σ_c + μ_cμ_cᵀ + δ(μ_c uᵀ + u μ_cᵀ) + (δ² − κ) u uᵀ with κ = τ/(1 + τ v_c), δ = (η − τ m_c)/(1 + τ v_c)."""
    loc = _tied_local_ep(block, y, cavities, model, state, tasks, moments=gradient)
    C = len(cavities)
    b = len(y)
    excess_g = sum(c.log_normaliser_ratio() - q.log_normaliser_ratio()
                   for c, q in zip(cavities, qs))
    log_terms = float(np.sum(loc["log_z"])) + b * excess_g
    rho = state.rho if model.noise == "fixed" else 0.0
    excess = float(np.sum(loc["p_outlier"] - rho)) if model.noise == "fixed" else 0.0
    if not gradient:
        return EvidenceParts(log_terms, None, excess, loc["n_bad"])

    def grad(k):
        cav, q, f, A = cavities[k], qs[k], state.factors[k], block.A[k]
        U = loc["sigma_rows"][k]                         # rows Σ_c a
        tau, eta = loc["site_tau"][:, k].copy(), loc["site_eta"][:, k].copy()
        m_c, v_c = loc["m_c"][:, k], loc["v_c"][:, k]
        kappa = tau / (1.0 + tau * v_c)
        delta = (eta - tau * m_c) / (1.0 + tau * v_c)
        # the average term, w-space: ½ Σᵢ (E_i[wwᵀ] − E_q[wwᵀ])
        avg = np.zeros((f.m, f.m))
        _lapack.add_weighted_gram(avg, U, delta * delta - kappa, np.empty_like(U))
        _lapack.mirror_lower(avg)
        w = np.zeros(f.m)
        _lapack.add_transpose_dot(U, delta, w)
        # b (E_c[wwᵀ] − E_q[wwᵀ]) + μ_c wᵀ + w μ_cᵀ (q's Σ_w is the prior term's too, kept and
        # read-only: the second moments are new arrays, the rest in place)
        outer = np.empty((f.m, f.m))
        second_c = cav.cov
        second_c += np.multiply(cav.mean[:, None], cav.mean[None, :], out=outer)
        second_q = q.kept_cov + np.multiply(q.mean[:, None], q.mean[None, :], out=outer)
        second_c -= second_q
        second_c *= b
        cross = np.multiply(cav.mean[:, None], w[None, :], out=second_q)
        cross += np.multiply(w[:, None], cav.mean[None, :], out=outer)
        cross += second_c
        avg += cross
        avg *= 0.5
        # the rows' cavity-held terms (binary "cavity" form with d1 = d_m, e = 2 d_v, g_s = d_s)
        G = np.array(U)
        d_s = loc["d_s"][:, k].copy()
        AtG = rows_gradient(A, cav, G, None, None, None, d_s, loc["d_m"][:, k].copy(),
                            2.0 * loc["d_v"][:, k], "cavity")
        AtG += avg               # finish_evidence symmetrises: ½(AtG + AtGᵀ) + avg
        g_theta, g_Z = f.block_gradient(block.Xb, G, d_s, block.Kbu[k], overwrite=True)
        return g_theta, g_Z, AtG

    return EvidenceParts(log_terms, tasks.map(grad, range(C)), excess, loc["n_bad"])


# -- the rows the trainers train on ----------------------------------------------------------------
class MultiClassRows(LocalTrainingRows):
    """The training rows of a multi-class fit in this process (one problem, k = 0, with class
    labels 0..C−1), for the trainers of gpc.sparse.core.trainers; ``tasks`` runs the class
    blocks."""

    def __init__(self, X, y, tasks=SERIAL):
        super().__init__(X, [np.ascontiguousarray(y, dtype=np.intp)])
        self.y, self.tasks = self.targets[0], tasks

    def all_rows(self, k, state, likelihood):
        return LocalClassRows(state, likelihood, self.X, self.y, None, self.tasks)

    def batch_rows(self, k, state, likelihood, batch, sites=True):
        rows = batch_index(batch)
        return LocalClassRows(state, likelihood, self.X, self.y[rows], rows, self.tasks)


def latent_moments(state, Xb, tasks=SERIAL):
    """The latent predictive moments of f_k at rows Xb (derivation §8): means a_*ᵀμ_k and
    variances a_*ᵀΣ_k a_* + s_*k, (b, C) each."""
    block = RowBlock(np.ascontiguousarray(Xb, dtype=np.float64), state.factors, tasks)
    means, varis = class_marginals(block, state.qs, tasks)
    return means, varis + block.s


def row_outlier_probability(state, X, y, tasks=SERIAL):
    """Q(zᵢ = 1) of any labelled rows by their local EP (derivation §7): each row's pair factors
    fitted against the cavity a training row has under tied sites (q less one share), or against
    q itself (the rows taken as new observations); the outlier prior is the fixed rate, or Q's
    mean rate ρ̄ under the Beta treatment."""
    if not state.model.robust:
        return np.zeros(len(y))
    cavities = tied_cavities(state) if state.tied else state.qs
    lo = state.prior_log_odds
    y = np.asarray(y, dtype=np.intp)
    out = []
    for start, stop in block_ranges(len(y), BLOCK_ROWS):
        block = RowBlock(as_block(X, start, stop), state.factors, tasks)
        out.append(local_ep(block, y[start:stop], cavities, state.model, lo, tasks)["p_outlier"])
    return np.concatenate(out)
