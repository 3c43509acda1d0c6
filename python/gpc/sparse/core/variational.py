"""Variational states on the sparse core: what SVI's bound (SEP eq. (8), Hensman, Matthews &
Ghahramani 2015) asks of a model, whatever its likelihood, and the states that L-BFGS-B fits.

q(w) = N(μ, L_q L_qᵀ) per latent function (u = L w); the bound's data terms are 1-D expectations
of log p(y | f) under N(a_iᵀμ, s_i + |L_qᵀa_i|²) (a likelihood's ``expected_log_prob``), so one
chain rule to A, μ and L_q (:func:`svi_block`) and one KL and K_uu part (:func:`svi_finish`) serve
the binary SVI (gpc.sparse.baselines) and the multi-class one (gpc.multiclass.sparse_vi).  q may
also be held in u-space, q(u) = N(μ_u, L_u L_uᵀ) (:func:`whitened_q`, :func:`svi_finish_u`): the
same bound, another gradient in θ and Z.
"""

import numpy as np

from ... import _lapack, _parallel, _sparse
from ...exceptions import DivergenceError, NotPositiveDefiniteError
from .natural import add_blocks, partials, row_blocks, rows_of
from .steps import Adadelta


class LBFGSState:
    """A state that L-BFGS-B fits (:class:`gpc.sparse.core.trainers.LBFGSTrainer`): ``params()``,
    ``bounds()`` and ``objective(likelihood, X, y, p, block_rows)``, which moves the state to p
    and returns (value, gradient), or -inf where the objective cannot be evaluated (``failure``
    then holds the cause); ``snapshot()`` and ``restore()`` keep and bring back the model at a
    point (the attributes ``_model``), the counters aside."""

    #: what the method is called in messages
    name = ""
    #: the attributes that make the model at one point
    _model: tuple[str, ...] = ()
    failure = None

    def snapshot(self):
        return {key: getattr(self, key) for key in self._model}

    def restore(self, snapshot):
        for key, value in snapshot.items():
            setattr(self, key, value)


class VariationalState(LBFGSState):
    """A state whose objective is a variational bound: L-BFGS-B on it in batch
    (:class:`gpc.sparse.core.trainers.LBFGSTrainer`), Adadelta on its minibatch estimates
    (:class:`gpc.sparse.core.trainers.SVIMinibatch`, :meth:`minibatch_step`).  Besides
    :class:`LBFGSState`'s interface it gives ``_set(p)``, the move to p without evaluating, and
    counts ``reverted`` steps."""

    def minibatch_step(self, likelihood, Xb, yb, n, lr):
        """One Adadelta ascent step on the minibatch estimate of the bound (data terms x n/|M|)."""
        if not hasattr(self, "optimizer"):
            self.optimizer = Adadelta(len(self.params()), lr=lr)
        p = self.params()
        value, grad = self.objective(likelihood, Xb, yb, p, len(yb), scale=n / len(yb))
        if not (np.isfinite(value) and np.all(np.isfinite(grad))):
            self._set(p)
            self.optimizer.lr *= 0.5
            self.reverted += 1
            return value
        limits = getattr(self, "_limits", None)
        if limits is None or len(limits[0]) != len(p):
            # bounds() is a list of one pair per parameter (m(m+1)/2 + m + md of them at least):
            # made into arrays once per fit, not at every step
            lo, hi = np.array(self.bounds(), dtype=float).T
            limits = self._limits = (np.nan_to_num(lo, nan=-np.inf), np.nan_to_num(hi, nan=np.inf))
        new = np.clip(p + self.optimizer.step(grad), *limits)
        try:
            self._set(new)
        except NotPositiveDefiniteError:
            self._set(p)
            self.optimizer.lr *= 0.5
            self.reverted += 1
        return value


