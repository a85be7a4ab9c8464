"""The version of ctlrpc: the generator, the runtime and the packages share it."""

__version__ = "0.1.0"
