"""The render stage: a checked model -> C files, through jinja2 templates.

This is the only module that imports jinja2. It decides what the model leaves open, as template
filters and globals, never by building C in Python:

- C names: none are made here. Every identifier comes from `cnames.CNames` (templates call
  `c(role, name)` and `ct(role, type)`), the one place that names generated C and that the
  checker has already run to prove the names distinct and free.
- C spellings of values: integer literals with their width (`UINT64_C(5)`), strings escaped for
  C (octal escapes for anything outside printable ASCII, so a `??` trigraph or a `*/` cannot
  appear), defaults as brace initializers (constant expressions, so they can initialize the
  static defaults the runtime compares against and the `<SVC>_<NAME>_INIT` macros; a string
  longer than a C literal may be is a char array), and every piece of IDL text copied into a
  comment passed through `comment_inline`, the one escape for comments.
- Type descriptors: each list, map, optional and record type an op can reach has one constant
  `ctl_type`, each op one `ctl_op_desc`; `tref` names the descriptor of a type
  (`&ctl_type_u64` for scalars).

Outputs are deterministic (no timestamps, no absolute paths) and written only when their bytes
change, so a build that regenerates without a change does not recompile.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from typing import Iterable, List, Optional

import jinja2

from . import cnames
from . import model as m
from .diag import FatalError, printable

TEMPLATES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "templates")

# Bump together with CTL_GEN_ABI in runtime/include/ctlrpc/gen.h.
GEN_ABI = 4

_SCALAR_C = {
    "bool": "bool",
    "i32": "int32_t",
    "i64": "int64_t",
    "u32": "uint32_t",
    "u64": "uint64_t",
    "f64": "double",
    "str": "ctl_str",
    "bin": "ctl_str",
}


class Renderer:
    """Holds the model, the display root and the jinja2 environment for one run."""

    def __init__(self, model: m.Model, display_root: Optional[str] = None) -> None:
        self.model = model
        self.svc = model.service.name
        self.display_root = display_root
        self._reachable: Optional[set] = None
        self.stem = cnames.stem_of(model.path)
        # Every C identifier below comes from here (see cnames.py).
        self.names = cnames.CNames(model.service, self.stem, model.records, model.ops,
                                   model.types, model.path, model.errors)
        self.env = template_env()
        f = self.env.filters
        f["ctype"] = self.ctype
        f["decl"] = self.decl
        f["init_value"] = self.init_value
        f["c_string"] = c_string
        f["comment"] = comment_text
        f["comment_inline"] = comment_inline
        f["display"] = self.display
        f["tref"] = self.tref
        f["op_flags"] = op_flags
        g = self.env.globals
        g["m"] = m
        g["svc"] = self.svc
        g["SVC"] = self.svc.upper()
        g["GEN_ABI"] = GEN_ABI
        g["IDEMPOTENT_NOTE"] = IDEMPOTENT_NOTE
        g["isinstance"] = isinstance
        g["has_views"] = has_views
        g["initializers"] = self.initializers
        # Declared error kinds some op raises: they get a descriptor in the .c.
        g["raised_errors"] = [e for e in model.errors
                              if any(e.name in op.raises_declared for op in model.ops)]
        g["c"] = self.names.get
        g["ct"] = self.names.of_type
        g["long_strings"] = sorted(((name, data) for data, name in self.names.long_strings.items()),
                                   key=lambda p: int(p[0].rsplit("__s", 1)[1]))
        f["char_array"] = char_array

    # -- names ----------------------------------------------------------------------------

    def ctype(self, t: m.Type) -> str:
        """The C type that holds a value of `t` (an optional record is a pointer, NULL if
        absent; other optionals are `{present, value}` structs)."""
        if isinstance(t, m.Scalar):
            return _SCALAR_C[t.name]
        if isinstance(t, m.OptionalOf) and isinstance(t.inner, m.RecordRef):
            return f"const {self.names.get('record', t.inner.name)} *"
        if isinstance(t, m.RecordRef):
            return self.names.get("record", t.name)
        return self.names.of_type("type", t)

    def decl(self, t: m.Type, name: str) -> str:
        """`ctype name`, spaced for pointers: `uint64_t size`, `const x_Node *next`."""
        c = self.ctype(t)
        return f"{c}{name}" if c.endswith("*") else f"{c} {name}"

    def display(self, path: str) -> str:
        return display_path(path, self.display_root)

    def tref(self, t: m.Type) -> str:
        """A pointer to the descriptor of `t`: the runtime's for scalars, the generated one's
        for the rest."""
        if isinstance(t, m.Scalar):
            return f"&ctl_type_{t.name}"
        if isinstance(t, m.RecordRef):
            return "&" + self.names.get("r", t.name)
        return "&" + self.names.of_type("t", t)

    # -- values ---------------------------------------------------------------------------

    def init_value(self, v: m.Value, t: m.Type) -> str:
        """A brace initializer of `ctype(t)` for the default `v` (a constant expression)."""
        if isinstance(t, m.OptionalOf):
            if v.kind == "null":
                return "NULL" if isinstance(t.inner, m.RecordRef) else "{0}"
            if isinstance(t.inner, m.RecordRef):
                raise AssertionError("records have no literal defaults")
            return f"{{true, {self.init_value(v, t.inner)}}}"
        if isinstance(t, (m.ListOf, m.MapOf)):
            return "{NULL, 0}"
        if isinstance(t, m.Scalar):
            if t.name in ("str", "bin"):
                data = v.value if isinstance(v.value, bytes) else str(v.value).encode()
                array = self.names.long_string(data)
                if array is not None:  # too long for one C string literal
                    return f"{{{array}, {len(data)}}}"
                return f"{{{c_string(data)}, {len(data)}}}"
            return scalar_literal(v, t.name)
        raise AssertionError(f"no literal for {t.idl}")

    def initializers(self, members) -> List[tuple]:
        """(member name, initializer) for the members of a record or args struct that do not
        start at zero: defaults the IDL spells out, and records held by value whose own fields
        have defaults (their `_INIT` macro)."""
        out = []
        for mem in members:
            if mem.default_written:
                out.append((mem.name, self.init_value(mem.default, mem.type)))
            elif isinstance(mem.type, m.RecordRef) and self.record_has_defaults(mem.type.name):
                out.append((mem.name, self.names.get("record_INIT", mem.type.name)))
        return out

    def record_has_defaults(self, name: str, seen: frozenset = frozenset()) -> bool:
        """Whether a record's `_INIT` sets anything (a record held by value cannot contain
        itself, but `seen` keeps the walk finite whatever the model)."""
        if name in seen:
            return False
        return any(f.default_written
                   or (isinstance(f.type, m.RecordRef)
                       and self.record_has_defaults(f.type.name, seen | {name}))
                   for f in self.model.record(name).fields)

    @property
    def reachable(self) -> set:
        """The types an op's args or result can hold, at any depth: those need descriptors.
        (A descriptor nothing refers to would be an unused static constant, which compilers
        warn about: a record only imported, or only used by other unused records.)"""
        if self._reachable is None:
            seen: set = set()
            todo = [a.type for op in self.model.ops for a in op.args]
            todo += [op.result for op in self.model.ops if op.result is not None]
            while todo:
                t = todo.pop()
                if t in seen:
                    continue
                seen.add(t)
                todo.extend(m.children(t))
                if isinstance(t, m.RecordRef):
                    todo.extend(f.type for f in self.model.record(t.name).fields)
            self._reachable = seen
        return self._reachable

    # -- output ---------------------------------------------------------------------------

    def idl_sources(self):
        """Every IDL file read (main first), as the .c embeds it for _describe: display path,
        bytes in chunks, size; and their hash."""
        texts = read_idl_files(self.model.files)
        files = [{"path": self.display(path), "chunks": idl_chunks(data), "len": len(data)}
                 for path, data in zip(self.model.files, texts)]
        return files, idl_hash(texts)

    def render(self, out_dir: str, stem: str) -> List[str]:
        """Render the header and the source into `out_dir`; returns the paths written or
        already up to date."""
        model = self.model
        ctx = dict(
            model=model,
            stem=stem,
            header=f"{stem}.ctl.h",
            guard=self.names.get("guard"),
            idl_path=self.display(model.path),
            containers=[t for t in model.types
                        if isinstance(t, (m.ListOf, m.MapOf))
                        or (isinstance(t, m.OptionalOf)
                            and not isinstance(t.inner, m.RecordRef))],
            maps=[t for t in model.types if isinstance(t, m.MapOf)],
            codec_types=[t for t in model.types
                         if not isinstance(t, m.RecordRef) and t in self.reachable],
            described_records=[r for r in model.records if m.RecordRef(r.name) in self.reachable],
        )
        ctx["idl_files"], ctx["idl_sha256"] = self.idl_sources()
        self.names.register_idl_files(len(ctx["idl_files"]))
        paths = []
        for template, name in (("header.h.j2", f"{stem}.ctl.h"), ("source.c.j2", f"{stem}.ctl.c")):
            text = self.env.get_template(template).render(**ctx)
            paths.append(write_if_changed(os.path.join(out_dir, name), text))
        return paths


# The longest piece of an IDL file in one C string literal: C11 guarantees 4095 characters
# per literal (-pedantic warns beyond).
IDL_CHUNK_BYTES = 4000


def template_env() -> jinja2.Environment:
    """The jinja2 environment every renderer (C, Python) uses over TEMPLATES."""
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )


def display_path(path: str, display_root: Optional[str]) -> str:
    """An IDL path as shown in generated files: relative to the display root, never
    absolute."""
    if display_root:
        rel = os.path.relpath(os.path.abspath(path), os.path.abspath(display_root))
        if not rel.startswith(".."):
            return rel.replace(os.sep, "/")
    if os.path.isabs(path):
        return os.path.basename(path)
    return path.replace(os.sep, "/")


def read_idl_files(paths: Iterable[str]) -> List[bytes]:
    """The bytes of the IDL files a model was read from, as generated files embed them for
    _describe: the same files, in the same run, that the parser just read."""
    texts = []
    for path in paths:
        try:
            with open(path, "rb") as f:
                texts.append(f.read())
        except OSError as e:
            raise FatalError(f"cannot read {path}: {e.strerror}") from None
    return texts


def idl_hash(texts: Iterable[bytes]) -> str:
    """The `idl_sha256` a unit reports (docs/PROTOCOL.md, "Built-in ops"): SHA-256 of the files'
    bytes in order, each written as a netstring (`<size>:<bytes>,`), paths left out."""
    return hashlib.sha256(b"".join(b"%d:%s," % (len(t), t) for t in texts)).hexdigest()


def idl_chunks(data: bytes) -> List[dict]:
    """`data` cut into pieces of at most IDL_CHUNK_BYTES, at line ends where it can be; each
    piece as its lines (for one C literal per line) and its size."""
    lines = data.splitlines(keepends=True)
    chunks: List[dict] = []
    cur: List[bytes] = []
    size = 0
    for line in lines:
        while len(line) > IDL_CHUNK_BYTES:
            if cur:
                chunks.append({"lines": cur, "len": size})
                cur, size = [], 0
            chunks.append({"lines": [line[:IDL_CHUNK_BYTES]], "len": IDL_CHUNK_BYTES})
            line = line[IDL_CHUNK_BYTES:]
        if size + len(line) > IDL_CHUNK_BYTES:
            chunks.append({"lines": cur, "len": size})
            cur, size = [], 0
        if line:
            cur.append(line)
            size += len(line)
    if cur or not chunks:
        chunks.append({"lines": cur or [b""], "len": size})
    return chunks


# What the header says of an op declared `idempotent`, below its doc comment.
IDEMPOTENT_NOTE = (
    "Idempotent: running it twice does what running it once does, so the",
    "client retries it after a timeout or a failure after the request left",
    "when its retry policy allows (ctl_client_options.retry; CTL_OP_IDEMPOTENT",
    "in its descriptor's flags).",
)


def op_flags(op: m.Op) -> str:
    """The CTL_OP_* flags of an op's descriptors, as a C expression ("" for none)."""
    flags = []
    if op.no_reply:
        flags.append("CTL_OP_NOREPLY")
    if op.idempotent:
        flags.append("CTL_OP_IDEMPOTENT")
    return " | ".join(flags)


