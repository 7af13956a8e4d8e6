"""The package's version (kept apart from the package root, which imports the toy world's registration)."""

__version__ = "0.1.0"
