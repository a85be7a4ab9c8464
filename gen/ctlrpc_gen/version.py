"""The version of ctlrpc-gen, which is ctlrpc's version (`ctlrpc-gen --version` prints it).

The CMake build reads this file with a regular expression: keep the assignment below exactly in
the form `__version__ = "X.Y.Z"`, alone on its line, and import nothing here.
"""

__version__ = "0.1.0"
