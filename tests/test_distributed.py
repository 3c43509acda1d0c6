"""The distributed engines (SEP §2.3, Fig. 1 right): in-process and Dask give the same fit; a lost worker
is not a failure; a closed client is a clear error."""

import logging
import functools
import os
import signal
import sys
import time

import dask
import dask.array as da
import distributed   # in the test group: CI always runs the cluster tests
import numpy as np
import pytest
from scipy import linalg, special

from gpc.distributed import (DaskEngine, DistributedError, InProcessEngine, add_partials, make_engine,
                             shard_bounds)

M_INDUCING = 15

# Waits for things that must happen (a worker to start, restart or be seen gone; a step to finish)
# are bounded by PATIENCE: long enough that a machine under a load of 10+ on 2 cores does not make
# them fail (a nanny restarting a worker took over 60 s there), short enough that a real hang ends
# the test.  Waits that must *fail* fast keep their own short timeouts.
PATIENCE = 300.0
# distributed's own defaults (30 s to connect, 30 s of silence before a connection counts as dead)
# are what a starved worker process can exceed on such a machine; they are raised for this module.
COMM_TIMEOUTS = {"distributed.comm.timeouts.connect": "120s", "distributed.comm.timeouts.tcp": "120s"}


# -- a real numerical step: parallel EP with probit sites on f_i ≈ φ_iᵀ w, w ~ N(0, I) ------------------
# φ_i = L⁻¹ k_u(x_i) with K_uu = L Lᵀ (whitened inducing values u = L w; SEP §2.1 with the DTC projection).
# q(w) = N(μ, Σ) with Σ⁻¹ = I + Σ_i τ_i φ_i φ_iᵀ and Σ⁻¹μ = Σ_i ν_i φ_i (the master's sum of the shards'
# site products, SEP §2.3).  The partial result is O(m²): (Σ τ φ φᵀ, Σ ν φ, Σ log Z_i, rows).

def features(X, theta):
    lengthscale, Z = theta
    def rbf(A, B):
        d2 = ((A[:, None, :] - B[None, :, :]) ** 2).sum(-1)
        return np.exp(-0.5 * d2 / lengthscale ** 2)
    L = linalg.cholesky(rbf(Z, Z) + 1e-6 * np.eye(len(Z)), lower=True)
    return linalg.solve_triangular(L, rbf(Z, X), lower=True).T          # n × m


def ep_step(X, y, q_state, theta, sites):
    """One damped (0.5) parallel EP update of the shard's probit sites against q (R&W eq. (3.58)-(3.59))."""
    mean, cov = q_state
    tau, nu = sites
    phi = features(X, theta)
    m_f = phi @ mean
    v_f = np.einsum("ij,jk,ik->i", phi, cov, phi)
    tau_cav = 1.0 / v_f - tau                                   # cavity, natural parameters
    nu_cav = m_f / v_f - nu
    ok = tau_cav > 0
    var_cav = np.where(ok, 1.0 / np.where(ok, tau_cav, 1.0), 1.0)
    mu_cav = nu_cav * var_cav
    z = y * mu_cav / np.sqrt(1.0 + var_cav)
    log_z = special.log_ndtr(z)
    ratio = np.exp(-0.5 * z ** 2 - log_z) / np.sqrt(2 * np.pi)   # N(z) / Φ(z)
    mu_hat = mu_cav + y * var_cav * ratio / np.sqrt(1.0 + var_cav)
    var_hat = var_cav - var_cav ** 2 * ratio * (z + ratio) / (1.0 + var_cav)
    new_tau = np.where(ok, 0.5 * tau + 0.5 * (1.0 / var_hat - tau_cav), tau)
    new_nu = np.where(ok, 0.5 * nu + 0.5 * (mu_hat / var_hat - nu_cav), nu)
    partial = {"precision": (phi * new_tau[:, None]).T @ phi, "shift": phi.T @ new_nu,
               "log_z": float(log_z[ok].sum()), "rows": len(y)}
    return (new_tau, new_nu), partial


def zero_sites(n_rows):
    return np.zeros(n_rows), np.zeros(n_rows)


def q_from(total):
    precision = np.eye(M_INDUCING) + total["precision"]
    cov = linalg.cho_solve(linalg.cho_factor(precision), np.eye(M_INDUCING))
    return cov @ total["shift"], cov


