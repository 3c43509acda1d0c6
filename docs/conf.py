"""Sphinx configuration of gpc's documentation.

Build: ``pip install --group docs`` then ``python -m sphinx -W -b html docs docs/_build/html``.

The API reference is generated from the code: ``api.rst`` is written here, at configuration
time, from ``gpc.__all__`` and the ``__all__`` of every public submodule (so a new estimator's
module appears as soon as it has an ``__all__``), and autosummary writes one page per name.
When the build finishes, :func:`check_api_pages` fails it if a public name has no page, or if a
callable that takes parameters has a page without a "Parameters" section.
"""

import importlib
import inspect
import pkgutil
import warnings
from pathlib import Path

from threadpoolctl import threadpool_limits

import gpc

# One BLAS thread for the whole build: the gallery's problems are small (n of a few hundred), where
# threads gain nothing and, on a shared machine, lose a lot to contention.
threadpool_limits(limits=1, user_api="blas")

HERE = Path(__file__).resolve().parent

project = "gpc"
author = "the gpc developers"
copyright = "2026, the gpc developers"
release = gpc.__version__
version = release

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.mathjax",
    "numpydoc",
    "myst_parser",
    "sphinx_gallery.gen_gallery",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "results", "gallery/*.ipynb", "gallery/*.py", "gallery/*.md5",
                    "gallery/*.json", "gallery/*.zip"]
templates_path = ["_templates"]

# The markdown pages (architecture, derivations, data sets, reproduction) are folded in as they are.
myst_enable_extensions = ["dollarmath"]
myst_heading_anchors = 3

autosummary_generate = True
autosummary_imported_members = True
autodoc_default_options = {"members": True, "inherited-members": False}
autodoc_typehints = "none"          # numpydoc's Parameters sections carry the types
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False

html_theme = "pydata_sphinx_theme"
html_title = f"gpc {release}"
html_theme_options = {"navigation_with_keys": False, "show_toc_level": 2}

sphinx_gallery_conf = {
    "examples_dirs": str(HERE.parent / "examples"),
    "gallery_dirs": "gallery",
    "filename_pattern": r"/plot_",          # run every plot_*.py example
    "within_subsection_order": "FileNameSortKey",
    "download_all_examples": False,
    "abort_on_example_error": True,
    "only_warn_on_example_error": False,
    "remove_config_comments": True,
    "image_scrapers": ("matplotlib",),
}


# ----------------------------------------------------------------------------------------------
# API reference: one section per public module, one page per name in its __all__.

def public_modules():
    """``gpc`` and each importable public submodule (no underscore in its path) with an ``__all__``."""
    modules = [gpc]
    for info in pkgutil.walk_packages(gpc.__path__, prefix="gpc."):
        if any(part.startswith("_") for part in info.name.split(".")):
            continue
        module = importlib.import_module(info.name)
        if hasattr(module, "__all__"):
            modules.append(module)
    return modules


def api_entries():
    """``[(module, [(name, qualified page name, kind)])]``; an object that several modules export gets
    its page under the first of them (``gpc`` before its submodules) and a link from the others."""
    owner = {}
    sections = []
    for module in public_modules():
        entries = []
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.ismodule(obj):
                continue                        # a submodule has its own section
            kind = ("class" if inspect.isclass(obj) else
                    "function" if callable(obj) else "data")
            key = id(obj) if kind != "data" else (module.__name__, name)
            owner.setdefault(key, f"{module.__name__}.{name}")
            entries.append((name, owner[key], kind))
        sections.append((module, entries))
    return sections


def write_api_page():
    lines = [
        ".. This file is written by docs/conf.py from the modules' __all__; do not edit it.",
        "",
        "API reference",
        "=============",
        "",
        "Every public name of gpc, by module. Each page gives the parameters, what is returned or",
        "raised, and the paper and equation implemented.",
        "",
    ]
    for module, entries in api_entries():
        title = f":mod:`{module.__name__}`"
        summary = (inspect.getdoc(module) or "").split("\n\n")[0].replace("\n", " ")
        lines += [title, "-" * len(title), "", f".. currentmodule:: {module.__name__}", ""]
        if summary:
            lines += [summary, ""]
        owned = [(n, q, k) for n, q, k in entries if q == f"{module.__name__}.{n}"]
        linked = [(n, q, k) for n, q, k in entries if q != f"{module.__name__}.{n}"]
        for kind, heading in [("class", "Classes"), ("function", "Functions"), ("data", "Constants")]:
            names = [n for n, q, k in owned if k == kind]
            if not names:
                continue
            lines += [f"**{heading}**", "", ".. autosummary::", "   :toctree: generated", "",
                      *[f"   {q}" for q in names], ""]
        if linked:
            lines += ["**Also exported here**", "", ".. autosummary::", "",
                      *[f"   {q}" for n, q, k in linked], ""]
    (HERE / "api.rst").write_text("\n".join(lines), encoding="utf-8")


write_api_page()


def documented_names(obj):
    """Names in the numpydoc Parameters (and, for a class, Attributes) sections of ``obj``'s docstring."""
    from numpydoc.docscrape import NumpyDocString

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        doc = NumpyDocString(inspect.getdoc(obj) or "")
    sections = ["Parameters", "Other Parameters"] + (["Attributes"] if inspect.isclass(obj) else [])
    return {name.strip().lstrip("*") for section in sections for item in doc[section]
            for name in item.name.split(",")}


def check_api_pages(app, exception):
    """Fail the build when a public name has no page, or its docstring (what the page shows) leaves
    out a parameter its signature takes."""
    if exception is not None or app.builder.name != "html":
        return
    problems = []
    for module, entries in api_entries():
        for name, qualified, kind in entries:
            page = Path(app.outdir) / "generated" / f"{qualified}.html"
            if not page.exists():
                problems.append(f"{module.__name__}.{name}: no page {page.name}")
                continue
            obj = getattr(module, name)
            if kind == "data" or qualified != f"{module.__name__}.{name}":
                continue                        # data has no parameters; a re-export was checked
            try:
                signature = inspect.signature(obj)
            except (TypeError, ValueError):
                continue
            wanted = [p.name for p in signature.parameters.values()
                      if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
            missing = [p for p in wanted if p not in documented_names(obj)]
            if missing:
                problems.append(f"{qualified}: parameters {', '.join(missing)} are not documented")
    if problems:
        raise RuntimeError("API reference incomplete:\n  " + "\n  ".join(problems))


def skip_member(app, what, name, obj, skip, options):
    """Leave out scikit-learn's metadata-routing setters (``set_*_request``): scikit-learn adds them
    to every estimator class, and their docstrings refer to scikit-learn's own glossary."""
    if name.startswith("set_") and name.endswith("_request"):
        return True
    return None


def setup(app):
    app.connect("build-finished", check_api_pages)
    app.connect("autodoc-skip-member", skip_member)
    warnings.filterwarnings("ignore", message="Matplotlib is currently using agg")
