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

from ._linalg import cholesky_lower, cho_solve_lower, log_det_from_cholesky, solve_lower


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
        self.K = K
        self.site_precision = tau
        self.site_location = np.asarray(site_location, dtype=np.float64)
        self.prior_mean = prior_mean
        self.sqrt_tau = np.sqrt(tau)
        s = self.sqrt_tau
        B = s[:, None] * K * s[None, :]
        B.flat[:: len(s) + 1] += 1.0
        self.L, _ = cholesky_lower(B, name="B = I + S K S", overwrite=True)
        b = self.site_location - tau * prior_mean
        self.alpha = b - s * cho_solve_lower(self.L, s * (K @ b))
        self.mean = prior_mean + K @ self.alpha
        self._diag_cov = None
        self._cov = None

    @property
    def log_det_B(self):
        """log |I + S K S|."""
        return log_det_from_cholesky(self.L)

    def cov(self):
        """Σ = K − K S B⁻¹ S K as an n x n array (computed on first request, O(n³))."""
        if self._cov is None:
            V = solve_lower(self.L, self.sqrt_tau[:, None] * self.K)
            self._cov = self.K - V.T @ V
        return self._cov

    def diag_cov(self):
        """diag Σ, the posterior marginal variances."""
        if self._diag_cov is None:
            if self._cov is not None:
                self._diag_cov = np.diag(self._cov).copy()
            else:
                V = solve_lower(self.L, self.sqrt_tau[:, None] * self.K)
                self._diag_cov = np.diag(self.K) - np.einsum("ij,ij->j", V, V)
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
        """
        mean = prior_mean + K_cross.T @ self.alpha
        V = solve_lower(self.L, self.sqrt_tau[:, None] * K_cross)
        var = k_diag - np.einsum("ij,ij->j", V, V)
        return mean, np.maximum(var, 0.0)
