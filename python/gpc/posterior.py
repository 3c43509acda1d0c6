"""The Gaussian posterior every site method ends in, and prediction from it.

    q(f) ∝ N(f | m0, K) · Π_i exp(-½ τ_i f_i² + ν_i f_i)

so that Σ = (K⁻¹ + T)⁻¹ with T = diag(τ) and μ = Σ (K⁻¹ m0 + ν).  With every τ_i ≥ 0 this is held
through the Cholesky factor L of the well-conditioned B = I + S K S, S = T^½ (Rasmussen & Williams
§3.6, eq. (3.67)), never through K⁻¹:

    α = (I + T K)⁻¹ (ν − T m0) = b − S L⁻ᵀ L⁻¹ S K b,   b = ν − T m0,   μ = m0 + K α,
    predictive mean  m0(x*) + k*ᵀ α,
    predictive var   k** − k*ᵀ S B⁻¹ S k* = k** − ‖L⁻¹ S k*‖².
"""

import numpy as np
from scipy.linalg import blas

from . import _dense, _lapack
from ._lapack import mirror_lower
from ._linalg import cho_inverse_lower, cholesky_lower, cho_solve_lower, log_det_from_cholesky
from ._parallel import over_rows
from .exceptions import NotPositiveDefiniteError


#: below this site precision diag Σ takes the exact column: the rounding error of 1 − [B⁻¹]_ii
#: (~1e-13 in double precision) is divided by τ_i
TINY_SITE_PRECISION = 1e-6


def _gradient_matrix_in_place(M, sqrt_tau, alpha, lower):
    """M (holding B⁻¹ in its lower triangle) := ½ (α αᵀ − S B⁻¹ S) (R&W Alg. 5.2), one fused pass
    (gpc._dense); ``lower``: only the lower triangle is set."""
    zero = np.zeros(M.shape[0])
    over_rows(_dense.gaussian_site_gradient_matrix, len(zero), M, sqrt_tau, alpha, zero, zero,
              not lower)
    return M


def check_predict_inputs(K_cross, k_diag, prior_mean, n):
    """K_cross (n, m) and k_diag (m,) as float arrays, checked against the n training points, with
    a message that names the shape expected (the prediction's matrix product would fail with
    NumPy's ``matmul`` error, which names neither)."""
    K_cross = np.asarray(K_cross, dtype=np.float64)
    k_diag = np.asarray(k_diag, dtype=np.float64)
    if K_cross.ndim != 2:
        raise ValueError(f"K_cross must be 2-D, k(X_train, X_test) of shape (n_train, n_test) = "
                         f"({n}, m); got shape {K_cross.shape}")
    if K_cross.shape[0] != n:
        hint = (" (it looks transposed: pass K_cross.T)" if K_cross.shape[1] == n else "")
        raise ValueError(f"K_cross must be k(X_train, X_test) of shape (n_train, n_test) = ({n}, m) "
                         f"for this posterior of {n} training points; got shape {K_cross.shape}"
                         f"{hint}")
    m = K_cross.shape[1]
    if k_diag.shape != (m,):
        raise ValueError(f"k_diag must be k(x*, x*) of each of the m = {m} test points, shape "
                         f"({m},); got shape {k_diag.shape}")
    if np.ndim(prior_mean) != 0 and np.shape(prior_mean) != (m,):
        raise ValueError(f"prior_mean must be a number or of shape ({m},) (one per test point); "
                         f"got shape {np.shape(prior_mean)}")
    return K_cross, k_diag


