"""Exceptions raised by the bertserve server side.

    BertServeError
    ├── ConfigError (ValueError)         an option is out of range or contradicts another
    │   └── ModelOptionError             ... a model option (also a ModelError)
    ├── StartupError                     the server cannot start, or cannot keep its processes alive
    └── ModelError (ValueError)          the model directory or a model option cannot be used
        ├── ModelOptionError             a model option is malformed, whatever the directory
        ├── ModelFileError               a file is missing, unreadable or malformed
        │   └── HubError                 ... or a model named by its Hub id cannot be had
        └── ModelShapeError              weights, config and vocabulary disagree

Input errors in ``Encoder.encode`` (an empty string, a non-string element) are plain
``ValueError``/``TypeError`` naming the position of the bad element.
"""


class BertServeError(Exception):
    """Base class of every bertserve error."""


class ConfigError(BertServeError, ValueError):
    """A server option is out of range or contradicts another."""


class StartupError(BertServeError):
    """The server cannot start (a port is taken, the model cannot load), or it had to give up
    restarting a process that keeps failing."""


class ModelError(BertServeError, ValueError):
    """The model directory or a model option cannot be used."""


class ModelFileError(ModelError):
    """A model file is missing, unreadable or malformed."""


class HubError(ModelFileError):
    """A model named by its Hugging Face Hub id cannot be had: unknown, not allowed, not
    reachable, not cached while offline, or without weights bertserve reads."""


class ModelShapeError(ModelError):
    """The weights, the config and the vocabulary disagree about a shape."""


class ModelOptionError(ConfigError, ModelError):
    """A model option is malformed (an unknown dtype, a negative batch size), whatever the directory."""
