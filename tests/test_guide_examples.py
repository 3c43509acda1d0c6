"""The code blocks of the user guide (docs/guide/*.rst) run as written.

Each page's ``.. code-block:: python`` blocks run in order, with warnings as errors (a documented
example runs without any), in one namespace that holds the names
the guide leaves to the reader: ``X``, ``y`` (300 rows of banana), ``X_val``, ``y_val``,
``X_test`` and ``K`` (a kernel matrix of ``X``).  The cluster of the scaling-up page is a
LocalCluster on 127.0.0.1 that the block itself starts and closes.
"""

import pathlib
import textwrap
import warnings

import numpy as np
import pytest

GUIDE = pathlib.Path(__file__).resolve().parents[1] / "docs" / "guide"
PAGES = sorted(p.name for p in GUIDE.glob("*.rst"))


def code_blocks(text):
    """The python code blocks of an rst page, dedented, in page order."""
    lines, blocks, i = text.splitlines(), [], 0
    while i < len(lines):
        if lines[i].strip() == ".. code-block:: python":
            i += 1
            body = []
            while i < len(lines) and (not lines[i].strip() or lines[i][:1].isspace()):
                body.append(lines[i])
                i += 1
            blocks.append(textwrap.dedent("\n".join(body)).strip() + "\n")
        else:
            i += 1
    return blocks


def test_the_guide_has_code_to_run():
    assert len(PAGES) >= 5
    assert sum(len(code_blocks((GUIDE / p).read_text(encoding="utf-8"))) for p in PAGES) >= 6


def _reader_names():
    from gpc.datasets import load_banana
    from gpc.kernels import RBF, ConstantKernel
    X_all, y_all = load_banana(return_X_y=True)
    rows = np.random.default_rng(0).permutation(len(y_all))
    X, y = X_all[rows[:300]], y_all[rows[:300]]
    return {"X": X, "y": y, "X_val": X_all[rows[300:400]], "y_val": y_all[rows[300:400]],
            "X_test": X_all[rows[400:500]], "K": (ConstantKernel(1.0) * RBF(1.0))(X)}


@pytest.mark.parametrize("page", PAGES)
def test_guide_code_runs(page):
    blocks = code_blocks((GUIDE / page).read_text(encoding="utf-8"))
    if not blocks:
        return
    text = "".join(blocks)
    if "distributed" in text:
        pytest.importorskip("distributed")
    if "pandas" in text:
        pytest.importorskip("pandas")
        matplotlib = pytest.importorskip("matplotlib")
        matplotlib.use("Agg")
    namespace = _reader_names()
    for k, block in enumerate(blocks):
        # a documented example runs without warnings: each one it raises fails the test
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            try:
                exec(compile(block, f"{page}, code block {k + 1}", "exec"), namespace)
            except Exception as exc:
                raise AssertionError(f"{page}, code block {k + 1} failed:\n{block}") from exc
    if "matplotlib" in namespace or "pd" in namespace:
        import matplotlib.pyplot as plt
        plt.close("all")
