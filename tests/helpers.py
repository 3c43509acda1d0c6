"""Helpers shared by the tests: small synthetic problems and an in-process command line."""

import contextlib
import logging

import numpy as np


def rbf(X, ell=1.0, sf2=1.0):
    """sf2 · exp(−‖x − x'‖²/2ℓ²), written out so the tests do not depend on gpc.kernels."""
    d2 = ((X[:, None, :] - X[None, :, :]) ** 2).sum(-1)
    return sf2 * np.exp(-0.5 * d2 / ell**2)


def toy(n, seed, noise=0.7):
    """n points in 2-D with labels from the sign of the first coordinate plus noise."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 2))
    y = np.where(X[:, 0] + noise * rng.normal(size=n) > 0, 1.0, -1.0)
    return X, y


def run_cli(argv, capsys):
    """Run the command line in-process; returns (exit status, stdout, stderr)."""
    from gpc.__main__ import main
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    out = capsys.readouterr()
    return code, out.out, out.err


@contextlib.contextmanager
def local_client(patience=300.0):
    """A dask client on a fresh LocalCluster of 2 worker processes x 1 thread on the loopback, both
    workers up (waits bounded by ``patience`` seconds), closed on exit."""
    import dask
    import distributed

    timeouts = {"distributed.comm.timeouts.connect": "120s", "distributed.comm.timeouts.tcp": "120s"}
    with dask.config.set(timeouts), \
            distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                     host="127.0.0.1", dashboard_address="127.0.0.1:0",
                                     silence_logs=logging.ERROR) as cluster, \
            distributed.Client(cluster, timeout=patience) as client:
        client.wait_for_workers(2, timeout=patience)
        yield client


def central_differences(f, x, h=1e-6):
    """∂f/∂x of a scalar function of a vector, entry by entry: (f(x + h e_j) - f(x - h e_j)) / 2h."""
    g = np.empty_like(x)
    for j in range(len(x)):
        up, down = x.copy(), x.copy()
        up[j] += h
        down[j] -= h
        g[j] = (f(up) - f(down)) / (2 * h)
    return g
