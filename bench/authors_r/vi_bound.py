"""gpc's VI bound against the authors' ``lower_bound`` at the same parameters.

    python bench/authors_r/vi_bound.py DIR [SET] [SPLIT]      # default: glass, split 1 (R's numbering)
    AUTHORS_R_DIR=/path/to/theirs Rscript bench/authors_r/vi_bound.R DIR

The first fits ``SparseMultiClassGPC(method="vi")`` in the ``smgpc-authors`` set-up, prints its
bound at its final parameters and writes them to DIR in the authors' parametrisation: per class
Z_k, q(u_k) = N(m_k, L_k L_kᵀ) with m_k = L_K μ_k and L_k = L_K L_q,k (gpc holds u_k = L_K w_k
whitened, L_K the Cholesky factor of K_uu), log σ², log σ₀² and their l_j = ℓ_j²; the rows and
labels (1..C).  The second evaluates ``vi_multiclass_batch.R``'s ``lower_bound`` there with their
ε = 10⁻³.  The two differ by their one-dimensional rules (gpc's 64-node Gauss–Hermite, their
100-point trapezoid over ±10 s.d.) and jitters (10⁻⁸ on K_uu against their 10⁻¹⁰).
"""

import os
import sys
import warnings

import numpy as np

from gpc import datasets
from gpc.experiments.sep_common import random_rows
from gpc.experiments.smgpc_authors import M, ITERATIONS, length_scale, make_classifier, standardise


def main(out, name="glass", split=1):
    warnings.simplefilter("ignore")
    os.makedirs(out, exist_ok=True)
    X, y, _, _ = datasets.smgpc_split(name, split - 1)
    X, _ = standardise(X, X[:1])
    Z = X[random_rows(len(X), min(M, len(X)), split - 1)]
    C = len(np.unique(y))
    clf = make_classifier("vi", Z, length_scale(X), C, ITERATIONS, split - 1).fit(X, y)
    state = clf._state
    labels = np.searchsorted(clf.classes_, y)
    value, _ = state.objective(None, X, labels, state.params().copy(), len(labels))
    print(f"gpc's bound at its final parameters: {value:.6f} (label_noise {state.eps:.6g}, C = {C})")
    np.savetxt(os.path.join(out, "X.csv"), X, delimiter=",")
    np.savetxt(os.path.join(out, "y.csv"), labels + 1, fmt="%d")
    for k in range(C):
        kern, factor = state.kernel_of(k), state.factors[k]
        ell = np.broadcast_to(kern.k1.k2.length_scale, (X.shape[1],))
        hyp = [np.log(kern.k1.k1.constant_value), np.log(kern.k2.noise_level), *(2.0 * np.log(ell))]
        np.savetxt(os.path.join(out, f"Z{k}.csv"), state.Z_of(k), delimiter=",")
        np.savetxt(os.path.join(out, f"L{k}.csv"), factor.L @ state.Lqs[k], delimiter=",")
        np.savetxt(os.path.join(out, f"m{k}.csv"), factor.L @ state.means[k])
        np.savetxt(os.path.join(out, f"hyp{k}.csv"), hyp)


if __name__ == "__main__":
    main(sys.argv[1], *(sys.argv[2:3] or ["glass"]), *[int(s) for s in sys.argv[3:4]])
