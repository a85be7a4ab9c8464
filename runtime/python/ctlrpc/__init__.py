"""ctlrpc: the control-plane RPC runtime in pure Python (pyzmq and msgpack), the twin of libctlrpc.

It speaks the wire of docs/PROTOCOL.md with the C runtime's semantics, so Python clients call C
units and C clients call Python units:

    import ctlrpc

    with ctlrpc.Client(timeout=5.0) as c:
        size = c.call("tcp://10.0.0.5:4100", "put", {"key": "k", "data": b"bytes"})

    server = ctlrpc.Server({"echo": lambda args: args["text"]}, "tcp://127.0.0.1:0")
    print(server.endpoint)

Modules: `errors` (the exception tree), `client` (Client, Outcome), `server` (Server and its
dispatch core), `net` (node_ip, endpoints), `curve` (keys and key files), `_wire` (messages as
bytes, bounded decoding). Everything a program needs is re-exported here; docs/PYTHON.md is the
guide.
"""

from ._version import __version__
from .client import Client, Outcome
from .curve import keygen
from .errors import Busy, DeclaredError, Error, Missing, Timeout, Transfer, UnitFull
from .net import node_ip
from .server import Server

__all__ = ["__version__", "Busy", "Client", "DeclaredError", "Error", "Missing", "Outcome",
           "Server", "Timeout", "Transfer", "UnitFull", "keygen", "node_ip"]