class SitePosterior:
    """Gaussian posterior from a GP prior and Gaussian sites with non-negative precisions.

    Parameters
    ----------
    K : ndarray (n, n)
        Prior covariance of the training latents.
    site_precision, site_location : ndarray (n,)
        τ and ν of the sites; τ ≥ 0 is required.
    prior_mean : ndarray (n,)
        m0 at the training inputs.
    """

    def __init__(self, K, site_precision, site_location, prior_mean):
        tau = np.asarray(site_precision, dtype=np.float64)
        if np.any(tau < 0):
            raise ValueError("SitePosterior needs non-negative site precisions")
        self._set_sites(K, tau, site_location, prior_mean)
        s = self.sqrt_tau

        def build():
            B = np.empty_like(K, dtype=np.float64)
            over_rows(_dense.fill_b, len(s), np.ascontiguousarray(K, dtype=np.float64), s, B)
            return B

        self.L, _ = cholesky_lower(build(), name="B = I + S K S", overwrite=True, rebuild=build)
        b = self.site_location - tau * prior_mean
        # K v through gpc._lapack: the BLAS of the factorisations, not NumPy's (whose idle threads
        # would spin against the next factorisation's)
        self.alpha = b - s * cho_solve_lower(self.L, s * _matvec(K, b))
        self.mean = prior_mean + _matvec(K, self.alpha)
        self._diag_cov = None
        self._cov = None
        self._B_inv = None

    def _set_sites(self, K, site_precision, site_location, prior_mean):
        """K, τ, ν, m0 and S = diag(√τ), as every constructor keeps them."""
        self.K = K
        self.site_precision = np.asarray(site_precision, dtype=np.float64)
        self.site_location = np.asarray(site_location, dtype=np.float64)
        self.prior_mean = prior_mean
        self.sqrt_tau = np.sqrt(self.site_precision)

    @classmethod
    def from_factor(cls, K, site_precision, site_location, prior_mean, L, alpha, diag_cov=None):
        """The posterior from a Cholesky factor L of B = I + S K S that the caller already holds.

        ``L`` must be C-contiguous, lower triangular with a zero strict upper triangle, and
        ``alpha`` = (I + T K)⁻¹ (ν − T m0); ``diag_cov``, if given, is diag Σ.  Nothing is refactored.
        """
        self = cls.__new__(cls)
        self._set_sites(K, site_precision, site_location, prior_mean)
        self.L = L
        self.alpha = alpha
        self.mean = prior_mean + _matvec(K, alpha)
        self._diag_cov = diag_cov
        self._cov = None
        self._B_inv = None
        return self

    def B_inverse(self):
        """B⁻¹ (LAPACK dpotri from the factor; cached)."""
        if self._B_inv is None:
            self._B_inv = cho_inverse_lower(self.L)
        return self._B_inv

    def R(self):
        """R = S B⁻¹ S = (K + T⁻¹)⁻¹, the matrix of the evidence gradients (R&W Alg. 3.5, 5.2)."""
        return self.sqrt_tau[:, None] * self.B_inverse() * self.sqrt_tau[None, :]

    def gradient_matrix(self, lower=False):
        """M = ½ (α αᵀ − R), R = S B⁻¹ S, with ∂ log Z/∂θ_k = Σ_ij M_ij ∂K_ij/∂θ_k at fixed sites
        (R&W Alg. 5.2; NR eq. (13)): one dpotri and one fused pass (gpc._dense); ``lower``: only its
        lower triangle is set."""
        M = self.L.copy()
        info = _lapack.cholesky_inverse_in_place(M)               # lower triangle of B⁻¹
        if info != 0:  # pragma: no cover - L is a Cholesky factor
            raise RuntimeError(f"dpotri failed with info={info}")
        return _gradient_matrix_in_place(M, self.sqrt_tau, self.alpha, lower)

    @property
    def log_det_B(self):
        """log |I + S K S|."""
        return log_det_from_cholesky(self.L)

    def cov(self):
        """Σ = K − K S B⁻¹ S K as an n x n array (computed on first request, O(n³))."""
        if self._cov is None:
            self._cov = self.lower_cov()
            mirror_lower(self._cov)
        return self._cov

    def _inverse_factor_rows(self, rows):
        """Each row r of ``rows`` (k x n, C order) := L⁻¹ r, in place (dtrsm)."""
        _lapack.solve_triangular_rows(self.L, rows, False)

    def _release_factor(self):
        self.L = None

    def lower_cov(self, release_factor=False):
        """A new C-ordered n x n array whose lower triangle is Σ (the upper one holds K).

        Σ = K − Vᵀ V with V = L⁻¹ S K: one triangular solve in place (dtrsm) and one rank-n update
        (dsyrk), so two n x n buffers besides K and L are alive at the peak, against four for the
        product written out.  ``release_factor`` drops the factor
        once V is formed (the posterior cannot be used afterwards): then K, V and Σ only."""
        if self._cov is not None:
            return self._cov.copy()
        Vt = self.K * self.sqrt_tau[None, :]     # rows: the columns S K e_j (K symmetric)
        self._inverse_factor_rows(Vt)            # rows: the columns of V
        if release_factor:
            self._release_factor()
        Sigma = self.K.copy()
        _lapack.subtract_row_gram_lower(Vt, Sigma)           # Σ_ab = K_ab − v_aᵀ v_b
        return Sigma

    def diag_cov(self):
        """diag Σ, the posterior marginal variances.

        From diag B⁻¹ (one dtrtri): Σ = T^-½ (I − B⁻¹) T^-½ where τ_i > 0, so Σ_ii = (1 − [B⁻¹]_ii)/τ_i.  The
        rounding error of 1 − [B⁻¹]_ii (~1e-13) is divided by τ_i, so sites with τ_i below
        ``TINY_SITE_PRECISION`` take the exact column Σ e_i = K e_i − K R K e_i instead.
        """
        if self._diag_cov is None:
            if self._cov is not None:
                self._diag_cov = np.diag(self._cov).copy()
            else:
                # diag B⁻¹ = column sums of (L⁻¹)²: one triangular inverse (dtrtri, half a dpotri)
                Linv = self.L.copy()
                info = _lapack.triangular_inverse_in_place(Linv)    # L⁻¹, C order, lower
                if info != 0:  # pragma: no cover
                    raise RuntimeError(f"dtrtri failed with info={info}")
                d = marginal_variances(self.K, self.site_precision, self.sqrt_tau, Linv)
                self._diag_cov = d
        return self._diag_cov

    def predict(self, K_cross, k_diag, prior_mean=0.0):
        """Latent predictive mean and variance at test points.

        Parameters
        ----------
        K_cross : ndarray (n, m)
            k(X_train, X_test).
        k_diag : ndarray (m,)
            k(x*, x*) for each test point.
        prior_mean : float or ndarray (m,)
            m0 at the test points.

        Returns
        -------
        mean, var : ndarray (m,)

        Raises
        ------
        ValueError
            A ``K_cross`` that is not (n, m) for this posterior's n training points (e.g. the
            transposed k(X_test, X_train)), or a ``k_diag`` or ``prior_mean`` that is not of length m.
        """
        K_cross, k_diag = check_predict_inputs(K_cross, k_diag, prior_mean, self.sqrt_tau.shape[0])
        mean, var = self._predict_unclipped(K_cross, k_diag, prior_mean)
        return mean, np.maximum(var, 0.0)

    def _predict_unclipped(self, K_cross, k_diag, prior_mean=0.0):
        """:meth:`predict` before the variance is clipped at 0 (rounding can take it below)."""
        mean = prior_mean + K_cross.T @ self.alpha
        Vt = np.ascontiguousarray((self.sqrt_tau[:, None] * K_cross).T)   # rows: S k*
        self._inverse_factor_rows(Vt)                                     # rows: L⁻¹ S k*
        return mean, k_diag - np.einsum("ij,ij->i", Vt, Vt)


