"""One epoch of sparse multi-class GP classification against GPyTorch's SVGP (the speed bench).

The problem is Fashion-MNIST's shape: 10 classes, n = 60,000 training rows of d = 784 pixels in
[0, 1], m = 100 inducing points per class, minibatches of 200, one epoch.  The data are
Fashion-MNIST itself when its IDX files are in ``--data-dir`` (Debian's dataset-fashion-mnist
installs them in /usr/share/datasets/fashion-mnist), otherwise a synthetic problem of the same shape
(``--data synthetic``: ten Gaussian clusters of blurred pixel templates).

Contenders, at equal m, minibatch size and epochs, from the same inducing inputs (m training rows
drawn at random, the same for every class) and the same kernel start (amplitude 1 and one RBF
length-scale, the median distance of 500 rows, per class):

* ``gpc ep``: ``SparseMultiClassGPC`` (scalable EP, ε from 0.01, learnt, Adadelta on every
  class's θ, Z and ε after each minibatch);
* ``gpc vi``: ``SparseMultiClassGPC(method="vi")``, the robust-max bound by quadrature, Adadelta;
* ``gpytorch``: ``ApproximateGP`` with an ``IndependentMultitaskVariationalStrategy`` over a
  whitened ``VariationalStrategy`` with C independent latent GPs (batch shape [C], each with its
  own ``ScaleKernel(RBFKernel)`` and inducing inputs), ``SoftmaxLikelihood`` (no mixing), the
  ``VariationalELBO`` with ``num_data = n`` and Adam (lr 0.01), float64 on the CPU.

Each is timed over its epoch (model construction included, data loading excluded) after one
untimed warm-up step of a throwaway model of the same kind (first-call costs: imports, thread
pools, BLAS buffers).  Test error and mean test NLL are taken on ``--n-test`` held-out rows
(GPyTorch's predictive by 256 likelihood samples).  The thread counts (default: 1 and all cores)
run in turn, and within each the contenders alternate, ``--repeats`` times; BLAS is pinned by
threadpoolctl and torch by ``torch.set_num_threads``; gpc runs its class blocks on ``n_jobs``
threads with BLAS on one.

    python bench/bench_multiclass_sparse.py              # the full problem (minutes per run)
    python bench/bench_multiclass_sparse.py --quick      # n = 2,000, 500 test rows: ≤ 2 min

GPyTorch and torch are the bench's own dependencies (not gpc's): without them the table has the
gpc rows only.
"""

import argparse
import gc
import os
import platform
import time

import numpy as np
from threadpoolctl import threadpool_info, threadpool_limits

from gpc import SparseMultiClassGPC
from gpc.datasets._idx import FILES, read_idx
from gpc.kernels import RBF, ConstantKernel

FASHION_DIR = "/usr/share/datasets/fashion-mnist"
C, D = 10, 784


# -- data ------------------------------------------------------------------------------------------
def fashion_mnist(data_dir, n, n_test, rng):
    """n training rows and n_test test rows of Fashion-MNIST (pixels / 255, class codes 0-9), drawn
    at random from its training and test parts."""
    def part(name, size):
        images, labels = (os.path.join(data_dir, f) for f in FILES[name])
        X, y = read_idx(images), read_idx(labels)
        idx = rng.choice(len(y), size=size, replace=False)
        return X.reshape(len(y), -1)[idx].astype(np.float64) / 255.0, y[idx].astype(np.intp)
    return (*part("train", n), *part("test", n_test))


def synthetic(n, n_test, rng):
    """Fashion-MNIST's shape without the files: per class a smooth 28 x 28 template in [0, 1]; a row
    is its class's template, randomly scaled and shifted in brightness, plus pixel noise, clipped
    to [0, 1].  Classes overlap (about a tenth of the rows are hard)."""
    grid = np.stack(np.meshgrid(np.linspace(-1, 1, 28), np.linspace(-1, 1, 28)), -1).reshape(-1, 2)
    centres = rng.uniform(-0.7, 0.7, size=(C, 3, 2))
    templates = np.stack([sum(np.exp(-np.sum((grid - c) ** 2, 1) / 0.15) for c in cs)
                          for cs in centres])
    templates /= templates.max(axis=1, keepdims=True)

    def rows(size):
        y = rng.integers(0, C, size)
        scale = rng.uniform(0.5, 1.0, (size, 1))
        X = scale * templates[y] + rng.uniform(-0.1, 0.1, (size, 1))
        X += 0.35 * rng.standard_normal((size, D))
        return np.clip(X, 0.0, 1.0), y
    return (*rows(n), *rows(n_test))