def has_views(t: Optional[m.Type]) -> bool:
    """Whether a decoded value of `t` points into the message (strings, bins) or into memory
    owned by the reply (arrays): then a client must keep the reply while it uses the value."""
    if t is None:
        return False
    if isinstance(t, m.Scalar):
        return t.name in ("str", "bin")
    return True


def scalar_literal(v: m.Value, name: str) -> str:
    if name == "bool":
        return "true" if v.value else "false"
    if name in ("i32", "i64", "u32", "u64"):
        n = int(v.value)
        if name == "i64" and n == -(2 ** 63):
            return "INT64_MIN"
        if name == "i32" and n == -(2 ** 31):
            return "INT32_MIN"
        macro = {"i32": "INT32_C", "i64": "INT64_C", "u32": "UINT32_C", "u64": "UINT64_C"}[name]
        return f"{macro}({n})"
    if name == "f64":
        text = repr(float(v.value))
        if "inf" in text or "nan" in text:
            raise AssertionError("non-finite f64 defaults are rejected by check")
        if not any(ch in text for ch in ".e"):
            text += ".0"
        return text
    raise AssertionError(f"no scalar literal for {name}")


def c_string(data) -> str:
    """A C string literal of the bytes `data` (str is UTF-8 encoded). Printable ASCII stays as
    is, except the characters that could end the literal, start an escape or a trigraph; all
    else becomes a three-digit octal escape, which never swallows the next character."""
    if isinstance(data, str):
        data = data.encode()
    out = []
    for b in data:
        ch = chr(b)
        if ch in '"\\?':
            out.append("\\" + ch)
        elif 0x20 <= b < 0x7F:
            out.append(ch)
        else:
            out.append("\\%03o" % b)
    return '"' + "".join(out) + '"'