def fit(engine, X, y, n_iter=5, after_step=None, step=lambda it: ep_step):
    """``n_iter`` EP iterations on ``engine`` (``step(it)`` gives iteration it's step); q, the last total and the sites."""
    theta = (1.0, np.asarray(X[:: len(X) // M_INDUCING][:M_INDUCING]))   # NumPy also for a Dask X
    engine.load((X, y), zero_sites)
    q = (np.zeros(M_INDUCING), np.eye(M_INDUCING))
    for it in range(n_iter):
        total = engine.step(step(it), q, theta)
        # every row of the data is counted at every step, by the engine and by the step itself
        assert engine.rows_counted == total["rows"] == len(y)
        q = q_from(total)
        if after_step is not None:
            after_step(it)
    return q, total, engine.sites()


def toy(n=600, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 2))
    y = np.where(np.sin(2 * X[:, 0]) + X[:, 1] + 0.3 * rng.normal(size=n) > 0, 1.0, -1.0)
    return X, y


def assert_same_fit(a, b, atol):
    (mean_a, cov_a), total_a, sites_a = a
    (mean_b, cov_b), total_b, sites_b = b
    np.testing.assert_allclose(mean_a, mean_b, rtol=0, atol=atol)
    np.testing.assert_allclose(cov_a, cov_b, rtol=0, atol=atol)
    np.testing.assert_allclose(total_a["log_z"], total_b["log_z"], rtol=0, atol=atol)
    assert len(sites_a) == len(sites_b)
    for (tau_a, nu_a), (tau_b, nu_b) in zip(sites_a, sites_b):
        np.testing.assert_allclose(tau_a, tau_b, rtol=0, atol=atol)
        np.testing.assert_allclose(nu_a, nu_b, rtol=0, atol=atol)


# -- the engine's pieces, no cluster -------------------------------------------------------------------

def test_shard_bounds_cover_rows_once():
    bounds = shard_bounds(10, 3)
    assert list(bounds) == [0, 4, 7, 10]
    with pytest.raises(ValueError, match="non-empty shards"):
        shard_bounds(2, 3)
    with pytest.raises(ValueError, match="at least 1"):
        shard_bounds(5, 0)


def test_partials_are_added_leaf_by_leaf_in_order():
    parts = [{"a": np.array([1.0, 2.0]), "b": (1, 2.5)}, {"a": np.array([3.0, 4.0]), "b": (2, 0.5)}]
    total = add_partials(parts)
    np.testing.assert_array_equal(total["a"], [4.0, 6.0])
    assert total["b"] == (3, 3.0)
    with pytest.raises(TypeError, match="same keys"):
        add_partials([{"a": 1}, {"b": 1}])
    with pytest.raises(ValueError, match="no partial"):
        add_partials([])


def test_in_process_shards_change_only_rounding():
    """One shard or four: the same EP fit up to the order of the sums (rounding, ~1e-13 at n = 600)."""
    X, y = toy()
    assert_same_fit(fit(InProcessEngine(1), X, y), _merged(fit(InProcessEngine(4), X, y)), atol=1e-10)


def _merged(result):
    q, total, sites = result
    return q, total, [tuple(np.concatenate(parts) for parts in zip(*sites))]


def test_mismatched_rows_are_rejected():
    with pytest.raises(ValueError, match="same number of rows"):
        InProcessEngine(2).load((np.zeros((5, 2)), np.zeros(4)), zero_sites)
    with pytest.raises(RuntimeError, match="load"):
        InProcessEngine(2).step(ep_step, None, None)
    engine = InProcessEngine(2).load((np.zeros((4, 2)), np.zeros(4)), zero_sites)
    with pytest.raises(ValueError, match="shard_args has 1 entries for 2 shards"):
        engine.step(ep_step, None, None, shard_args=[(0, 1)])


def test_client_without_dask_names_the_extra(monkeypatch):
    for name in ["distributed", "dask.array"]:
        monkeypatch.setitem(sys.modules, name, None)  # import of these now raises ImportError
    with pytest.raises(ImportError, match=r'pip install "gpc\[distributed\]"'):
        make_engine(client=object())
    assert isinstance(make_engine(), InProcessEngine)  # no client: no dask needed


# -- on a LocalCluster (2 worker processes x 1 thread, loopback) -----------------------------------------



@pytest.fixture(scope="module")
def cluster():
    with dask.config.set(COMM_TIMEOUTS), \
            distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                     dashboard_address="127.0.0.1:0", silence_logs=logging.ERROR) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def client(cluster):
    with dask.config.set(COMM_TIMEOUTS), distributed.Client(cluster, timeout=PATIENCE) as client:
        client.wait_for_workers(2, timeout=PATIENCE)
        yield client


@pytest.fixture
def victims():
    """A client on a fresh cluster of 2 workers for a test that kills one.  The killed worker's nanny
    restarts it, but on a loaded machine such a restart has been seen to fail (the new worker closed
    seconds after it registered), so no test waits for it: the fit goes on with the survivor."""
    with dask.config.set(COMM_TIMEOUTS), \
            distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                     dashboard_address="127.0.0.1:0", silence_logs=logging.ERROR) as cluster, \
            distributed.Client(cluster, timeout=PATIENCE) as client:
        client.wait_for_workers(2, timeout=PATIENCE)
        yield client