def start_point(X, m, rng):
    """The shared start: m training rows as inducing inputs, and the median distance of 500 rows
    as the length-scale."""
    Z = X[rng.choice(len(X), m, replace=False)].copy()
    S = X[rng.choice(len(X), min(500, len(X)), replace=False)]
    d2 = np.sum(S ** 2, 1)[:, None] + np.sum(S ** 2, 1)[None, :] - 2 * S @ S.T
    ell = float(np.sqrt(np.median(d2[np.triu_indices(len(S), 1)])))
    return Z, ell


def held_out_scores(P, y):
    """(error, mean NLL) of class probabilities P (rows) for labels y."""
    p = np.clip(P[np.arange(len(y)), y], 1e-300, None)
    return float(np.mean(np.argmax(P, axis=1) != y)), float(-np.mean(np.log(p)))


# -- the contenders --------------------------------------------------------------------------------
def gpc_model(method, Z, ell, m, batch, threads):
    return SparseMultiClassGPC(kernel=ConstantKernel(1.0) * RBF(ell), n_inducing=m,
                               inducing_points=Z, method=method, label_noise=0.01,
                               batch_size=batch, max_iter=1, random_state=0, progress=False,
                               n_jobs=threads)


def run_gpc(method, data, Z, ell, m, batch, threads):
    X, y, Xt, yt = data
    # warm-up: one step of a throwaway model (two minibatches, so that it trains by minibatch)
    gpc_model(method, Z, ell, m, batch, threads).fit(X[:2 * batch], y[:2 * batch])
    gc.collect()
    t0 = time.perf_counter()
    clf = gpc_model(method, Z, ell, m, batch, threads).fit(X, y)
    seconds = time.perf_counter() - t0
    return seconds, *held_out_scores(clf.predict_proba(Xt), yt)


