"""CURVE keys and key files, in the C programs' formats (ctlrpc/curve.h).

Keys are 40-character Z85 strings (32 bytes). A key file holds one key as text; surrounding
whitespace and lines starting with '#' are ignored, but the header line keygen writes says which
half of a pair the file holds. Files are read as the C reader reads them (runtime/src/curve.c),
with the same words, as ssh reads its own files: refused, naming the file and the mistake, when
someone else could have written them (a symbolic link, a file writable by others, a file in a
directory others can write unless it is sticky and the file is ours or root's), when they hold
a NUL byte, when a secret key file is readable by its group or others, when the header names
the other half of the pair ("this is a public key; pass the .key file", and the reverse), and in
an allowlist, for a key listed twice or a secret key file pasted in. `keygen(prefix)` writes PREFIX.key (secret, mode 0600, never overwriting) and
PREFIX.pub, exactly as `ctl-storage-unit --gen-keys PREFIX` and `ctl-storage keygen PREFIX` do,
so key files move freely between C and Python programs. An allowlist holds one public key per
line.

Wherever the runtime takes a key (Client's curve_server_key and curve_secret, Server's
curve_secret), it takes either the key's text or the path of a key file: `load_key` tells them
apart (a valid 40-character Z85 key is a key; anything else is a path).
"""

from __future__ import annotations

import errno
import os
import stat
from typing import Dict, Iterable, List, Tuple, Union

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


# The headers `keygen` writes: a key file says which half of a pair it holds, so a public key
# passed where the secret is wanted (or the reverse) is told apart from a mode or format problem.
SECRET_HEADER = "ctlrpc CURVE secret key"
PUBLIC_HEADER = "ctlrpc CURVE public key"


def _is_header(line: str, header: str) -> bool:
    return line.startswith("#") and line[1:].lstrip().startswith(header)


def _check_directory(path: str, st: os.stat_result, word: str) -> None:
    """Refuse a file in a directory others may write (unless it is sticky, as /tmp is, and the
    file is ours or root's): they could replace it."""
    d = os.path.dirname(path) or "."
    try:
        ds = os.stat(d)
    except OSError:
        return
    if not ds.st_mode & stat.S_IWOTH:
        return
    if ds.st_mode & stat.S_ISVTX and st.st_uid in (os.geteuid(), 0):
        return
    raise ValueError(f"{word} {path} is in a directory that others can write ({d}, mode "
                     f"{stat.S_IMODE(ds.st_mode):04o}): anyone could replace it; move it, or "
                     f"chmod o-w {d}")