def svi_block(likelihood, y, A, s, mean, Lq, AL=None):
    """One block's part of the bound (8) and of its gradient.

    With μ_i = a_iᵀμ, σ_i² = s_i + |L_qᵀ a_i|² and (e, e_μ, e_σ²) from ``expected_log_prob``:
    ∂/∂A = e_μ μᵀ + 2 e_σ² (A L_q L_qᵀ - A) (s_i = k_ii - |a_i|² included), ∂/∂k_ii = e_σ²,
    ∂/∂μ = Aᵀ e_μ and ∂/∂L_q = 2 Aᵀ diag(e_σ²) A L_q.
    Returns (e_sum, G_A, e_var, AtG, g_mean, G_L).  ``AL``: A L_q (b x m, C-contiguous, read
    only) when the caller has formed it, else it is formed here.

    The rows and their m x k x m products run by fixed sub-blocks on the caller's threads, the
    sub-blocks' sums added in block order (gpc.sparse.core.natural); L_q is lower triangular, so A L_q and
    A L_q L_qᵀ are triangular products.
    """
    A = np.ascontiguousarray(A, dtype=np.float64)
    b, m = A.shape
    y, s = np.ascontiguousarray(y, dtype=np.float64), np.ascontiguousarray(s, dtype=np.float64)
    Lq = np.ascontiguousarray(Lq, dtype=np.float64)
    given = AL is not None
    AL, G_A = (AL if given else np.empty((b, m))), np.empty((b, m))
    e_m, e_v = np.empty(b), np.empty(b)
    mean = np.ascontiguousarray(mean, dtype=np.float64)
    blocks = row_blocks(b, m)
    AtGs, GLs = partials("svi_AtG", len(blocks), m), partials("svi_GL", len(blocks), m)

    def block(j):
        Ab, ALb, Gb, yb, sb, em, ev = rows_of(blocks[j], A, AL, G_A, y, s, e_m, e_v)
        if not given:
            np.copyto(ALb, Ab)
            _lapack.multiply_triangular_rows(Lq, ALb, True)       # rows L_qᵀ a_i: A L_q
        var = np.empty(len(Ab))
        _sparse.row_dots(ALb, ALb, var)
        var += sb
        if not np.all((var > 0.0) & np.isfinite(var)):
            # only where a_i or L_q rounds to 0 and s_i = 0 (jitter 0): outside the bound's domain
            i = int(np.argmin(np.where(np.isfinite(var), var, -np.inf)))
            raise DivergenceError(f"SVI: the predictive variance s_i + |L_qᵀa_i|² of row "
                                  f"{blocks[j][0] + i} is {var[i]!r} at this (θ, Z, L_q)",
                                  method="svi", value=var[i])
        mu = np.empty(len(Ab))
        _lapack.rows_dot(Ab, mean, mu)
        e, em[:], ev[:] = likelihood.expected_log_prob(yb, mu, var)
        np.copyto(Gb, ALb)
        _lapack.multiply_triangular_rows(Lq, Gb, False)            # A L_q L_qᵀ
        Gb -= Ab
        Gb *= (2.0 * ev)[:, None]
        Gb += np.multiply.outer(em, mean)
        _lapack.transpose_times(Ab, Gb, AtGs[j])                   # A_bᵀ G_A
        S = np.empty_like(Ab)
        _sparse.scale_rows(Ab, ev, S)
        _lapack.transpose_times(S, ALb, GLs[j])                    # A_bᵀ diag(e_σ²) A_b L_q
        return float(np.sum(e))
    parts = _parallel.over_blocks(block, len(blocks))
    e_sum = 0.0
    for part in parts:
        e_sum += part
    g_mean = np.zeros(m)
    _lapack.add_transpose_dot(A, e_m, g_mean)
    G_L = add_blocks(GLs, np.zeros((m, m)))
    G_L *= 2.0
    return e_sum, G_A, e_v, add_blocks(AtGs, np.zeros((m, m))), g_mean, G_L