def run_gpytorch(data, Z, ell, m, batch, threads, seed=0):
    import gpytorch
    import torch

    torch.set_num_threads(threads)
    dtype = torch.float64
    X, y, Xt, yt = data

    class SVGP(gpytorch.models.ApproximateGP):
        def __init__(self):
            Zt = torch.tensor(np.repeat(Z[None], C, axis=0), dtype=dtype)
            q = gpytorch.variational.CholeskyVariationalDistribution(
                m, batch_shape=torch.Size([C]), dtype=dtype)
            strategy = gpytorch.variational.IndependentMultitaskVariationalStrategy(
                gpytorch.variational.VariationalStrategy(self, Zt, q,
                                                         learn_inducing_locations=True),
                num_tasks=C)
            super().__init__(strategy)
            self.mean_module = gpytorch.means.ZeroMean(batch_shape=torch.Size([C]))
            rbf = gpytorch.kernels.RBFKernel(batch_shape=torch.Size([C]))
            rbf.lengthscale = torch.full((C, 1, 1), ell, dtype=dtype)
            self.covar_module = gpytorch.kernels.ScaleKernel(rbf, batch_shape=torch.Size([C]))
            self.covar_module.outputscale = torch.ones(C, dtype=dtype)

        def forward(self, x):
            return gpytorch.distributions.MultivariateNormal(self.mean_module(x),
                                                             self.covar_module(x))

    def make():
        torch.manual_seed(seed)
        model = SVGP().to(dtype)
        lik = gpytorch.likelihoods.SoftmaxLikelihood(num_classes=C, mixing_weights=False).to(dtype)
        mll = gpytorch.mlls.VariationalELBO(lik, model, num_data=len(y))
        opt = torch.optim.Adam(list(model.parameters()) + list(lik.parameters()), lr=0.01)
        return model, lik, mll, opt

    Xtr, ytr = torch.tensor(X, dtype=dtype), torch.tensor(y, dtype=torch.long)

    def step(model, mll, opt, rows):
        opt.zero_grad()
        loss = -mll(model(Xtr[rows]), ytr[rows])
        loss.backward()
        opt.step()

    model, lik, mll, opt = make()                  # warm-up: one step of a throwaway model
    model.train(), lik.train()
    step(model, mll, opt, slice(0, batch))
    del model, lik, mll, opt
    gc.collect()

    order = np.random.default_rng(seed).permutation(-(-len(y) // batch))
    t0 = time.perf_counter()
    model, lik, mll, opt = make()
    model.train(), lik.train()
    for j in order:
        step(model, mll, opt, slice(j * batch, min((j + 1) * batch, len(y))))
    seconds = time.perf_counter() - t0
    model.eval(), lik.eval()
    P = []
    with torch.no_grad(), gpytorch.settings.num_likelihood_samples(256):
        for a in range(0, len(yt), 1000):
            out = lik(model(torch.tensor(Xt[a:a + 1000], dtype=dtype)))
            P.append(out.probs.mean(0).numpy())
    return seconds, *held_out_scores(np.concatenate(P), yt)


def have_gpytorch():
    try:
        import gpytorch  # noqa: F401
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


# -- the table -------------------------------------------------------------------------------------
def machine_line():
    blas = sorted({f"{i.get('internal_api')} {i.get('version')} ({i.get('num_threads')} threads)"
                   for i in threadpool_info() if i.get("user_api") == "blas"})
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return (f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, load average "
            f"{load}; BLAS: {'; '.join(blas) or 'unknown'}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="n = 2,000 and 500 test rows (≤ 2 min)")
    ap.add_argument("--n", type=int, default=None, help="training rows (default 60,000)")
    ap.add_argument("--n-test", type=int, default=None, help="test rows (default 10,000)")
    ap.add_argument("--m", type=int, default=100)
    ap.add_argument("--batch", type=int, default=200)
    ap.add_argument("--threads", type=int, nargs="+", default=None,
                    help="thread counts to run (default: 1 and every core)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--methods", nargs="+", default=["ep", "vi", "gpytorch"],
                    choices=["ep", "vi", "gpytorch"])
    ap.add_argument("--data", choices=["auto", "fashion", "synthetic"], default="auto")
    ap.add_argument("--data-dir", default=FASHION_DIR)
    args = ap.parse_args(argv)
    n = args.n or (2000 if args.quick else 60_000)
    n_test = args.n_test or (500 if args.quick else 10_000)
    threads = args.threads or sorted({1, os.cpu_count() or 1})
    rng = np.random.default_rng(0)
    fashion = os.path.exists(os.path.join(args.data_dir, FILES["train"][0]))
    if args.data == "fashion" or (args.data == "auto" and fashion):
        data, name = fashion_mnist(args.data_dir, n, n_test, rng), "Fashion-MNIST"
    else:
        data, name = synthetic(n, n_test, rng), "synthetic (Fashion-MNIST's shape)"
    Z, ell = start_point(data[0], args.m, rng)
    methods = list(args.methods)
    if "gpytorch" in methods and not have_gpytorch():
        print("(gpytorch or torch is not installed: its rows are left out)")
        methods.remove("gpytorch")

    print(f"# One epoch, {name}: n = {n}, d = {D}, C = {C}, m = {args.m}, minibatch "
          f"{args.batch}, {n_test} test rows; start length-scale {ell:.3g}")
    print(f"# machine: {machine_line()}")
    print()
    print("| threads | method | epoch s | test error | test NLL |")
    print("| --- | --- | --- | --- | --- |")
    results = {}
    for _ in range(args.repeats):
        for t in threads:
            for method in methods:
                with threadpool_limits(t):
                    if method == "gpytorch":
                        r = run_gpytorch(data, Z, ell, args.m, args.batch, t)
                    else:
                        r = run_gpc(method, data, Z, ell, args.m, args.batch, t)
                results.setdefault((t, method), []).append(r)
                label = "gpc " + method if method != "gpytorch" else "gpytorch SVGP"
                print(f"| {t} | {label} | {r[0]:.2f} | {r[1]:.4f} | {r[2]:.4f} |", flush=True)
    if "gpytorch" in methods:
        print()
        for t in threads:
            peer = np.median([r[0] for r in results[(t, "gpytorch")]])
            for method in methods:
                if method != "gpytorch":
                    own = np.median([r[0] for r in results[(t, method)]])
                    print(f"- {t} thread(s): gpc {method} / gpytorch epoch time = "
                          f"{own / peer:.2f}")
    print(f"\n# load average at the end: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
