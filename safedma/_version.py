"""The one place the version is written: setuptools reads it for the metadata, the face re-exports it."""

__version__ = "0.1.0"
