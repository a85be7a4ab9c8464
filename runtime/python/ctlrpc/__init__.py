"""ctlrpc: the control-plane RPC runtime in pure Python (pyzmq and msgpack), the twin of libctlrpc.

It speaks the wire of docs/PROTOCOL.md with the C runtime's semantics, so Python clients call C
units and C clients call Python units:

    import ctlrpc

    with ctlrpc.Client(timeout=5.0) as c:
        size = c.call("tcp://10.0.0.5:4100", "put", {"key": "k", "data": b"bytes"})

    server = ctlrpc.Server({"echo": lambda args: args["text"]}, "tcp://127.0.0.1:0")
    print(server.endpoint)

Modules: `errors` (the exception tree), `client` (Client, Outcome), `aio` (the asyncio Client,
`await client.call(...)`), `retry` (RetryPolicy: when a call is sent again), `server` (Server
and its dispatch core), `net` (node_ip, endpoints), `curve` (keys and key files), `directory` (Directory, Registration: membership in etcd),
`etcd` (etcd's HTTP/JSON gateway: endpoints, TLS, users, deadlines), `_wire` (messages as
bytes, bounded decoding). Everything a program needs is re-exported here; docs/PYTHON.md is the
guide.
"""

from typing import TYPE_CHECKING, Any

from . import aio
from ._version import __version__
from .client import Client, Outcome

from .curve import keygen
from .errors import Busy, DeclaredError, Error, Missing, Timeout, Transfer, UnitFull
from .net import node_ip
from .retry import RetryPolicy
from .server import Server

if TYPE_CHECKING:
    from .directory import Directory, Registration, Unit
    from .etcd import Etcd, EtcdError, EtcdUnreachable

# The fleet's names are imported when first used: a program that never talks to etcd does not
# pay for urllib, ssl and http.client at start.
_FLEET = {"Directory": "directory", "Registration": "directory", "Unit": "directory",
          "Etcd": "etcd", "EtcdError": "etcd", "EtcdUnreachable": "etcd"}


def __getattr__(name: str) -> Any:
    import importlib
    if name in ("directory", "etcd"):  # the modules themselves, as `ctlrpc.directory`
        return importlib.import_module(f".{name}", __name__)
    module = _FLEET.get(name)
    if module is None:
        raise AttributeError(f"module 'ctlrpc' has no attribute '{name}'")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value

__all__ = ["__version__", "aio", "Busy", "Client", "DeclaredError", "Directory", "Error", "Etcd",
           "EtcdError", "EtcdUnreachable", "Missing", "Outcome", "Registration", "RetryPolicy",
           "Server", "Timeout", "Transfer", "Unit", "UnitFull", "keygen", "node_ip"]