class NegativeSiteSplit:
    """Sites of either sign as a non-negative part and a low-rank correction, for Woodbury's
    identity: the binary engine's negative EP sites (:class:`SignedSitePosterior`) and RMGPC's
    class blocks (:mod:`gpc.multiclass._block`).

    T = T' − P D Pᵀ with T'_i = τ_i where τ_i ≥ 0 and T'_i = |τ_i| + 1/K_ii at a negative site (any
    positive value works; this one keeps √T'_i away from 0), D_i = T'_i − τ_i > 0 on the m negative
    sites N, P = I[:, N].  Σ' = (K⁻¹ + T')⁻¹ is a posterior of non-negative sites, held through the
    Cholesky factor of I + S K S with S = T'^½ by the caller, and with U = Σ' P

        Σ = Σ' + U C⁻¹ Uᵀ,   C = D⁻¹ − Pᵀ Σ' P = R Rᵀ  (m × m),   K⁻¹ U = P − T' U,
        log |I + T K| = log |I + S K S| + log |D| + log |C|

    (|I + T K| = |K| |K⁻¹ + T| and |K⁻¹ + T| = |Σ'⁻¹| |D| |C| by the determinant lemma).  Σ is
    positive definite exactly when C is (Σ' is), so the Cholesky factor of C is the check that the
    sites define a Gaussian.

    Parameters
    ----------
    tau : ndarray (n,)
        The site precisions τ, of either sign.
    k_diag : ndarray (n,)
        diag K.

    Attributes
    ----------
    neg : ndarray of int (m,)
        N, the negative sites.
    tau_prime : ndarray (n,)
        T'.
    d : ndarray (m,)
        D on N.
    """

    def __init__(self, tau, k_diag):
        tau = np.asarray(tau, dtype=np.float64)
        self.neg = np.flatnonzero(tau < 0)
        self.tau_prime = tau.copy()
        self.tau_prime[self.neg] = -tau[self.neg] + 1.0 / k_diag[self.neg]
        self.d = self.tau_prime[self.neg] - tau[self.neg]

    def factor(self, U, message):
        """R, the lower Cholesky factor of C = D⁻¹ − Pᵀ U for U = Σ' P (n × m; Pᵀ U symmetrised),
        C-ordered with a zero strict upper triangle.  Raises NotPositiveDefiniteError(message) when
        C is not positive definite."""
        m = self.neg.size
        C = -0.5 * (U[self.neg] + U[self.neg].T)
        C[np.diag_indices(m)] += 1.0 / self.d
        if m and _lapack.cholesky_in_place(C) != 0:
            raise NotPositiveDefiniteError(message)
        return C

    def prior_solve(self, U):
        """K⁻¹ U = P − T' U (n × m)."""
        Q = -self.tau_prime[:, None] * U
        Q[self.neg, np.arange(self.neg.size)] += 1.0
        return Q

    def log_det_terms(self, R):
        """(log |D|, log |C|) from C's factor R: log |I + T K| is log |I + S K S| plus both."""
        return float(np.sum(np.log(self.d))), 2.0 * float(np.sum(np.log(np.diag(R))))


