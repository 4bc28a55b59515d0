"""The package version (one place: ``autostream.__version__`` and pass digests read it)."""

__version__ = "0.1.0"
