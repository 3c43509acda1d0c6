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


def test_every_compiled_module_has_a_type_stub():
    """mypy (CI) needs a .pyi beside each compiled gpc._<name> that meson.build builds."""
    import pathlib
    import re

    root = pathlib.Path(__file__).resolve().parents[1]
    names = re.findall(r"'(_\w+)'", re.search(r"foreach name : \[(.*?)\]",
                                              (root / "meson.build").read_text(), re.S).group(1))
    assert names, "no compiled modules found in meson.build"
    missing = [n for n in names if not (root / "python" / "gpc" / f"{n}.pyi").exists()]
    assert not missing, f"no type stub for {missing}"
