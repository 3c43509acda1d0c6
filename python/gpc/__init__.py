"""gpc: Gaussian process classification with every approximation of the papers under one API."""

__version__ = "0.1.0.dev0"