def _q_terms(mean, Lq, g_m, G_L, scale):
    """-KL[q(w) ‖ N(0, I)] = -½ (|L_q|²_F + |μ|² - m - 2 Σ log|L_q,jj|) and the bound's gradient in
    (μ, L_q) from the data parts g_m, G_L scaled by ``scale`` (the lower triangle of ∂/∂L_q)."""
    d = np.diag(Lq)
    kl = 0.5 * (np.sum(Lq * Lq) + mean @ mean - len(mean) - 2.0 * np.sum(np.log(np.abs(d))))
    return -kl, scale * g_m - mean, np.tril(scale * G_L - Lq + np.diag(1.0 / d))


def svi_finish(factor, mean, Lq, parts, scale=1.0):
    """The bound (8) and its gradient in (log θ, Z, μ, L_q) from the summed data parts, the data
    terms scaled by ``scale`` (n/|M| for a minibatch)."""
    e, g_theta, g_Z, AtG, g_m, G_L = parts
    gt, gz = factor.uu_gradient(scale * AtG)
    neg_kl, g_m, G_L = _q_terms(mean, Lq, g_m, G_L, scale)
    return (scale * e + neg_kl, scale * g_theta + gt, scale * g_Z + gz, g_m, G_L)


def whitened_q(factor, mean_u, L_u):
    """q(u) = N(μ_u, L_u L_uᵀ) in the factor's whitened coordinates w = L⁻¹u: (L⁻¹μ_u, L⁻¹L_u),
    the second lower triangular (a product of two, m³/6 multiply-adds)."""
    L_w = np.array(L_u, dtype=np.float64, order="C")
    _lapack.lower_lower_times(factor.Li, L_w)
    return factor.Li @ mean_u, L_w


def svi_finish_u(factor, mean, Lq, parts, scale=1.0):
    """:func:`svi_finish` for q held in u-space, q(u) = N(μ_u, L_u L_uᵀ), the parametrisation of
    SVGP without whitening (Hensman, Matthews & Ghahramani 2015, §3: q(f_i) = N(v_iᵀμ_u,
    k_ii - k_iᵀv_i + v_iᵀS v_i), v_i = K_uu⁻¹k_i, and KL[q(u) ‖ N(0, K_uu)]); the ICML 2017
    paper's VI (Villacampa-Calvo & Hernández-Lobato, §4) holds q so.  ``mean`` and ``Lq`` are q's
    whitened image (:func:`whitened_q`): v_iᵀμ_u = a_iᵀμ_w, v_iᵀS v_i = |L_wᵀa_i|² and the KL is
    invariant under u = L w, so the bound is :func:`svi_finish`'s at (μ_w, L_w) and only the
    gradient changes.  With μ_w = L⁻¹μ_u and L_w = L⁻¹L_u, dL⁻¹ = -L⁻¹ dL L⁻¹ gives

        ∂F/∂μ_u = L⁻ᵀ ∂F/∂μ_w,   ∂F/∂L_u = tril(L⁻ᵀ ∂F/∂L_w),
        ∂F/∂L  += -L⁻ᵀ (∂F/∂μ_w μ_wᵀ + ∂F/∂L_w L_wᵀ),

    the last of the form -L⁻ᵀ (AᵀG_A)ᵀ that :meth:`InducingFactor.uu_gradient` takes, so it joins
    the data's AᵀG_A: one chain to K_uu, θ and Z."""
    e, g_theta, g_Z, AtG, g_m, G_L = parts
    neg_kl, g_m, G_L = _q_terms(mean, Lq, g_m, G_L, scale)
    GLt = np.array(G_L, order="C")
    _lapack.multiply_triangular_rows(Lq, GLt, False)          # rows L_q g: G_L L_qᵀ
    gt, gz = factor.uu_gradient(scale * AtG + np.outer(mean, g_m) + GLt.T)
    G_u = np.array(G_L.T, order="C")
    _lapack.multiply_triangular_rows(factor.Li, G_u, True)    # rows L⁻ᵀ g: G_Lᵀ L⁻¹
    return (scale * e + neg_kl, scale * g_theta + gt, scale * g_Z + gz, factor.Li.T @ g_m,
            np.tril(G_u.T))
