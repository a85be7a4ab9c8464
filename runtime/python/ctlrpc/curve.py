"""CURVE keys and key files, in the C programs' formats (ctlrpc/curve.h).

Keys are 40-character Z85 strings (32 bytes). A key file holds one key as text; surrounding
whitespace and lines starting with '#' are ignored. A secret key file must not be readable by
its group or others: reading one that is is refused, naming the file and its mode, as ssh does
for private keys. `keygen(prefix)` writes PREFIX.key (secret, mode 0600, never overwriting) and
PREFIX.pub, exactly as `ctl-storage-unit --gen-keys PREFIX` and `ctl-storage keygen PREFIX` do,
so key files move freely between C and Python programs. An allowlist holds one public key per
line.

Wherever the runtime takes a key (Client's curve_server_key and curve_secret, Server's
curve_secret), it takes either the key's text or the path of a key file: `load_key` tells them
apart (a valid 40-character Z85 key is a key; anything else is a path).
"""

from __future__ import annotations

import os
import stat
from typing import Iterable, List, Tuple, Union

import zmq

KEY_LEN = 40
_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
_Z85_VALUE = {c: i for i, c in enumerate(_Z85)}
_MAX_FILE = 1 << 20


def available() -> bool:
    """Whether the libzmq in use was built with CURVE."""
    return bool(zmq.has("curve"))


def key_valid(key: str) -> bool:
    """Whether `key` is a well-formed Z85 key: 40 characters that decode to 32 bytes."""
    if len(key) != KEY_LEN:
        return False
    for i in range(0, KEY_LEN, 5):
        value = 0
        for c in key[i:i + 5]:
            digit = _Z85_VALUE.get(c)
            if digit is None:
                return False
            value = value * 85 + digit
        if value > 0xFFFFFFFF:
            return False
    return True


def z85_decode(key: str) -> bytes:
    """The 32 bytes of a valid Z85 key."""
    if not key_valid(key):
        raise ValueError("not a 40-character Z85 key")
    out = bytearray()
    for i in range(0, KEY_LEN, 5):
        value = 0
        for c in key[i:i + 5]:
            value = value * 85 + _Z85_VALUE[c]
        out += value.to_bytes(4, "big")
    return bytes(out)


def _check_available() -> None:
    if not available():
        raise ValueError("a CURVE key was given, but this libzmq has no CURVE support")


def keypair() -> Tuple[str, str]:
    """A new key pair, (public, secret), Z85."""
    _check_available()
    public, secret = zmq.curve_keypair()
    return public.decode("ascii"), secret.decode("ascii")


def public_of(secret: str) -> str:
    """The public key of a Z85 secret key."""
    _check_available()
    if not key_valid(secret):
        raise ValueError("CURVE secret key is not a 40-character Z85 key")
    public: bytes = zmq.curve_public(secret.encode("ascii"))
    return public.decode("ascii")


def _slurp(path: str, secret: bool) -> str:
    """A small text file, whole; with `secret`, refuse one its group or others can read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        raise ValueError(f"key file {path}: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"key file {path}: not a regular file")
        if secret and st.st_mode & 0o077:
            raise ValueError(f"key file {path} is readable by others (mode "
                             f"{stat.S_IMODE(st.st_mode):04o}): a secret key must be private "
                             f"(chmod 600 {path})")
        if st.st_size > _MAX_FILE:
            raise ValueError(f"key file {path}: too large for a key file")
        chunks = []
        while True:
            chunk = os.read(fd, _MAX_FILE)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks).decode("utf-8", "replace")


def read_key(path: str, secret: bool) -> str:
    """The key in the file at `path` (see the module's docstring). ValueError naming the file
    and what is wrong with it."""
    for line in _slurp(path, secret).split("\n"):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if not key_valid(line):
            raise ValueError(f"key file {path}: not a 40-character Z85 CURVE key")
        return line
    raise ValueError(f"key file {path} holds no key")


def read_allowlist(path: str) -> List[str]:
    """The public keys of an allowlist file, one per line ('#' comments and blank lines
    ignored). ValueError naming the file and line otherwise."""
    keys = []
    for lineno, line in enumerate(_slurp(path, False).split("\n"), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if not key_valid(line):
            raise ValueError(f"allowlist {path}:{lineno}: not a 40-character Z85 CURVE public "
                             "key")
        keys.append(line)
    return keys


def load_key(value: str, secret: bool, what: str) -> str:
    """A key given as its text or as the path of a key file (read with the secret file check
    when `secret`). `what` names it in messages."""
    if key_valid(value):
        return value
    if not value:
        raise ValueError(f"{what}: empty (give a 40-character Z85 key or a key file)")
    return read_key(value, secret)


def load_allowlist(value: Union[str, Iterable[str]]) -> List[str]:
    """An allowlist given as the path of an allowlist file or as the keys themselves."""
    if isinstance(value, str):
        return read_allowlist(value)
    keys = list(value)
    for i, key in enumerate(keys):
        if not isinstance(key, str) or not key_valid(key):
            raise ValueError(f"allowed client key #{i} is not a 40-character Z85 key")
    return keys


def _write_new(path: str, text: str, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    try:
        data = text.encode("ascii")
        while data:
            data = data[os.write(fd, data):]
    except OSError:
        os.close(fd)
        os.unlink(path)
        raise
    os.close(fd)


def keygen(prefix: str) -> Tuple[str, str]:
    """Write a new key pair to PREFIX.key (the secret key, mode 0600, created exclusively: an
    existing file is an error, never overwritten) and PREFIX.pub (mode 0644). Returns (public,
    secret). OSError naming the file when one cannot be created."""
    public, secret = keypair()
    key_path, pub_path = prefix + ".key", prefix + ".pub"
    _write_new(key_path, f"# ctlrpc CURVE secret key: keep private\n{secret}\n", 0o600)
    try:
        _write_new(pub_path, f"# ctlrpc CURVE public key\n{public}\n", 0o644)
    except OSError:
        os.unlink(key_path)
        raise
    return public, secret