@pytest.mark.parametrize("engine_kind", ["in-process", "dask"])
def test_revert_gives_back_the_sites_before_the_last_step(client, engine_kind):
    """After a rejected step the shards carry on from their earlier sites: step, step, revert, step equals
    step, step (the same step from the same sites and q, so equal to rounding; 1e-12)."""
    X, y = toy(n=200)
    theta = (1.0, X[:M_INDUCING])
    q0 = (np.zeros(M_INDUCING), np.eye(M_INDUCING))
    runs = []
    for reverted in (False, True):
        engine = InProcessEngine(2) if engine_kind == "in-process" else DaskEngine(client, n_shards=2,
                                                                                    timeout=PATIENCE)
        engine.load((X, y), zero_sites)
        with pytest.raises(RuntimeError, match="revert"):
            engine.revert()
        q1 = q_from(engine.step(ep_step, q0, theta))
        if reverted:
            engine.step(ep_step, (np.ones(M_INDUCING), np.eye(M_INDUCING)), theta)   # a step to reject
            engine.revert()
            with pytest.raises(RuntimeError, match="revert"):
                engine.revert()   # one step back only
        total = engine.step(ep_step, q1, theta)
        runs.append((q_from(total), total, engine.sites()))
    assert_same_fit(runs[0], runs[1], atol=1e-12)


def test_bad_engine_arguments_are_named(client):
    with pytest.raises(TypeError, match="dask.distributed.Client"):
        make_engine(client="tcp://127.0.0.1:8786")
    with pytest.raises(ValueError, match="timeout"):
        DaskEngine(client, timeout=0)
    with pytest.raises(ValueError, match="n_shards"):
        DaskEngine(client, n_shards=0)
    with pytest.raises(RuntimeError, match="load"):
        DaskEngine(client).step(ep_step, None, None)
    with pytest.raises(TypeError, match="tuple of arrays"):
        DaskEngine(client).load(np.zeros((4, 2)), zero_sites)


def test_dask_equals_in_process(client):
    """5 EP iterations, 2 shards: the same q, log Z and sites to 1e-10 (the same float operations on the same
    shards and the same shard-order sums; only BLAS's choice of kernel could differ, ~1e-15)."""
    X, y = toy()
    client.wait_for_workers(2, timeout=PATIENCE)   # one shard per worker: both must be up
    engine = make_engine(client, timeout=PATIENCE)
    distributed_fit = fit(engine, X, y)
    assert len(engine.bounds) == 3   # one shard per worker
    assert_same_fit(distributed_fit, fit(InProcessEngine(2), X, y), atol=1e-10)


def test_dask_array_keeps_its_chunks(client):
    X, y = toy(n=300)
    Xd, yd = da.from_array(X, chunks=(100, 1)), da.from_array(y, chunks=100)
    engine = DaskEngine(client, timeout=PATIENCE)
    result = fit(engine, Xd, yd, n_iter=3)
    assert list(engine.bounds) == [0, 100, 200, 300]
    assert_same_fit(result, fit(InProcessEngine(), Xd, yd, n_iter=3), atol=1e-10)


def crash_once_step(marker, *args):
    """EP's step, except that the first shard to run it writes its worker's address to ``marker`` and its
    process dies in the middle of the task (O_EXCL: exactly one shard, once; the rerun goes through)."""
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return ep_step(*args)
    os.write(fd, distributed.get_worker().address.encode())
    os.close(fd)
    os._exit(1)


@pytest.mark.parametrize("when", ["between steps", "during a step"])
def test_killed_worker_is_not_a_failure(victims, caplog, tmp_path, when):
    """A worker process dies after step 2 of 6, or inside its call of step 3: its shard is rebuilt on a live
    worker from its rows and the replay log, every row is counted at every step, and the fit equals an
    undisturbed one (a reset of the sites would be off by ~4e-2 here)."""
    client = victims
    X, y = toy(seed=1)
    engine = DaskEngine(client, n_shards=2, timeout=PATIENCE)
    marker = tmp_path / "killed"
    killed = []

    def step_at(it):
        return functools.partial(crash_once_step, str(marker)) if it == 2 and when == "during a step" else ep_step

    def after_step(it):
        if it == 1 and when == "between steps":
            victim = engine._addresses[0]
            # SIGKILL from this process: certain and at once, with no message to deliver through a loaded
            # scheduler first; no cleanup, no goodbye, as when a machine is lost
            pid = client.run(os.getpid, workers=[victim])[victim]
            os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + PATIENCE   # wait until the scheduler has seen it go (bounded)
            while victim in client.scheduler_info(n_workers=-1)["workers"] and time.monotonic() < deadline:
                time.sleep(0.05)
            killed.append(victim)
        elif it == 2 and when == "during a step":
            killed.append(marker.read_text())

    with caplog.at_level(logging.WARNING, logger="gpc.distributed"):
        disturbed = fit(engine, X, y, n_iter=6, after_step=after_step, step=step_at)
    assert killed[0] not in client.scheduler_info(n_workers=-1)["workers"]
    assert any("was lost" in r.getMessage() and killed[0] in r.getMessage() for r in caplog.records)
    assert_same_fit(disturbed, fit(InProcessEngine(2), X, y, n_iter=6), atol=1e-10)