class WoodburySitePosterior(SitePosterior):
    """The site posterior when some site precisions are negative, held as a non-negative part and a
    low-rank correction (what RMGPC's class blocks build, :mod:`gpc.multiclass._block`).

    The sites are split as T = T' − P D Pᵀ (:class:`NegativeSiteSplit`); Σ' = (K⁻¹ + T')⁻¹ is held
    through the Cholesky factor L of B = I + S K S with S = T'^½ (``sqrt_tau`` here is T'^½, not
    √τ), and Woodbury's identity adds the rest:
    K⁻¹ − K⁻¹ Σ K⁻¹ = S B⁻¹ S − Qc Qcᵀ with Qc an n × m matrix (R&W eq. (3.67) for the first part).
    So the gradient matrix and the predictive variance are SitePosterior's plus a rank-m term:

        M = ½ (α αᵀ − S B⁻¹ S) + ½ Qc Qcᵀ,     var* = k** − ‖L⁻¹ S k*‖² + ‖Qcᵀ k*‖².

    With m = 0 it is a SitePosterior.  Built from parts by :meth:`from_parts`; it keeps no K, so the
    full covariance is not available (:meth:`cov` raises).
    """

    @classmethod
    def from_parts(cls, site_precision, site_location, sqrt_tau, L, alpha, mean, diag_cov, log_det,
                   Qc, prior_mean=0.0):
        """The posterior from its parts: τ (any sign) and ν, T'^½, L (C-contiguous lower factor of
        I + S K S), α = K⁻¹ (μ − m0), μ, diag Σ, log |I + T K| and Qc (n × m)."""
        self = cls.__new__(cls)
        self.K, self.prior_mean = None, prior_mean
        self.site_precision = np.asarray(site_precision, dtype=np.float64)
        self.site_location = np.asarray(site_location, dtype=np.float64)
        self.sqrt_tau = np.asarray(sqrt_tau, dtype=np.float64)
        self.L, self.alpha, self.mean, self.Qc = L, alpha, mean, Qc
        self._diag_cov, self._log_det, self._cov, self._B_inv = diag_cov, float(log_det), None, None
        return self

    @property
    def log_det_B(self):
        """log |I + T K| (with negative sites no longer the log-determinant of an I + S K S)."""
        return self._log_det

    def diag_cov(self):
        """diag Σ, as computed by the class block."""
        return self._diag_cov

    def cov(self):
        raise NotImplementedError("WoodburySitePosterior keeps no K: the full covariance is not "
                                  "available, its diagonal is (diag_cov)")

    def lower_cov(self, release_factor=False):
        """Not available either (:meth:`cov`)."""
        return self.cov()

    def R(self):
        """K⁻¹ − K⁻¹ Σ K⁻¹ = S B⁻¹ S − Qc Qcᵀ."""
        return super().R() - self.Qc @ self.Qc.T

    def gradient_matrix(self, lower=False):
        """M = ½ (α αᵀ − S B⁻¹ S + Qc Qcᵀ), with ∂ log Z/∂θ = Σ_ij M_ij ∂K_ij/∂θ (R&W Alg. 5.2 with
        the Woodbury term; docs/derivations-rmgpc.md): SitePosterior's matrix plus the rank-m term."""
        M = super().gradient_matrix(lower)
        if self.Qc.shape[1]:
            M += 0.5 * (self.Qc @ self.Qc.T)
        return M

    def _predict_unclipped(self, K_cross, k_diag, prior_mean=0.0):
        mean, var = super()._predict_unclipped(K_cross, k_diag, prior_mean)
        if self.Qc.shape[1]:
            W = K_cross.T @ self.Qc
            var = var + np.einsum("ij,ij->i", W, W)
        return mean, var


