"""What every gpc estimator shares (python/gpc/_estimator.py): n_jobs, the base, the layering."""

import ast
import pathlib

import numpy as np
import pytest

from gpc import GaussianProcessClassifier, MultiClassGPC, SparseGaussianProcessClassifier
from gpc._estimator import GPCEstimator, available_cores, resolve_n_jobs

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "python" / "gpc"
ESTIMATORS = [
    lambda **kw: GaussianProcessClassifier(optimizer=None, **kw),
    lambda **kw: SparseGaussianProcessClassifier(n_inducing=4, max_iter=1, progress=False, **kw),
    lambda **kw: MultiClassGPC(optimizer=None, max_iter=20, **kw),
]


def _data():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((30, 2))
    return X, np.where(X[:, 0] + 0.3 * rng.standard_normal(30) > 0, "a", "b")


def test_n_jobs_follows_joblibs_convention(monkeypatch):
    cores = available_cores()
    assert resolve_n_jobs(-1) == cores
    assert resolve_n_jobs(-2) == max(1, cores - 1)
    assert resolve_n_jobs(-cores - 5) == 1
    assert resolve_n_jobs(3) == 3
    for bad in (0, 1.5, True, "2"):
        with pytest.raises(ValueError, match="n_jobs"):
            resolve_n_jobs(bad)


def test_n_jobs_none_is_what_blas_may_use(monkeypatch):
    threadpoolctl = pytest.importorskip("threadpoolctl")
    with threadpoolctl.threadpool_limits(1):
        assert resolve_n_jobs(None) == 1
    # a BLAS threadpoolctl does not know: OMP_NUM_THREADS / OPENBLAS_NUM_THREADS, else every core
    import types

    import gpc._threads as threads
    monkeypatch.setattr(threads, "controller", lambda: types.SimpleNamespace(lib_controllers=[]))
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert resolve_n_jobs(None) == 1
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert resolve_n_jobs(None) == available_cores()


@pytest.mark.parametrize("make", ESTIMATORS, ids=["dense", "sparse", "multiclass"])
def test_every_estimator_takes_n_jobs_alike(make):
    X, y = _data()
    assert "n_jobs" in make().get_params()
    assert make().get_params()["n_jobs"] is None
    with pytest.raises(ValueError, match="n_jobs"):
        make(n_jobs=0).fit(X, y)
    model = make(n_jobs=-2).fit(X, y)
    assert isinstance(model, GPCEstimator)
    assert model.predict(X).shape == (30,)


def _imports(path):
    """The modules a source file imports, relative ones resolved against gpc's package path."""
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    package = list(rel.parts[:-1]) if rel.name != "__init__" else list(rel.parts)
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            out.append(module)
            out += [f"{module}.{alias.name}" for alias in node.names]
    return out


def test_sparse_and_multiclass_do_not_import_the_dense_estimator():
    for folder in ("sparse", "multiclass"):
        for path in (PACKAGE / folder).glob("*.py"):
            assert not any(name.startswith("gpc.classifier") for name in _imports(path)), path


def test_no_library_package_imports_the_experiments():
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE)
        if rel.parts[0] == "experiments" or rel.name == "__main__.py":
            continue
        assert not any(name.startswith("gpc.experiments") for name in _imports(path)), path