async def _reset_connection(client):
    client.scheduler_comm.comm.abort()   # the TCP stream to the scheduler breaks; the client reconnects


@pytest.mark.parametrize("broken, message", [("closed", "closed"), ("reset", "connection")])
def test_lost_connection_is_a_clear_error(cluster, broken, message):
    """The client is closed, or its connection to the scheduler breaks mid-fit (the scheduler then cancels
    the client's tasks, shards and sites with them): the next step says so at once instead of waiting."""
    X, y = toy(n=200)
    with dask.config.set(COMM_TIMEOUTS), distributed.Client(cluster, timeout=PATIENCE) as other:
        engine = DaskEngine(other, timeout=PATIENCE)       # loading and a first step must succeed
        engine.load((X, y), zero_sites)
        q = (np.zeros(M_INDUCING), np.eye(M_INDUCING))
        theta = (1.0, X[:M_INDUCING])
        engine.step(ep_step, q, theta)
        engine.timeout = 60.0     # the broken step must end well before PATIENCE
        if broken == "closed":
            other.close()
        else:
            other.sync(_reset_connection, other)
        start = time.monotonic()
        with pytest.raises(DistributedError, match=message):
            engine.step(ep_step, q, theta)
        assert time.monotonic() - start < 60   # no hang: inside the engine's timeout


def test_unanswered_step_times_out(client):
    """A step the cluster cannot finish in time (here a task that sleeps past the engine's timeout; a silent
    scheduler looks the same to the client) raises within the timeout instead of hanging."""
    X, y = toy(n=200)
    engine = DaskEngine(client, timeout=PATIENCE)   # loading may be slow on a loaded machine: not tested here
    engine.load((X, y), zero_sites)
    engine.timeout = 1.0
    start = time.monotonic()
    with pytest.raises(DistributedError, match="did not finish within 1 s"):
        engine.step(sleeping_step, None, None)
    assert time.monotonic() - start < 30   # the 1 s timeout, plus slack for a loaded machine


def sleeping_step(X, y, q_state, theta, sites):
    time.sleep(3)
    return sites, {"rows": len(y)}


# -- the sparse classifier on the cluster (SparseGaussianProcessClassifier(client=...)) -------------------

def _sparse_problem(n_classes):
    from gpc.datasets import load
    X, y = (load("australian", return_X_y=True) if n_classes == 2
            else load("glass", return_X_y=True, binary=False))
    return (X - X.mean(0)) / X.std(0), y


@pytest.mark.parametrize("n_classes", [2, 6])
def test_sparse_classifier_on_the_cluster_equals_in_process(client, n_classes):
    """5 batch SEP iterations with θ and Z learnt: sites, hyperparameters, inducing points and log Z agree
    with the in-process fit to 1e-10.  Both run the same passes on the same rows; only the grouping of the
    sums differs (2 shards against one block), which moves the results by ~1e-14 here (measured)."""
    from gpc import SparseGaussianProcessClassifier

    X, y = _sparse_problem(n_classes)
    kw = dict(n_inducing=8, max_iter=5, random_state=0, progress=False)
    local = SparseGaussianProcessClassifier(**kw).fit(X, y)
    remote = SparseGaussianProcessClassifier(client=client, **kw).fit(X, y)
    assert len(local._problems) == len(remote._problems) == (1 if n_classes == 2 else n_classes)
    for (a, _), (b, _) in zip(local._problems, remote._problems):
        a, b = a.state, b.state
        np.testing.assert_allclose(b.tau, a.tau, rtol=0, atol=1e-10)     # gathered from the workers
        np.testing.assert_allclose(b.nu, a.nu, rtol=0, atol=1e-10)
        np.testing.assert_allclose(b.kernel.theta, a.kernel.theta, rtol=0, atol=1e-10)
        np.testing.assert_allclose(b.Z, a.Z, rtol=0, atol=1e-10)
    assert remote.log_marginal_likelihood_value_ == pytest.approx(local.log_marginal_likelihood_value_,
                                                                  rel=0, abs=1e-10)
    assert [h["iteration"] for h in remote.history_] == list(range(1, 6))
    assert remote.history_[-1]["objective"] > remote.history_[0]["objective"]   # the steps did learn
    # the sites came home, and a pickled model drops its connection: the copy continues in process
    # from where the cluster stopped
    import pickle
    remote = pickle.loads(pickle.dumps(remote))
    assert remote.client is None
    remote.partial_fit(X, y)
    local.partial_fit(X, y)
    np.testing.assert_allclose(remote.predict_proba(X), local.predict_proba(X), rtol=0, atol=1e-9)