class InverseFactorPosterior(SitePosterior):
    """A SitePosterior held by the inverse factor L⁻¹ of B = L Lᵀ instead of L.

    What the parallel schedule leaves: it inverts its factor in place for diag B⁻¹ and keeps no copy
    of L.  Everything is computed from L⁻¹ at the cost the factor would need, or less: B⁻¹ = L⁻ᵀ L⁻¹
    is one dlauum (half of dpotri), L⁻¹ S k* one triangular product instead of a solve, and
    log |B| = −2 Σ log [L⁻¹]_ii.  ``L`` itself, if asked for, is one triangular inverse (cached).
    """

    @classmethod
    def from_inverse_factor(cls, K, site_precision, site_location, prior_mean, Linv, alpha, mean,
                            diag_cov):
        """The posterior from L⁻¹ (C-contiguous, lower triangular, zero strict upper triangle), α,
        μ = m0 + K α and diag Σ of the same sites.  Nothing is refactored."""
        self = cls.__new__(cls)
        self._set_sites(K, site_precision, site_location, prior_mean)
        self.Linv = Linv
        self._L = None
        self.alpha = alpha
        self.mean = mean
        self._diag_cov = diag_cov
        self._cov = None
        self._B_inv = None
        return self

    @property
    def L(self):
        """The Cholesky factor of B (one triangular inverse of L⁻¹ on first use)."""
        if self._L is None:
            L = self.Linv.copy()
            info = _lapack.triangular_inverse_in_place(L)
            if info != 0:  # pragma: no cover - an inverse factor has a positive diagonal
                raise RuntimeError(f"dtrtri failed with info={info}")
            self._L = L
        return self._L

    def _lower_B_inverse(self):
        """A new array whose lower triangle is B⁻¹ = L⁻ᵀ L⁻¹ (dlauum)."""
        out = self.Linv.copy()
        info = _lapack.inverse_factor_gram_in_place(out)
        if info != 0:  # pragma: no cover
            raise RuntimeError(f"dlauum failed with info={info}")
        return out

    def B_inverse(self):
        """B⁻¹ (one dlauum of L⁻¹; cached)."""
        if self._B_inv is None:
            self._B_inv = mirror_lower(self._lower_B_inverse())
        return self._B_inv

    def gradient_matrix(self, lower=False):
        """M = ½ (α αᵀ − R), R = S B⁻¹ S, as for SitePosterior (R&W Alg. 5.2), with B⁻¹ from one
        dlauum of L⁻¹ and one fused pass (gpc._dense)."""
        return _gradient_matrix_in_place(self._lower_B_inverse(), self.sqrt_tau, self.alpha, lower)

    @property
    def log_det_B(self):
        """log |I + S K S| = −2 Σ log [L⁻¹]_ii."""
        return -2.0 * float(np.sum(np.log(np.diag(self.Linv))))

    def _inverse_factor_rows(self, rows):
        """Each row r of ``rows`` := L⁻¹ r, in place: a triangular product (dtrmm), not a solve."""
        _lapack.multiply_triangular_rows(self.Linv, rows, False)

    def _release_factor(self):
        self.Linv = self._L = None