def comment_text(text: Optional[str]) -> List[str]:
    """Doc text as lines safe inside a C block comment (see comment_inline)."""
    if not text:
        return []
    return [comment_inline(line).rstrip() for line in text.split("\n")]


def comment_inline(text: str) -> str:
    """User text (a doc line, a default as written, a path, a file name) made safe to copy into
    a C block comment, on one line: the one escape every generated comment goes through.
    `*/` and `/*` are broken up, `??` too (a trigraph, and `??/` a line splice under
    -std=c11); control, format (bidi controls included) and separator characters, and bytes
    of a file name that are not UTF-8, become `\\uHHHH`/`\\xHH` (diag.printable); a trailing
    backslash, which would splice the next line, becomes `\\x5c`."""
    safe = printable(text)
    safe = safe.replace("*/", "* /").replace("/*", "/ *")
    while "??" in safe:
        safe = safe.replace("??", "? ?")
    if safe.endswith("\\"):
        safe = safe[:-1] + "\\x5c"
    return safe


def char_array(data: bytes) -> str:
    """The initializer of a char array holding `data`: character constants, 12 a line."""
    items = []
    for b in data:
        ch = chr(b)
        if ch in "'\\":
            items.append("'\\" + ch + "'")
        elif 0x20 <= b < 0x7F:
            items.append(f"'{ch}'")
        else:
            items.append("'\\%03o'" % b)
    lines = [", ".join(items[i:i + 12]) for i in range(0, len(items), 12)]
    return "{\n    " + ",\n    ".join(lines) + "\n}"


