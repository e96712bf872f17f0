"""Exceptions raised by the bertserve server side.

    BertServeError
    └── ModelError (ValueError)          the model directory or an option cannot be used
        ├── ModelFileError               a file is missing, unreadable or malformed
        └── ModelShapeError              weights, config and vocabulary disagree

Input errors in ``Encoder.encode`` (an empty string, a non-string element) are plain
``ValueError``/``TypeError`` naming the position of the bad element.
"""


class BertServeError(Exception):
    """Base class of every bertserve error."""


class ModelError(BertServeError, ValueError):
    """The model directory or a model option cannot be used."""


class ModelFileError(ModelError):
    """A model file is missing, unreadable or malformed."""


class ModelShapeError(ModelError):
    """The weights, the config and the vocabulary disagree about a shape."""