class SignedSitePosterior(WoodburySitePosterior):
    """The binary engine's WoodburySitePosterior: built from K and sites of which some are negative
    (EP's negative sites), and holding Σ itself as well.

    The split of :class:`NegativeSiteSplit`: Σ' = (K⁻¹ + T')⁻¹ is a SitePosterior (the Cholesky
    factor L of B' = I + S' K S'), and with C = Rc Rcᵀ

        μ = μ' + U C⁻¹ μ'_N,   α = K⁻¹ (μ − m0) = α' + Q C⁻¹ μ'_N,   Q = K⁻¹ U,   Qc = Q Rc⁻ᵀ.

    U's columns are Σ' e_j = K e_j − K S' B'⁻¹ S' K e_j = K e_j − K S' (e_j − B'⁻¹ e_j)/s_j
    (S' K S' = B' − I): m solves with L and m products with K, O(n² m) beyond the Cholesky of B'
    (the factorisation of the non-negative case).
    """

    def __init__(self, K, site_precision, site_location, prior_mean):
        from scipy.linalg import solve_triangular
        tau = np.asarray(site_precision, dtype=np.float64)
        nu = np.asarray(site_location, dtype=np.float64)
        split = NegativeSiteSplit(tau, np.diag(K))
        neg = split.neg
        base = SitePosterior(K, split.tau_prime, nu, prior_mean)
        s = base.sqrt_tau
        n, m = len(tau), len(neg)
        U = np.empty((n, m))
        w = np.empty(n)
        for k, j in enumerate(neg):
            g = np.zeros(n)
            g[j] = 1.0
            _lapack.cholesky_solve_in_place(base.L, g)          # B'⁻¹ e_j
            g = -g
            g[j] += 1.0                                         # e_j − B'⁻¹ e_j
            _lapack.matvec(K, s * g / s[j], w)
            U[:, k] = K[:, j] - w
        Rc = split.factor(U, "EP's negative site variances make the posterior covariance "
                          "indefinite: these sites define no distribution (EP's sequential updates "
                          "never lead here; a parallel update or given sites can); use the "
                          "sequential schedule, or method='pl'")
        Q = split.prior_solve(U)

        def right_inverse(A):                                   # A Rc⁻ᵀ
            return solve_triangular(Rc, A.T, lower=True, check_finite=False).T if m else A

        self._base, self._V = base, right_inverse(U)
        c = solve_triangular(Rc, base.mean[neg], lower=True, check_finite=False) if m else np.zeros(0)
        self.K, self.prior_mean = K, prior_mean
        self.site_precision, self.site_location = tau, nu
        self.sqrt_tau, self.L, self.Qc = s, base.L, right_inverse(Q)
        self.mean = base.mean + self._V @ c
        self.alpha = base.alpha + self.Qc @ c
        log_det_d, log_det_c = split.log_det_terms(Rc)
        self._log_det = base.log_det_B + log_det_d + log_det_c
        self._diag_cov = self._cov = self._B_inv = None

    def diag_cov(self):
        """diag Σ = diag Σ' + row sums of (U Rc⁻ᵀ)²."""
        if self._diag_cov is None:
            self._diag_cov = self._base.diag_cov() + np.einsum("ij,ij->i", self._V, self._V)
        return self._diag_cov

    def lower_cov(self, release_factor=False):
        """A new C-ordered n x n array whose lower triangle is Σ = Σ' + V Vᵀ (V = U Rc⁻ᵀ; one dsyrk of
        scipy's BLAS on top of Σ' of the non-negative part)."""
        if self._cov is not None:
            return self._cov.copy()
        Sigma = self._base.lower_cov(release_factor=release_factor)
        if release_factor:
            self.L = None
        if self._V.shape[1]:
            # Fortran sees Σᵀ, whose upper triangle is Σ's lower one: Σᵀ += V Vᵀ there
            blas.dsyrk(1.0, self._V, beta=1.0, c=Sigma.T, lower=0, overwrite_c=1)
        return Sigma

    def cov(self):
        """Σ as an n x n array (computed on first request)."""
        if self._cov is None:
            self._cov = self.lower_cov()
            mirror_lower(self._cov)
        return self._cov