NAME_MAX = 255  # the longest file name (bytes) Linux's file systems take


def write_if_changed(path: str, text: str) -> str:
    """Write `text` to `path` unless it already holds exactly that. The bytes go to a temporary
    file of its own in the same directory, renamed over `path` once complete: a reader (or a
    build that stops midway) never sees half a file, and generator runs writing the same
    directory at once never share a temporary file. The result has the mode a plain open()
    would give a new file (0666 less the umask)."""
    data = text.encode()
    directory, name = os.path.split(path)
    size = len(os.fsencode(name))
    if size > NAME_MAX:
        raise FatalError(f"cannot write {path}: its file name is {size} bytes, more than a "
                         f"file name may have ({NAME_MAX})")
    try:
        with open(path, "rb") as f:
            if f.read() == data:
                return path
    except FileNotFoundError:
        pass
    except OSError as e:
        raise FatalError(f"cannot read {path}: {e.strerror}") from None
    tmp = None
    try:
        # (A name of its own, not the target's: that may be as long as a name can be.)
        fd, tmp = tempfile.mkstemp(dir=directory or ".", prefix=".ctlrpc-gen-", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o666 & ~_umask())
            f.write(data)
        os.replace(tmp, path)
        tmp = None
    except OSError as e:
        raise FatalError(f"cannot write {path}: {e.strerror}") from None
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
    return path


_UMASK: Optional[int] = None


def _umask() -> int:
    """The process's umask (read once: os.umask can only be read by setting it)."""
    global _UMASK
    if _UMASK is None:
        _UMASK = os.umask(0o022)
        os.umask(_UMASK)
    return _UMASK


def write_depfile(depfile: str, outputs: Iterable[str], inputs: Iterable[str]) -> None:
    """A Makefile-style depfile: every output depends on every IDL file read."""
    def esc(p: str) -> str:
        return (os.path.abspath(p).replace("\\", "\\\\").replace(" ", "\\ ")
                .replace("#", "\\#").replace("$", "$$"))

    # One rule per output, each naming every input. (A rule that makes one output depend
    # on another would be a dependency cycle to Ninja, which builds both in one edge.)
    deps = " \\\n  ".join(esc(p) for p in inputs)
    text = "".join(esc(out) + ": " + deps + "\n" for out in outputs)
    write_if_changed(depfile, text)


def render(model: m.Model, out_dir: str, display_root: Optional[str] = None,
           depfile: Optional[str] = None) -> List[str]:
    """Render `model` into `out_dir` (created if missing). Raises FatalError when the
    directory cannot be made or written."""
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as e:
        raise FatalError(f"cannot create output directory {out_dir}: {e.strerror}") from None
    stem = cnames.stem_of(model.path)
    paths = Renderer(model, display_root).render(out_dir, stem)
    if depfile:
        write_depfile(depfile, paths, model.files)
    return paths