def test_sparse_classifier_takes_a_dask_array_in_its_chunks(client):
    """A Dask X on the cluster (one shard per row chunk, three chunks on two workers): the fit equals the
    in-process fit of the same array (1e-10, as above)."""
    from gpc import SparseGaussianProcessClassifier

    X, y = _sparse_problem(2)
    Xd = da.from_array(X, chunks=(250, X.shape[1]))
    kw = dict(n_inducing=6, max_iter=3, random_state=1, progress=False)
    local = SparseGaussianProcessClassifier(**kw).fit(Xd, y)
    remote = SparseGaussianProcessClassifier(client=client, **kw).fit(Xd, y)
    a, b = local._problems[0][0].state, remote._problems[0][0].state
    np.testing.assert_allclose(b.tau, a.tau, rtol=0, atol=1e-10)
    np.testing.assert_allclose(b.Z, a.Z, rtol=0, atol=1e-10)
    assert remote.log_marginal_likelihood_value_ == pytest.approx(local.log_marginal_likelihood_value_,
                                                                  rel=0, abs=1e-10)


def test_sparse_classifier_clones_share_the_client(client):
    from sklearn.base import clone

    from gpc import SparseGaussianProcessClassifier

    estimator = SparseGaussianProcessClassifier(client=client, n_inducing=7, kernel=_amplitude_rbf())
    twin = clone(estimator)
    assert twin.client is client and twin.n_inducing == 7
    assert twin.kernel is not estimator.kernel and twin.kernel.get_params() == estimator.kernel.get_params()


def _amplitude_rbf():
    from gpc.kernels import RBF, ConstantKernel
    return ConstantKernel(2.0) * RBF(1.5)


# Every mode but GFITC runs on the engine.  (kwargs, label); each mode's state is compared field by field.
MODES = [
    (dict(batch_size=100), "SEP minibatch"),
    (dict(tied_sites=True, batch_size=100), "SEP tied sites"),
    (dict(method="svi"), "SVI batch (L-BFGS-B)"),
    (dict(method="svi", batch_size=100), "SVI minibatch"),
]


def assert_same_state(a, b, atol):
    """Two fitted sparse classifiers have the same state: sites (SEP), q, hyperparameters, Z, log Z."""
    assert len(a._problems) == len(b._problems)
    for (x, _), (z, _) in zip(a._problems, b._problems):
        x, z = x.state, z.state
        for name in ("tau", "nu", "mean", "Lq", "Z"):
            if getattr(x, name, None) is not None:
                np.testing.assert_allclose(getattr(z, name), getattr(x, name), rtol=0, atol=atol, err_msg=name)
        if hasattr(x.q, "h"):                                   # SEP's q by its natural parameters
            np.testing.assert_allclose(z.q.P, x.q.P, rtol=0, atol=atol, err_msg="P")
            np.testing.assert_allclose(z.q.h, x.q.h, rtol=0, atol=atol, err_msg="h")
        np.testing.assert_allclose(z.kernel.theta, x.kernel.theta, rtol=0, atol=atol, err_msg="theta")
    assert b.log_marginal_likelihood_value_ == pytest.approx(a.log_marginal_likelihood_value_, rel=0, abs=atol)
    assert [h["iteration"] for h in a.history_] == [h["iteration"] for h in b.history_]


@pytest.mark.parametrize("n_classes", [2, 6])
@pytest.mark.parametrize("params, mode", MODES, ids=[label for _, label in MODES])
def test_sparse_modes_on_the_cluster_equal_in_process(client, params, mode, n_classes):
    """5 epochs of each mode with θ and Z learnt, on 2 workers, equal the same fit in process to 1e-10.

    A minibatch on the cluster is every shard's share (``minibatch_plan``), so the in-process fit with the
    same shards is ``client=InProcessEngine(2)``: it must agree with the cluster to rounding (both add the
    same per-shard sums in shard order; measured 0 here).  With one shard that plan is the in-process
    estimator's own (blocks of ``batch_size`` rows in the same seeded order): ``InProcessEngine(1)`` must
    agree with ``client=None`` to rounding (measured ≤ 3.2e-12 after 5 epochs, in entries of q's P of up to
    171: a minibatch's swap of sites is summed on the shard and then added to q, where in process it is
    added into q's P directly; 0 for tied sites and SVI).  Batch SVI has no minibatches: there the cluster
    also equals ``client=None``."""
    from gpc import SparseGaussianProcessClassifier

    X, y = _sparse_problem(n_classes)
    kw = dict(n_inducing=8, max_iter=5, random_state=0, progress=False, **params)
    client.wait_for_workers(2, timeout=PATIENCE)   # one shard per worker: both must be up
    remote = SparseGaussianProcessClassifier(client=client, **kw).fit(X, y)
    assert_same_state(SparseGaussianProcessClassifier(client=InProcessEngine(2), **kw).fit(X, y), remote,
                      atol=1e-10)
    local = SparseGaussianProcessClassifier(**kw).fit(X, y)
    assert_same_state(local, SparseGaussianProcessClassifier(client=InProcessEngine(1), **kw).fit(X, y),
                      atol=1e-10)
    if "batch_size" not in params:
        assert_same_state(local, remote, atol=1e-10)
    assert remote.history_[-1]["objective"] > remote.history_[0]["objective"]   # the steps did learn