def _slurp(path: str, word: str, secret: bool = False) -> Tuple[str, os.stat_result]:
    """A small text file, whole, and its status, refused (ValueError naming the file and the
    mistake) when someone else could have put keys in it or it is not text: the C reader's rules
    and words (runtime/src/curve.c). `word` is "key file" or "allowlist"."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError as e:
        if os.path.islink(path):
            raise ValueError(f"{word} {path} is a symbolic link: give the file itself (a link "
                             "can be pointed elsewhere)") from None
        if e.errno == errno.ENOENT and key_valid(path):
            # A key's text where a file was wanted: not echoed, it may be a secret.
            hint = ("public keys, one a line" if word == "allowlist" else
                    "PREFIX.key" if secret else "PREFIX.pub")
            raise ValueError(f"a key's text was given where a {word} is wanted: give the file "
                             f"({hint})"
                             + ("; a secret on the command line is visible to every local "
                                "user, make a new key pair" if secret else "")) from None
        raise ValueError(f"{word} {path}: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{word} {path}: not a regular file")
        if st.st_mode & stat.S_IWOTH:
            raise ValueError(f"{word} {path} is writable by others (mode "
                             f"{stat.S_IMODE(st.st_mode):04o}): anyone could replace its keys "
                             f"(chmod o-w {path})")
        _check_directory(path, st, word)
        if st.st_size > _MAX_FILE:
            raise ValueError(f"{word} {path}: too large for a {word}")
        chunks = []
        size = 0
        while size <= _MAX_FILE:
            chunk = os.read(fd, _MAX_FILE)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    nul = data.find(b"\0")
    if nul >= 0:
        raise ValueError(f"{word} {path} holds a NUL byte (at offset {nul}): not a text file")
    return data.decode("utf-8", "replace"), st


def read_key(path: str, secret: bool) -> str:
    """The key in the file at `path` (see the module's docstring). ValueError naming the file
    and what is wrong with it: a public key's file given for a secret key (or the reverse), a
    secret key file its group or others can read, a link, a file others could replace."""
    text, st = _slurp(path, "key file", secret)
    for line in text.split("\n"):
        line = line.strip()
        if secret and _is_header(line, PUBLIC_HEADER):
            raise ValueError(f"key file {path}: this is a public key; pass the .key file (the "
                             "secret key)")
        if not secret and _is_header(line, SECRET_HEADER):
            raise ValueError(f"key file {path}: this is a secret key; pass the .pub file (the "
                             "public key)")
        if not line or line.startswith("#"):
            continue
        if not key_valid(line):
            raise ValueError(f"key file {path}: not a 40-character Z85 CURVE key")
        if secret and st.st_mode & 0o077:
            raise ValueError(f"key file {path} is readable by others (mode "
                             f"{stat.S_IMODE(st.st_mode):04o}): a secret key must be private "
                             f"(chmod 600 {path})")
        return line
    raise ValueError(f"key file {path} holds no key")


def read_allowlist(path: str) -> List[str]:
    """The public keys of an allowlist file, one per line ('#' comments and blank lines
    ignored). ValueError naming the file and line otherwise: a key that is not one, a key
    listed twice, a secret key file pasted in (its header), and the file rules of read_key."""
    keys: List[str] = []
    seen: Dict[str, int] = {}
    text, _ = _slurp(path, "allowlist")
    for lineno, line in enumerate(text.split("\n"), 1):
        line = line.strip()
        if _is_header(line, SECRET_HEADER):
            raise ValueError(f"allowlist {path}:{lineno}: this is a secret key file's header: "
                             "an allowlist holds public keys (the .pub files); make a new key "
                             "pair, this secret is exposed")
        if not line or line.startswith("#"):
            continue
        if not key_valid(line):
            raise ValueError(f"allowlist {path}:{lineno}: not a 40-character Z85 CURVE public "
                             "key")
        if line in seen:
            raise ValueError(f"allowlist {path}:{lineno}: the key of line {seen[line]} again "
                             "(a duplicate)")
        seen[line] = lineno
        keys.append(line)
    return keys


def load_key(value: str, secret: bool, what: str) -> str:
    """A key given as its text or as the path of a key file (read with the secret file check
    when `secret`). `what` names it in messages."""
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str (a key or a key file), not "
                        f"{type(value).__name__}")
    if key_valid(value):
        return value
    if not value:
        raise ValueError(f"{what}: empty (give a 40-character Z85 key or a key file)")
    if not os.path.lexists(value):
        # (not echoed: it may be a mistyped secret)
        raise ValueError(f"{what} is neither a 40-character Z85 key nor a key file that "
                         "exists")
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
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    except OSError as e:  # the C tools' words: "cannot create PATH: File exists"
        failed = type(e)(f"cannot create {path}: {e.strerror}")
        failed.errno = e.errno
        raise failed from None
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
    if not isinstance(prefix, str):
        raise TypeError(f"keygen: prefix must be a str, not {type(prefix).__name__}")
    if not prefix or prefix.endswith("/"):
        raise ValueError(f"key file prefix '{prefix}' names no file: give PREFIX (PREFIX.key "
                         "and PREFIX.pub are written), e.g. keys/unit")
    public, secret = keypair()
    key_path, pub_path = prefix + ".key", prefix + ".pub"
    _write_new(key_path, f"# ctlrpc CURVE secret key: keep private\n{secret}\n", 0o600)
    try:
        _write_new(pub_path, f"# ctlrpc CURVE public key\n{public}\n", 0o644)
    except OSError:
        os.unlink(key_path)
        raise
    return public, secret
