"""The version of ctlrpc-gen (`ctlrpc-gen --version` prints it).

It is ctlrpc's version, whose owner is runtime/include/ctlrpc/version.h: the CMake build reads
both with a regular expression and refuses to configure when they disagree, so keep the
assignment below exactly in the form `__version__ = "X.Y.Z"`, alone on its line, and import
nothing here.
"""

__version__ = "0.2.0"