def _killing_engine(client, kill_before_step, killed, **options):
    """A DaskEngine that SIGKILLs the worker of shard 0 just before its step ``kill_before_step``."""
    engine = DaskEngine(client, n_shards=2, timeout=PATIENCE, **options)
    step = engine.step

    def killing_step(*args, **kwargs):
        if engine.n_steps == kill_before_step:
            victim = engine._addresses[0]
            pid = client.run(os.getpid, workers=[victim])[victim]
            os.kill(pid, signal.SIGKILL)       # certain and at once, no goodbye: as when a machine is lost
            killed.append(victim)
        return step(*args, **kwargs)

    engine.step = killing_step
    return engine


@pytest.mark.parametrize("params, budget", [
    (dict(batch_size=100), 1),                       # a checkpoint after every site step: rebuilt from it
    (dict(batch_size=100), None),                    # no checkpoint: the whole log replayed
    (dict(tied_sites=True, batch_size=100), None),
    (dict(method="svi", batch_size=100), None),      # no sites: the shard is rebuilt from its rows alone
], ids=["SEP minibatch, checkpoints", "SEP minibatch", "SEP tied sites", "SVI minibatch"])
def test_sparse_fit_survives_a_killed_worker(victims, caplog, params, budget):
    """A worker killed in the middle of a minibatch fit (before its 11th round of shard calls):
    the shard is rebuilt on a live worker with its sites recovered, every row is counted at every step (the
    engine checks), the log says what happened, and the fit equals an undisturbed one to 1e-10."""
    from gpc import SparseGaussianProcessClassifier

    client = victims
    X, y = _sparse_problem(2)
    kw = dict(n_inducing=8, max_iter=3, random_state=0, progress=False, **params)
    killed = []
    options = {} if budget is None else dict(replay_budget=budget)
    engine = _killing_engine(client, 10, killed, **options)
    with caplog.at_level(logging.WARNING, logger="gpc.distributed"):
        disturbed = SparseGaussianProcessClassifier(client=engine, **kw).fit(X, y)
    assert killed and any("was lost" in r.getMessage() and killed[0] in r.getMessage() and
                          "recovered exactly" in r.getMessage() for r in caplog.records)
    assert engine.recoveries == 1
    assert_same_state(SparseGaussianProcessClassifier(client=InProcessEngine(2), **kw).fit(X, y), disturbed,
                      atol=1e-10)


def test_revert_after_a_checkpoint_then_a_lost_worker(victims, caplog):
    """Checkpoints after every step (replay budget 1 byte), a step rejected, then a worker killed: the
    rebuilt shard starts from the checkpoint (the sites before the rejected step) and the fit equals the
    in-process one (1e-10)."""
    client = victims
    X, y = toy(n=300)
    theta = (1.0, X[:M_INDUCING])
    runs = []
    for engine in (InProcessEngine(2), DaskEngine(client, n_shards=2, timeout=PATIENCE, replay_budget=1)):
        engine.load((X, y), zero_sites)
        q = q_from(engine.step(ep_step, (np.zeros(M_INDUCING), np.eye(M_INDUCING)), theta))
        q = q_from(engine.step(ep_step, q, theta))
        engine.step(ep_step, (np.ones(M_INDUCING), np.eye(M_INDUCING)), theta)     # a step to reject
        engine.revert()
        if isinstance(engine, DaskEngine):
            victim = engine._addresses[1]
            os.kill(client.run(os.getpid, workers=[victim])[victim], signal.SIGKILL)
        with caplog.at_level(logging.WARNING, logger="gpc.distributed"):
            total = engine.step(ep_step, q, theta)
        runs.append((q_from(total), total, engine.sites()))
    assert engine.recoveries == 1
    assert_same_fit(runs[0], runs[1], atol=1e-10)


def test_gfitc_does_not_distribute_and_says_why(client):
    from gpc import SparseGaussianProcessClassifier

    X, y = _sparse_problem(2)
    with pytest.raises(ValueError, match="not a sum over the data"):
        SparseGaussianProcessClassifier(client=client, method="gfitc", n_inducing=5, max_iter=1,
                                        progress=False).fit(X, y)


class _KeptEngine(InProcessEngine):
    """An in-process engine whose shards outlive the fit, for a look at what they hold."""

    def close(self):
        pass


