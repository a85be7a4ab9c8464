"""The errors of a call, as exceptions: one class per error kind of the wire.

    Error                   every failure of a call; raised by a handler, a Protocol error
    +-- UnitFull            kind UnitFull: a put did not fit
    +-- Busy                kind Busy: retry this unit later; `reason` says why ("pinned",
    |                       "draining")
    +-- Missing             kind Missing: the unit no longer has these blobs (`blobs`)
    +-- Transfer            the call did not complete: `cause` "remote" (the unit answered a
    |   |                   Protocol error, or a kind this caller does not know: `remote_kind`,
    |   |                   `reason`), "transport", "bad-reply", "refused" (nothing listens),
    |   |                   "unresolved" (the host does not resolve), "auth" (the CURVE
    |   |                   handshake failed), "too-large" (a message over the size limit)
    |   +-- Timeout         cause "timeout": no complete reply within the deadline
    +-- DeclaredError       base of the classes for kinds a service declares in its IDL
                            (`error NotFound;`); each subclass sets `kind`

These are the reference design's client exceptions under the runtime's names: UnitFull is
UnitFull, Busy is DataPlaneBusy(reason), Missing is LostBlobs(blobs), Transfer is TransferError
(docs/PROTOCOL.md, "Errors").

`msg` is the message as the unit sent it (or as a handler raised it); `address` and `op` name
the call when the error comes from one, and then `str(err)` reads like the C runtime's messages:
`put at tcp://10.0.0.5:4100: unit full: 65536 bytes do not fit`. Raised by a handler, an error
goes out as its kind with `str(err)` as the message, so an error from a nested call keeps the
name of the unit it came from.
"""

from __future__ import annotations

from typing import ClassVar, Iterable, List, Optional

# What Transfer.cause holds: the C runtime's causes by name (ctl_cause_name). "refused",
# "unresolved" and "auth" end a call well before its deadline (the client watches its
# connections); "too-large" is a request over the client's limit (not sent) or a reply over it
# (dropped).
CAUSES = ("remote", "timeout", "transport", "bad-reply", "refused", "unresolved", "auth",
          "too-large")
# The kinds of the wire every peer knows; a declared kind never takes one of these names.
BUILTIN_KINDS = ("UnitFull", "Busy", "Missing", "Protocol")


class Error(Exception):
    """Every failure of a call. Raised by a handler, it is answered as a Protocol error."""

    kind: ClassVar[str] = "Protocol"
    # How many attempts the call made (its retries included) before it failed this way; the
    # message ends "(after N attempts)" when more than one.
    attempts: int = 1

    def __init__(self, msg: str = "", *, address: str = "", op: str = "") -> None:
        super().__init__(msg)
        self.msg = msg
        self.address = address
        self.op = op

    def detail(self) -> str:
        """The message without the op and address."""
        return self.msg

    def __str__(self) -> str:
        if self.op or self.address:
            return f"{self.op or '(op)'} at {self.address or '(address)'}: {self.detail()}"
        return self.msg

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self)!r})"


class UnitFull(Error):
    """A put did not fit in the unit (with spill-to-disk on, the unit spills instead)."""

    kind: ClassVar[str] = "UnitFull"

    def detail(self) -> str:
        return f"unit full: {self.msg}"


class Busy(Error):
    """Retry this unit later; `reason` says why ("pinned", "draining"), or is None."""

    kind: ClassVar[str] = "Busy"

    def __init__(self, msg: str = "", *, reason: Optional[str] = None, address: str = "",
                 op: str = "") -> None:
        super().__init__(msg, address=address, op=op)
        self.reason = reason

    def detail(self) -> str:
        return f"busy ({self.reason if self.reason is not None else 'no reason'}): {self.msg}"


class Missing(Error):
    """The unit no longer has the blobs named in `blobs`."""

    kind: ClassVar[str] = "Missing"

    def __init__(self, msg: str = "", *, blobs: Iterable[str] = (), address: str = "",
                 op: str = "") -> None:
        super().__init__(msg, address=address, op=op)
        self.blobs: List[str] = list(blobs)

    def detail(self) -> str:
        return f"{len(self.blobs)} blob(s) missing: {self.msg}"


class Transfer(Error):
    """The call did not complete: the unit answered a Protocol error or a kind this caller does
    not know (cause "remote": `remote_kind` is the kind it sent, `reason` its reason), or no
    complete reply came ("timeout"), the transport failed ("transport"), or the reply could not
    be read ("bad-reply"). Raised by a handler, it goes out as a Protocol error."""

    kind: ClassVar[str] = "Protocol"
    cause: str
    # True when the client knows the request never left (the message says "nothing was sent"
    # or "not sent"): it never reached a handler, and never will.
    unsent: bool = False

    def __init__(self, msg: str = "", *, cause: str = "transport",
                 remote_kind: Optional[str] = None, reason: Optional[str] = None,
                 address: str = "", op: str = "") -> None:
        super().__init__(msg, address=address, op=op)
        if cause not in CAUSES:
            raise ValueError(f"Transfer: cause {cause!r} is not one of {', '.join(CAUSES)}")
        self.cause = cause
        self.remote_kind = remote_kind
        self.reason = reason

    def detail(self) -> str:
        if self.cause == "remote":
            return f"{show_kind(self.remote_kind)} error: {self.msg}"
        return self.msg


class Timeout(Transfer):
    """No complete reply within the deadline (cause "timeout"); the socket was closed."""

    cause: str = "timeout"

    def __init__(self, msg: str = "", *, address: str = "", op: str = "") -> None:
        super().__init__(msg, cause="timeout", address=address, op=op)


class DeclaredError(Error):
    """Base of the classes for error kinds a service declares (`error NotFound;` in its IDL):

        class NotFound(ctlrpc.DeclaredError):
            kind = "NotFound"

    A client raises the subclass when the op lists the kind (Client.call's `kinds`); a handler
    raises it to answer with that kind, `msg` and `reason`."""

    kind: ClassVar[str] = ""

    def __init__(self, msg: str = "", *, reason: Optional[str] = None, address: str = "",
                 op: str = "") -> None:
        super().__init__(msg, address=address, op=op)
        self.reason = reason

    def detail(self) -> str:
        return f"{show_kind(type(self).kind)} error: {self.msg}"


def show_kind(kind: Optional[str]) -> str:
    """A kind's name for a message ("(empty kind)" for none)."""
    if not kind:
        return "(empty kind)"
    return kind if kind.isprintable() and len(kind) <= 64 else repr(kind[:64])[1:-1]
