"""The bertserve client: talks to a bertserve server; needs no TensorFlow."""

from ._version import __version__

__all__ = ["__version__"]