def test_shards_keep_the_directions_of_their_rows():
    """Minibatch SEP on 2 shards, 3 epochs: each shard's sites and directions V give the master's q,
    P = I + Σ τ_i a'_i a'_iᵀ and h = Σ ν_i a'_i with a'_i = Lᵀv_i (V in float32: relative 1e-5 is its
    rounding, as in process), while the master holds no V and the sites come home."""
    from gpc import SparseGaussianProcessClassifier

    X, y = _sparse_problem(2)
    engine = _KeptEngine(2)
    clf = SparseGaussianProcessClassifier(n_inducing=8, max_iter=3, batch_size=100, random_state=0,
                                          progress=False, client=engine).fit(X, y)
    state = clf._problems[0][0].state
    assert state.V is None
    shards = [sites[0].settled() for sites in engine.sites()]
    V = np.concatenate([s.V for s in shards]).astype(np.float64)
    tau, nu = (np.concatenate(parts) for parts in zip(*(s.rows() for s in shards)))
    np.testing.assert_array_equal(tau, state.tau)
    np.testing.assert_array_equal(nu, state.nu)
    A_old = V @ state.factor.L
    P = np.eye(state.factor.m) + (A_old.T * tau) @ A_old
    np.testing.assert_allclose(state.q.P, P, rtol=1e-5, atol=1e-5 * np.abs(P).max())
    h = A_old.T @ nu
    np.testing.assert_allclose(state.q.h, h, rtol=1e-5, atol=1e-5 * np.abs(h).max())


def test_a_reverted_minibatch_leaves_the_shards_as_before():
    """Minibatch 0 swapped in, minibatch 1 swapped in and reverted, then swapped in again: the same
    sites, directions and q as without the revert (the same arithmetic from the same sites: exact)."""
    from gpc.likelihoods import get_likelihood
    from gpc.sparse._distributed import DistributedFit
    from gpc.sparse._train import SEPState
    from gpc.sparse.core.natural import NaturalPosterior

    X, y = _sparse_problem(2)
    y = np.where(y == np.unique(y)[1], 1.0, -1.0)
    lik = get_likelihood("probit")
    runs = []
    for reverted in (False, True):
        state = SEPState(_amplitude_rbf(), X[::60].copy(), len(y), 1e-8, True, 1.0)
        fit = DistributedFit(_KeptEngine(2), X, [y], [state])
        plan = fit.plan(100)
        for j in (0, 1):
            rows = fit.rows(0, lik, 100, plan[j])
            (P, h), _ = rows.swap_sites(1.0)
            if j == 1 and reverted:
                rows.revert()
                rows = fit.rows(0, lik, 100, plan[j])
                (P, h), _ = rows.swap_sites(1.0)
            state.q = NaturalPosterior(P, h)
            rows.commit()
        shards = [sites[0].settled() for sites in fit.engine.sites()]
        runs.append((P, h, [(s.tau, s.nu, s.V) for s in shards]))
    np.testing.assert_array_equal(runs[0][0], runs[1][0])
    np.testing.assert_array_equal(runs[0][1], runs[1][1])
    for a, b in zip(runs[0][2], runs[1][2]):
        for x, z in zip(a, b):
            np.testing.assert_array_equal(x, z)
    assert np.count_nonzero(runs[1][2][0][0]) > 0        # the shard's sites did move


def test_minibatch_plan_gives_every_shard_its_share():
    from gpc.sparse._distributed import minibatch_plan

    # without a generator the shards' rows in order (each epoch of a fit draws a permutation:
    # tests/test_sparse_minibatches.py)
    one = minibatch_plan([0, 10], 4)          # one shard: blocks of b rows
    assert [[rows.tolist() for rows in batch] for batch in one] == [[[0, 1, 2, 3]], [[4, 5, 6, 7]],
                                                                   [[8, 9]]]
    plan = minibatch_plan([0, 50, 80], 20)    # blocks of 13 and 8 rows: 4 minibatches of about 20
    assert [[len(rows) for rows in batch] for batch in plan] == [[13, 8], [13, 8], [13, 8], [11, 6]]
    plan = minibatch_plan([0, 97, 100], 10)   # blocks of 10 and 1 rows: the small shard runs out first
    assert len(plan) == 10 and plan[2][1].tolist() == [2] and len(plan[3][1]) == 0
    assert sum(len(rows) for batch in plan for rows in batch) == 100


DOCS = os.path.join(os.path.dirname(__file__), os.pardir, "docs", "distributed.md")


def _doc_snippets():
    """The python blocks of docs/distributed.md that start a LocalCluster."""
    import re

    with open(DOCS, encoding="utf-8") as f:
        text = f.read()
    return [block for block in re.findall(r"```python\n(.*?)```", text, re.S) if "LocalCluster(" in block]


@pytest.mark.parametrize("index", range(2))
def test_docs_snippets_run_on_a_local_cluster(tmp_path, index):
    """The guide's snippets for an existing cluster run as written, on a LocalCluster bound to 127.0.0.1."""
    import subprocess

    snippets = _doc_snippets()
    assert len(snippets) == 2 and all('host="127.0.0.1"' in s for s in snippets)
    script = tmp_path / "snippet.py"
    script.write_text(snippets[index])
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=PATIENCE,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip()


