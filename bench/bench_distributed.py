"""The fixed cost of one distributed iteration (SEP §2.3), m = 200: Dask (2 workers x 1 thread) against the
same step in process, and what it would cost to bring the sites home each iteration instead of leaving them
on the workers.

Run: ``python -m pytest bench/bench_distributed.py`` (BLAS threads: ``GPC_BENCH_THREADS`` in this process,
1 in the workers, which dask's nanny pins through OMP/MKL/OPENBLAS_NUM_THREADS).
"""

import logging

import numpy as np
import pytest
from scipy.linalg import lapack

from gpc.distributed import DaskEngine, InProcessEngine

distributed = pytest.importorskip("distributed", reason='needs pip install "gpc[distributed]"')

M = 200          # inducing points: q (m + m² numbers) goes out, the partial (m² + m + 2) comes back
N_TINY = 64      # rows per iteration: so small that the step's arithmetic is negligible
N_SITES = 200_000


def payload_step(phi, q_state, theta, sites):
    """A step with SEP's shapes: marginals of f = φᵀ w under q, new sites, O(m²) sums (SEP §2.3)."""
    mean, cov = q_state
    tau, nu = sites
    v_f = np.einsum("ij,jk,ik->i", phi, cov, phi)
    new_tau, new_nu = 0.5 * tau + 0.5 / v_f, 0.5 * nu + 0.5 * (phi @ mean) / v_f
    partial = {"precision": (phi * new_tau[:, None]).T @ phi, "shift": phi.T @ new_nu,
               "log_z": float(np.log(v_f).sum()), "rows": len(phi)}
    return (new_tau, new_nu), partial


def zero_sites(n_rows):
    return np.zeros(n_rows), np.zeros(n_rows)


def carry_sites(rows, q_state, theta, sites):
    return sites, {"rows": len(rows)}


@pytest.fixture(scope="module")
def client():
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                  dashboard_address="127.0.0.1:0", silence_logs=logging.ERROR,
                                  env={"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
                                       "MKL_NUM_THREADS": "1"}) as cluster, \
            distributed.Client(cluster) as client:
        client.wait_for_workers(2, timeout=60)
        yield client


@pytest.fixture(scope="module")
def problem():
    rng = np.random.default_rng(0)
    phi = rng.normal(size=(N_TINY, M)) / np.sqrt(M)
    a = rng.normal(size=(M, M)) / np.sqrt(M)
    cov = a @ a.T + np.eye(M)
    return phi, (rng.normal(size=M), cov)


@pytest.mark.benchmark(group="one iteration, n = 64, m = 200")
def bench_lapack_dpotrf(record, problem):
    cov = problem[1][1]
    record("lapack dpotrf", lambda: lapack.dpotrf(cov, lower=1), rounds=50)


@pytest.mark.benchmark(group="one iteration, n = 64, m = 200")
def bench_in_process_step(record, problem):
    phi, q = problem
    engine = InProcessEngine(2).load((phi,), zero_sites)
    total = record("in-process step (2 shards)", lambda: engine.step(payload_step, q, None), rounds=50)
    assert total["rows"] == N_TINY


@pytest.mark.benchmark(group="one iteration, n = 64, m = 200")
def bench_dask_step(record, problem, client):
    phi, q = problem
    engine = DaskEngine(client).load((phi,), zero_sites)
    total = record("dask step (2 workers x 1 thread)", lambda: engine.step(payload_step, q, None),
                   rounds=30, warmup=3)
    assert total["rows"] == N_TINY


def carry_q(rows, q_state, theta, sites):
    """A step that only receives q: the cost of a round and of sending q, without arithmetic."""
    return sites, {"rows": len(rows)}


@pytest.mark.benchmark(group="one round, nothing computed")
def bench_dask_round_empty(record, problem, client):
    engine = DaskEngine(client).load((problem[0],), zero_sites)
    record("dask round, nothing sent", lambda: engine.step(carry_q, None, None), rounds=30, warmup=3)


@pytest.mark.benchmark(group="one round, nothing computed")
def bench_dask_round_q(record, problem, client):
    engine = DaskEngine(client).load((problem[0],), zero_sites)
    record("dask round, q (m = 200) sent", lambda: engine.step(carry_q, problem[1], None), rounds=30,
           warmup=3)


@pytest.mark.benchmark(group="sites of n = 200,000 rows")
def bench_sites_stay(record, client):
    """Sites stay on the workers (the engine's choice): an iteration moves no per-row data."""
    engine = DaskEngine(client).load((np.zeros((N_SITES, 1)),), zero_sites)
    record("dask step, sites stay on the workers", lambda: engine.step(carry_sites, None, None), rounds=10)


