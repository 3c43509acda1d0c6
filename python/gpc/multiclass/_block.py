"""One class's Gaussian in RMGPC's EP: N(f_k | μ, Σ) with Σ = (K⁻¹ + Λ)⁻¹, μ = Σ v.

EP needs from it, at every iteration, only the marginal means and variances; the evidence needs
log|I + Λ K| and prediction and gradients need K⁻¹μ and K⁻¹ − K⁻¹ΣK⁻¹.  Λ is diagonal and may have
negative entries (the outlier mixture widens a marginal), so the binary engine's B = I + S K S
(S = Λ^½) does not apply directly.  The block splits the sites as the binary engine's negative EP
sites are split (gpc.posterior.NegativeSiteSplit),

    Λ = Λ' − P D Pᵀ,   Λ' ≥ 0,   D > 0 diagonal on the m negative sites N (P = I[:, N]),

Σ' = (K⁻¹ + Λ')⁻¹ is held through the Cholesky factor of B = I + S K S (S = Λ'^½), as in the binary
engine (gpc._dense.fill_b and gpc._lapack), and Woodbury's identity gives the rest:

    Σ = Σ' + U C⁻¹ Uᵀ,   U = Σ' P,   C = D⁻¹ − Pᵀ Σ' P   (m × m),

Σ is positive definite exactly when C is (Σ' is), so a failed Cholesky of C is the signal that the
sites do not define a Gaussian.  The pieces, with L the factor of B and G = B⁻¹ P:

    diag Σ'  = (1 − diag B⁻¹)/Λ'  (diag B⁻¹ from L⁻¹; exact columns ‖L⁻¹ S K eᵢ‖² where Λ' is tiny),
    U        = (P − G) ⊘ (s sᴺᵀ)    (rows with tiny Λ': K P − K S (P − G) diag(1/sᴺ), exact),
    μ        = μ' + U C⁻¹ μ'_N,      μ' = Σ' v = K (v − S B⁻¹ S K v),
    diag Σ   = diag Σ' + rowsums((U R⁻ᵀ)²),   C = R Rᵀ,
    log|I + Λ K| = log|B| + log|D| + log|C|.

Cost per call: one Cholesky and one triangular inverse of B (both single precision when asked:
half the time), a triangular solve with m right-hand sides for G and O(n²) for the rest; every
O(n³) and O(n²) call is a gpc._lapack / gpc._dense call or a NumPy BLAS call, which release the
GIL, so the l blocks overlap in threads.
"""

import numpy as np

from .. import _dense, _lapack
from .._multiclass import prime_mean
from ..exceptions import NotPositiveDefiniteError
from ..posterior import NegativeSiteSplit, WoodburySitePosterior, marginal_variances

#: below these Λ' the marginal variance takes the exact column ‖L⁻¹ S K eᵢ‖²: the rounding error of
#: 1 − [B⁻¹]ᵢᵢ (unit roundoff ~1e-16 / 6e-8) is divided by Λ'ᵢ (the binary engine's thresholds)
TINY = {np.float64: 1e-6, np.float32: 1e-3}


class ClassPosterior(WoodburySitePosterior):
    """N(f_k | μ_k, Σ_k) of one class at converged sites: a :class:`gpc.posterior.WoodburySitePosterior`
    (the binary engine's Gaussian-site algebra, R&W eq. (3.67), plus the rank-m Woodbury term of the
    negative sites), whose ``gradient_matrix`` is RMGPC eq. (18)'s M_k, ``alpha`` = K⁻¹ μ_k,
    ``log_det_B`` = log |I + Λᵏ K_k| (log |M_k| of RMGPC eq. (16)), ``site_precision`` and
    ``site_location`` Λᵏ and vᵏ of RMGPC eq. (17)-(18), ``sqrt_tau`` = Λ'^½ of the split (module
    docstring) and ``Qc`` = Q R⁻ᵀ with Q = K⁻¹ U = P − Λ' U (m = 0 columns when every site
    precision is non-negative)."""

    def latent_moments(self, K_cross, k_diag):
        """Mean and variance of f_k(x*) under Q, RMGPC eq. (20), K_cross = k(X_test, X_train):
        m = k*ᵀ K⁻¹ μ and v = κ* − ‖L⁻¹ S k*‖² + ‖Qcᵀ k*‖², floored at 1e-300 (the predictive
        integral divides by √v)."""
        mean, var = self._predict_unclipped(K_cross.T, k_diag)
        return mean, np.maximum(var, 1e-300)