def test_sparse_classifier_without_dask_names_the_extra(monkeypatch):
    from gpc import SparseGaussianProcessClassifier

    X, y = _sparse_problem(2)
    for name in ["distributed", "dask.array"]:
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(ImportError, match=r'pip install "gpc\[distributed\]"'):
        SparseGaussianProcessClassifier(client=object(), n_inducing=5, max_iter=1, progress=False).fit(X, y)


@pytest.mark.parametrize("extra", [[], ["--batch-size", "40"]], ids=["batch", "minibatch"])
def test_command_line_fits_on_a_running_scheduler(cluster, capsys, extra):
    """``gpc sep-distributed --scheduler ADDRESS``: one fit in process and one on the cluster.  In batch, the
    same model (log Z and test error printed alike to the digits shown); minibatches differ between the
    two (each worker takes its share of every minibatch), so there both rows are only checked to exist."""
    from gpc.__main__ import main

    main(["sep-distributed", "--scheduler", cluster.scheduler_address, "--data", "crabs", "--n-inducing",
          "5", "--max-iter", "3", *extra])
    lines = capsys.readouterr().out.splitlines()
    rows = {line.split()[0]: line.split()[-3:] for line in lines if line.startswith(("in process", "scheduler"))}
    assert set(rows) == {"in", "scheduler"}
    if not extra:
        assert rows["in"][0] == rows["scheduler"][0] and rows["in"][2] == rows["scheduler"][2]  # error, log Z
    else:
        assert "minibatches of 40" in lines[0] and 0 <= float(rows["scheduler"][0]) <= 1


def test_command_line_rejects_bad_counts(capsys):
    from gpc.__main__ import main

    with pytest.raises(SystemExit) as exit_:
        main(["sep-distributed", "--dask-workers", "0"])
    assert exit_.value.code == 2
    assert "--dask-workers must be at least 1" in capsys.readouterr().err


CTRL_C_SCRIPT = r"""
import logging, os, signal, sys, time, warnings
import numpy as np
from distributed import Client, LocalCluster
from gpc import SparseGaussianProcessClassifier


def main():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((2000, 4))
    y = np.where(np.sin(X[:, 0]) + X[:, 1] * X[:, 2] > 0, 1, 0)
    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                           dashboard_address="127.0.0.1:0", silence_logs=logging.CRITICAL)
    client = Client(cluster)
    clf = SparseGaussianProcessClassifier(n_inducing=20, max_iter=100000, progress=False, verbose=True,
                                          random_state=0, client=client)

    def late(signum, frame):
        # the master often sits in compiled code when the Ctrl-C lands and sees it only later,
        # when its workers (same process group) are gone already: that case, made certain
        time.sleep(2.0)
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, late)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            clf.fit(X, y)
            print("returned", time.monotonic(), flush=True)
        except Exception as exc:
            print("raised", time.monotonic(), type(exc).__name__, exc, flush=True)
    print("warned", " | ".join(str(w.message) for w in caught if "interrupted" in str(w.message)), flush=True)
    p = clf.predict_proba(X[:50])
    print("usable", bool(np.all(np.isfinite(p))), len(clf.history_), flush=True)
    os._exit(0)


if __name__ == "__main__":    # the workers' processes import this file too
    main()
"""


def test_ctrl_c_on_a_fit_whose_cluster_shares_its_process_group(tmp_path):
    """Ctrl-C in a terminal reaches the whole process group: the fit and a LocalCluster's workers
    started from it.  The fit must come back within seconds with the model of its last completed
    step (or a clear error), not wait for the dead workers' shards to be rebuilt (300 s)."""
    import select
    import signal
    import subprocess

    script = tmp_path / "fit.py"
    script.write_text(CTRL_C_SCRIPT)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        lines, started = [], time.monotonic()
        while time.monotonic() - started < PATIENCE:       # until the fit has run an epoch
            ready, _, _ = select.select([proc.stdout], [], [], 5.0)
            line = proc.stdout.readline() if ready else ""
            lines.append(line)
            if line.startswith("iteration=") or proc.poll() is not None:
                break
        assert any(line.startswith("iteration=") for line in lines), lines[-5:]
        sent = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)
        out, _ = proc.communicate(timeout=PATIENCE)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    ends = [line.split() for line in out.splitlines() if line.startswith(("returned", "raised"))]
    assert ends, out[-2000:]
    # within 30 s of the Ctrl-C (2 s until the master sees it, then at most 10 s for the sites; a
    # rebuild of the dead workers' shards would wait PATIENCE)
    assert float(ends[0][1]) - sent < 30.0, out[-2000:]
    assert ends[0][0] == "returned", out[-2000:]
    warned = [line for line in out.splitlines() if line.startswith("warned")]
    assert warned and "interrupted" in warned[0], out[-2000:]
    usable = [line.split() for line in out.splitlines() if line.startswith("usable")]
    assert usable and usable[0][1] == "True" and int(usable[0][2]) >= 1, out[-2000:]
