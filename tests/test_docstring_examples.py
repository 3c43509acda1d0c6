"""The Examples sections of the estimators' docstrings run and print what they show (doctest)."""

import doctest
import importlib

import pytest

MODULES = ["gpc.classifier", "gpc.sparse.estimator", "gpc.multiclass.estimator"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0, f"{name} has no docstring example"
    assert result.failed == 0