class ClassBlock:
    """The class Gaussian of RMGPC's EP for a fixed K, refactored in reused buffers at each call.

    Parameters
    ----------
    K : ndarray (n, n)
        The class's prior covariance (C-contiguous float64; shared, never written).
    """

    def __init__(self, K):
        self.K = K
        self.n = K.shape[0]
        self.k_diag = np.ascontiguousarray(np.diag(K))
        self._buffers = {}
        self.single = False
        self._last = None

    def _buffer(self, dtype, which):
        key = (np.dtype(dtype).name, which)
        if key not in self._buffers:
            self._buffers[key] = np.empty((self.n, self.n), dtype=dtype)
        return self._buffers[key]

    def marginals(self, tau, eta, single=False):
        """(μ, diag Σ) for site precisions ``tau`` (any sign) and locations ``eta``.

        With ``single`` the factorisation and the solves with it are float32 (half the time of
        double; marginals to ~1e-4 relative), unless float32 cannot factor B, in which case double
        is used.  Raises NotPositiveDefiniteError when the sites give no Gaussian (Σ not positive
        definite).
        """
        if single:
            try:
                out = self._marginals(tau, eta, np.float32)
                self.single = True
                return out
            except _SinglePrecisionFailed:
                pass
        self.single = False
        return self._marginals(tau, eta, np.float64)

    def _marginals(self, tau, eta, dtype):
        K, n = self.K, self.n
        tau = np.asarray(tau, dtype=np.float64)
        eta = np.asarray(eta, dtype=np.float64)
        split = NegativeSiteSplit(tau, self.k_diag)
        neg, lam = split.neg, split.tau_prime                    # N, Λ' ≥ 0
        s = np.sqrt(lam)

        L = self._buffer(dtype, "L")
        _dense.fill_b(K, s, L)       # one thread: the blocks themselves run in threads
        if _lapack.cholesky_in_place(L) != 0:
            if dtype is np.float32:
                raise _SinglePrecisionFailed
            raise NotPositiveDefiniteError("B = I + S K S is not positive definite: K is not a "
                                           "covariance matrix, or the site precisions overflow")
        Linv = self._buffer(dtype, "Linv")
        np.copyto(Linv, L)
        if _lapack.triangular_inverse_in_place(Linv) != 0:  # pragma: no cover - a Cholesky factor
            raise RuntimeError("triangular inverse of a Cholesky factor failed")
        var = marginal_variances(K, lam, s, Linv, TINY[dtype])       # diag Σ'
        tiny = np.flatnonzero(lam <= TINY[dtype])
        big = lam > TINY[dtype]

        mean = self._prime_mean_k(L, s, eta)
        logdet = 2.0 * float(np.sum(np.log(np.diag(L), dtype=np.float64)))

        Qc = np.zeros((n, 0))
        if neg.size:
            m = neg.size
            G = np.ascontiguousarray(Linv[:, neg].T)             # rows: (L⁻¹ eⱼ)ᵀ
            _lapack.solve_triangular_rows(L, G, True)            # rows: (B⁻¹ eⱼ)ᵀ, G = B⁻¹ P
            PG = -G.astype(np.float64)                           # rows: (P − G)ᵀ
            PG[np.arange(m), neg] += 1.0
            Ut = PG / s[neg][:, None]                            # rows: (B⁻¹ S K eⱼ)ᵀ, j ∈ N
            U = np.empty((n, m))                                 # Σ' P
            U[big] = Ut[:, big].T / s[big][:, None]
            if tiny.size:
                U[tiny] = K[tiny][:, neg] - (K[tiny] * s[None, :]) @ Ut.T
            C = split.factor(U, "the site precisions make a class covariance indefinite")
            H = U.copy()                                         # rows: (R⁻¹ Uᵢᵀ)ᵀ, C = R Rᵀ
            _lapack.solve_triangular_rows(C, H, False)
            var += np.einsum("ij,ij->i", H, H)
            mean = self._correct_mean(mean, neg, U, C)
            log_det_d, log_det_c = split.log_det_terms(C)
            logdet += log_det_d + log_det_c
            if dtype is np.float64:
                Qc = np.ascontiguousarray(split.prior_solve(U))  # K⁻¹ U = P − Λ' U
                _lapack.solve_triangular_rows(C, Qc, False)      # Q R⁻ᵀ
        if not (np.all(np.isfinite(mean)) and np.all(np.isfinite(var))):
            raise NotPositiveDefiniteError("the site precisions give a non-finite class marginal")
        if np.any(var <= 0):
            raise NotPositiveDefiniteError("the site precisions give a non-positive marginal variance")
        self._factors = (L, s, neg, U if neg.size else None, C if neg.size else None)
        if dtype is np.float64:
            self._last, self._var = (tau, logdet, s, Qc), var
        return mean, var

    def mean(self, eta):
        """μ = Σ v for new locations ``eta`` at the site precisions of the last call (O(n²): the
        variances do not depend on the locations, and the factor is reused)."""
        L, s, neg, U, C = self._factors
        mean = self._prime_mean_k(L, s, eta)
        if U is not None:
            mean = self._correct_mean(mean, neg, U, C)
        return mean

    def _prime_mean_k(self, L, s, eta):
        """μ' = Σ' v = K α', α' = v − S B⁻¹ S K v (R&W eq. (3.67) with m0 = 0), one nogil call."""
        n = self.n
        out = np.empty(n)
        prime_mean(self.K, L, s, np.ascontiguousarray(eta, dtype=np.float64), np.empty(n),
                   np.empty(n, dtype=L.dtype), out)
        return out

    @staticmethod
    def _correct_mean(mean, neg, U, C):
        """μ = μ' + U C⁻¹ μ'_N (Woodbury, module docstring); C holds its Cholesky factor."""
        w = mean[neg][None, :].copy()
        _lapack.solve_triangular_rows(C, w, False)
        _lapack.solve_triangular_rows(C, w, True)
        return mean + U @ w[0]

    def posterior(self, eta):
        """The ClassPosterior at the site precisions of the last call, which must have been double
        precision, and locations ``eta`` (its mean recomputed, O(n²)); hands over the factor buffer."""
        if self.single or self._last is None:
            raise RuntimeError("the last class refactorisation was not double precision")
        tau, logdet, s, Qc = self._last
        eta = np.asarray(eta, dtype=np.float64).copy()
        mean = self.mean(eta)
        L = self._buffers.pop(("float64", "L"))
        self._last = None
        # K⁻¹ μ = v − Λ μ (Σ⁻¹ μ = v), for sites of any sign
        return ClassPosterior.from_parts(tau.copy(), eta, s, L, eta - tau * mean, mean, self._var,
                                         logdet, Qc)


class _SinglePrecisionFailed(Exception):
    """float32 could not factor B: retry in double."""
