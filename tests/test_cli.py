"""``gpc compare`` and the command line's error messages."""

import json
import subprocess
import sys

import numpy as np
import pytest

from helpers import run_cli


def test_compare_bundled_dataset(tmp_path, capsys):
    out = tmp_path / "r.json"
    png = tmp_path / "r.png"
    code, stdout, _ = run_cli(["compare", "--data", "crabs", "--methods", "laplace", "--likelihood",
                               "probit", "logit", "--folds", "2", "--quiet", "--out", str(out),
                               "--plot", str(png)], capsys)
    assert code == 0
    assert "laplace" in stdout and "test error" in stdout
    recs = json.loads(out.read_text())
    assert {(r["method"], r["likelihood"]) for r in recs} == {("laplace", "probit"), ("laplace", "logit")}
    for r in recs:
        assert r["n_folds"] == 2 and r["n_failed"] == 0
        assert 0.0 <= r["error_mean"] < 0.3
        assert np.isfinite(r["nll_mean"]) and np.isfinite(r["log_evidence_mean"])
    assert png.stat().st_size > 1000


def test_compare_user_csv(tmp_path, capsys):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 2))
    y = np.where(X[:, 0] + 0.3 * rng.normal(size=40) > 0, "yes", "no")
    path = tmp_path / "mine.csv"
    lines = ["a,b,outcome"] + [f"{a:.4f},{b:.4f},{c}" for (a, b), c in zip(X, y)]
    path.write_text("\n".join(lines) + "\n")
    out = tmp_path / "r.json"
    code, stdout, _ = run_cli(["compare", "--csv", str(path), "--label", "outcome", "--methods", "laplace",
                               "--folds", "2", "--quiet", "--out", str(out)], capsys)
    assert code == 0, stdout
    assert "== exact ==" in stdout and "== sparse ==" not in stdout   # a small binary set: exact methods
    rec = json.loads(out.read_text())[0]
    assert rec["dataset"] == str(path) and rec["section"] == "exact" and rec["error_mean"] < 0.35


@pytest.mark.parametrize("argv, message", [
    (["compare", "--csv", "/nonexistent/data.csv", "--label", "y"], "/nonexistent/data.csv"),
    (["compare", "--data", "no_such_set"], "unknown data set 'no_such_set'"),
    (["compare", "--methods", "magic"], "unknown method(s) magic"),
    (["compare", "--likelihood", "cauchit"], "unknown likelihood(s) cauchit"),
    (["compare", "--folds", "1"], "--folds must be at least 2"),
    (["reproduce", "pl-table1", "--datasets", "iris"], "unknown data set 'iris'"),
    (["reproduce", "pl-table1", "--methods", "magic"], "unknown method 'magic'"),
    (["reproduce", "mf-online", "--datasets", "pima"], "unknown data set 'pima'"),
])
def test_errors_are_one_line_messages(argv, message, capsys):
    code, _, err = run_cli(argv, capsys)
    assert code == 2
    assert message in err
    assert "Traceback" not in err


def test_label_column_that_does_not_exist(tmp_path, capsys):
    path = tmp_path / "d.csv"
    path.write_text("a,b,label\n1,2,x\n2,3,y\n3,1,x\n4,0,y\n")
    code, _, err = run_cli(["compare", "--csv", str(path), "--label", "target", "--folds", "2"], capsys)
    assert code == 2
    assert "target" in err and "label" in err      # names the missing column and lists the ones there


def test_unknown_experiment(capsys):
    code, _, err = run_cli(["reproduce", "pl-table9"], capsys)
    assert code == 2 and "pl-table9" in err


def test_module_entry_point(tmp_path):
    """``python -m gpc`` runs from outside the source tree and reports errors with status 2."""
    proc = subprocess.run([sys.executable, "-m", "gpc", "compare", "--data", "no_such_set"],
                          capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 2
    assert "unknown data set" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "gpc", "reproduce", "--help"], capture_output=True,
                          text=True, cwd=tmp_path)
    assert proc.returncode == 0
    for name in ("pl-table1", "pl-figure1", "mf-pima", "mf-online", "nr-bounds"):
        assert name in proc.stdout


def test_compare_subsample(tmp_path, capsys):
    out = tmp_path / "r.json"
    code, stdout, _ = run_cli(["compare", "--data", "banana", "--subsample", "120", "--methods", "laplace",
                               "--folds", "2", "--quiet", "--out", str(out)], capsys)
    assert code == 0 and "subsample" in stdout
    assert json.loads(out.read_text())[0]["error_mean"] < 0.35


@pytest.mark.slow
def test_compare_every_bundled_binary_set(capsys):
    from gpc import datasets

    for name in datasets.available(binary=True):
        extra = ["--subsample", "500"] if name == "banana" else []
        code, stdout, err = run_cli(["compare", "--data", name, "--methods", "laplace", "--folds", "3",
                                     "--quiet", *extra], capsys)
        assert code == 0, (name, err)
        assert "failed" not in stdout, (name, stdout)