def marginal_variances(K, tau, sqrt_tau, Linv, tiny=TINY_SITE_PRECISION):
    """diag Σ of Σ = (K⁻¹ + T)⁻¹, T = diag(τ) ≥ 0, from the inverse factor L⁻¹ (float64 or float32)
    of B = I + S K S, S = T^½.

    Σ = T^-½ (I − B⁻¹) T^-½ where τ_i > 0, so Σ_ii = (1 − [B⁻¹]_ii)/τ_i with diag B⁻¹ the column sums
    of (L⁻¹)².  The rounding error of 1 − [B⁻¹]_ii (unit roundoff of L⁻¹'s precision) is divided by
    τ_i, so sites with τ_i ≤ ``tiny`` take the exact column Σ e_i = K e_i − K S B⁻¹ S K e_i instead,
    ‖L⁻¹ S K e_i‖² by one triangular product.
    """
    n = len(tau)
    diag_B_inv = np.empty(n)
    over_rows(_dense.column_sq_sums_lower, n, Linv, diag_B_inv, cost="upper")
    d = np.empty(n)
    ok = tau > tiny
    d[ok] = (1.0 - diag_B_inv[ok]) / tau[ok]
    idx = np.flatnonzero(~ok)
    if idx.size:
        V = np.ascontiguousarray((K[idx] * sqrt_tau[None, :]).astype(Linv.dtype, copy=False))
        _lapack.multiply_triangular_rows(Linv, V, False)      # rows: L⁻¹ S K e_i
        d[idx] = K[idx, idx] - np.einsum("ij,ij->i", V, V, dtype=np.float64)
    return d


def _matvec(K, v):
    """K v (gpc._lapack's dgemv for a C-ordered float64 K)."""
    if K.flags.c_contiguous and K.dtype == np.float64:
        out = np.empty(K.shape[0])
        _lapack.matvec(K, np.ascontiguousarray(v, dtype=np.float64), out)
        return out
    return K @ v


def site_posterior(K, site_precision, site_location, prior_mean):
    """SitePosterior when every τ ≥ 0, SignedSitePosterior otherwise."""
    if np.all(np.asarray(site_precision) >= 0):
        return SitePosterior(K, site_precision, site_location, prior_mean)
    return SignedSitePosterior(K, site_precision, site_location, prior_mean)