@pytest.mark.benchmark(group="sites of n = 200,000 rows")
def bench_sites_travel(record, client):
    """The alternative's extra cost: every shard's sites to the master and back out, once per iteration."""
    engine = DaskEngine(client).load((np.zeros((N_SITES, 1)),), zero_sites)
    engine.step(carry_sites, None, None)

    def round_trip():
        sites = engine.sites()
        return client.gather(client.scatter(sites, broadcast=False))

    record("added per iteration: sites gathered, sent back", round_trip, rounds=10)


# -- the sparse classifier's real iteration: speedup and fixed overhead (``python bench/bench_distributed.py``) --

def _seconds_per_iteration(clf):
    """Median time of iterations 2.. (the first also loads the shards onto the workers)."""
    t = [h["seconds"] for h in clf.history_]
    return float(np.median(np.diff(t)))


def _worker_cpu(client):
    """CPU seconds each worker process has used so far (its event loop included)."""
    import time
    return client.run(time.process_time)


def sparse_iteration(client, X, y, m, iters):
    """Batch SEP iterations of SparseGaussianProcessClassifier (θ and Z learnt): wall seconds per
    iteration, and CPU seconds per iteration of the master and (with a client) of each worker."""
    import time

    from gpc import SparseGaussianProcessClassifier
    from gpc.kernels import RBF, ConstantKernel

    Z = X[np.linspace(0, len(y) - 1, m).astype(int)]
    clf = SparseGaussianProcessClassifier(kernel=ConstantKernel(1.0) * RBF(np.full(X.shape[1], 2.0)),
                                          inducing_points=Z, n_inducing=m, max_iter=iters,
                                          progress=False, client=client)
    before = _worker_cpu(client) if client is not None else {}
    cpu = time.process_time()
    clf.fit(X, y)
    cpu = (time.process_time() - cpu) / iters
    workers = ({w: (t - before[w]) / iters for w, t in _worker_cpu(client).items()}
               if client is not None else {})
    return _seconds_per_iteration(clf), cpu, workers


def main(n=200_000, m=M, iters=4, n_tiny=N_TINY, workers=2):
    """In process (1 thread) against ``workers`` workers x 1 thread on 127.0.0.1, batch SEP:
    seconds per iteration at n rows (the speedup) and at n_tiny rows (the fixed overhead); n = 0
    measures the overhead alone.

    On a shared machine the wall-clock figures depend on the load; the CPU seconds do not, and give
    the model: an iteration on K workers takes about max_k (worker k's CPU) + the fixed overhead."""
    import os
    import sys
    import time

    from threadpoolctl import threadpool_limits

    sys.path.insert(0, os.path.dirname(__file__))
    from bench_sparse import make_data

    X, y = make_data(n) if n else (None, None)
    Xt, yt = make_data(n_tiny, seed=3)
    print(f"batch SEP, m = {m}, {iters} iterations (wall: median of iterations 2..{iters}; CPU: mean); "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    with threadpool_limits(1):
        local = sparse_iteration(None, X, y, m, iters) if n else None
        local_tiny = sparse_iteration(None, Xt, yt, m, 12)
        t = time.perf_counter()
        from gpc.distributed import local_cluster
        with local_cluster(workers) as cluster, distributed.Client(cluster) as client:
            client.wait_for_workers(workers, timeout=300)
            print(f"cluster of {workers} up in {time.perf_counter() - t:.1f} s")
            remote_tiny = sparse_iteration(client, Xt, yt, m, 12)   # first, on a fresh cluster
            remote = sparse_iteration(client, X, y, m, iters) if n else None
    runs = [(n_tiny, local_tiny, remote_tiny)] + ([(n, local, remote)] if n else [])
    for rows, (lw, lc, _), (rw, rc, wc) in runs:
        busiest = max(wc.values())
        print(f"n = {rows}: in process {lw:.4f} s/iteration wall, {lc:.4f} s CPU; {workers} workers "
              f"{rw:.4f} s/iteration wall (speedup {lw / rw:.2f}), master CPU {rc:.4f} s, worker CPU "
              f"{', '.join(f'{c:.4f}' for c in wc.values())} s per iteration (busiest / in-process CPU "
              f"{busiest / lc:.2f})")
    print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    import sys as _sys
    _n = int(_sys.argv[1]) if len(_sys.argv) > 1 else 200_000
    main(n=_n)
