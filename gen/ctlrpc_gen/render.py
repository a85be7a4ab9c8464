"""The render stage: a checked model -> C files, through jinja2 templates.

This is the only module that imports jinja2. It decides two things the model leaves open, both
as template filters and globals, never by building C in Python:

- C names. Everything a service generates starts with the service name: records become
  `<service>_<Record>` (the IDL spelling kept, so they cannot collide with the lowercase
  container types), containers `<service>_list_<T>`, `<service>_map_<T>`, `<service>_opt_<T>`,
  and each op `<service>_<op>` with `_args`, `_outcome`, `_many`. File-local helpers are static
  and named `<service>__...` (double underscore).
- C spellings of values: integer literals with their width (`UINT64_C(5)`), strings escaped for
  C (octal escapes for anything outside printable ASCII, so a `??` trigraph or a `*/` cannot
  appear), defaults as brace initializers (constant expressions, so they can initialize the
  static defaults the runtime compares against and the `<SVC>_<NAME>_INIT` macros), and doc
  comments made safe to sit inside `/* */`.
- Type descriptors: each list, map, optional and record type has one constant `ctl_type`
  (`<service>__t_<fragment>`), each op one `ctl_op_desc` (`<service>__op_<op>`); `tref` names
  the descriptor of a type (`&ctl_type_u64` for scalars).

Outputs are deterministic (no timestamps, no absolute paths) and written only when their bytes
change, so a build that regenerates without a change does not recompile.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from typing import Dict, Iterable, List, Optional

import jinja2

from . import model as m
from .diag import FatalError

TEMPLATES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "templates")

# Bump together with CTL_GEN_ABI in runtime/include/ctlrpc/gen.h.
GEN_ABI = 3

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
        self.env = jinja2.Environment(
            loader=jinja2.FileSystemLoader(TEMPLATES),
            undefined=jinja2.StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
            keep_trailing_newline=True,
            autoescape=False,
        )
        f = self.env.filters
        f["ctype"] = self.ctype
        f["tname"] = self.tname
        f["decl"] = self.decl
        f["init_value"] = self.init_value
        f["c_string"] = c_string
        f["comment"] = comment_text
        f["display"] = self.display
        f["tref"] = self.tref
        f["macro"] = macro_name
        g = self.env.globals
        g["m"] = m
        g["svc"] = self.svc
        g["SVC"] = self.svc.upper()
        g["GEN_ABI"] = GEN_ABI
        g["isinstance"] = isinstance
        g["has_views"] = has_views
        g["initializers"] = self.initializers
        # Declared error kinds some op raises: they get a descriptor in the .c.
        g["raised_errors"] = [e for e in model.errors
                              if any(e.name in op.raises_declared for op in model.ops)]

    # -- names ----------------------------------------------------------------------------

    def tname(self, t: m.Type) -> str:
        """A type's part of C names: `u64`, `list_str`, `map_opt_u64`, `BlobInfo`."""
        if isinstance(t, m.Scalar):
            return t.name
        if isinstance(t, m.ListOf):
            return "list_" + self.tname(t.elem)
        if isinstance(t, m.MapOf):
            return "map_" + self.tname(t.value)
        if isinstance(t, m.OptionalOf):
            return "opt_" + self.tname(t.inner)
        return t.name

    def ctype(self, t: m.Type) -> str:
        """The C type that holds a value of `t` (an optional record is a pointer, NULL if
        absent; other optionals are `{present, value}` structs)."""
        if isinstance(t, m.Scalar):
            return _SCALAR_C[t.name]
        if isinstance(t, m.OptionalOf) and isinstance(t.inner, m.RecordRef):
            return f"const {self.svc}_{t.inner.name} *"
        return f"{self.svc}_{self.tname(t)}"

    def decl(self, t: m.Type, name: str) -> str:
        """`ctype name`, spaced for pointers: `uint64_t size`, `const x_Node *next`."""
        c = self.ctype(t)
        return f"{c}{name}" if c.endswith("*") else f"{c} {name}"

    def display(self, path: str) -> str:
        """An IDL path as shown in generated files: relative to the display root, never
        absolute."""
        if self.display_root:
            rel = os.path.relpath(os.path.abspath(path), os.path.abspath(self.display_root))
            if not rel.startswith(".."):
                return rel.replace(os.sep, "/")
        if os.path.isabs(path):
            return os.path.basename(path)
        return path.replace(os.sep, "/")

    def tref(self, t: m.Type) -> str:
        """A pointer to the descriptor of `t`: the runtime's for scalars, the generated one's
        for the rest."""
        if isinstance(t, m.Scalar):
            return f"&ctl_type_{t.name}"
        return f"&{self.svc}__t_{self.tname(t)}"

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
                out.append((mem.name, macro_name(f"{self.svc}_{mem.type.name}_INIT")))
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

    # -- output ---------------------------------------------------------------------------

    def idl_sources(self):
        """Every IDL file read (main first), as the .c embeds it for _describe: display path,
        bytes in chunks, size; and their hash. The bytes are read again here: the same files,
        in the same run, that the parser just read."""
        files, texts = [], []
        for path in self.model.files:
            try:
                with open(path, "rb") as f:
                    data = f.read()
            except OSError as e:
                raise FatalError(f"cannot read {path}: {e.strerror}") from None
            texts.append(data)
            files.append({"path": self.display(path), "chunks": idl_chunks(data),
                          "len": len(data)})
        return files, idl_hash(texts)

    def render(self, out_dir: str, stem: str) -> List[str]:
        """Render the header and the source into `out_dir`; returns the paths written or
        already up to date."""
        model = self.model
        ctx = dict(
            model=model,
            stem=stem,
            header=f"{stem}.ctl.h",
            guard=re.sub(r"[^A-Za-z0-9]", "_", f"{stem}_CTL_H").upper(),
            idl_path=self.display(model.path),
            containers=[t for t in model.types
                        if isinstance(t, (m.ListOf, m.MapOf))
                        or (isinstance(t, m.OptionalOf)
                            and not isinstance(t.inner, m.RecordRef))],
            maps=[t for t in model.types if isinstance(t, m.MapOf)],
            codec_types=[t for t in model.types if not isinstance(t, m.RecordRef)],
        )
        ctx["idl_files"], ctx["idl_sha256"] = self.idl_sources()
        paths = []
        for template, name in (("header.h.j2", f"{stem}.ctl.h"), ("source.c.j2", f"{stem}.ctl.c")):
            text = self.env.get_template(template).render(**ctx)
            paths.append(write_if_changed(os.path.join(out_dir, name), text))
        return paths


# The longest piece of an IDL file in one C string literal: C11 guarantees 4095 characters
# per literal (-pedantic warns beyond).
IDL_CHUNK_BYTES = 4000


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


def macro_name(name: str) -> str:
    """A C macro name: the identifier in upper case (`storage_put_ARGS_INIT` ->
    `STORAGE_PUT_ARGS_INIT`). Names never differ only in case (check), so these stay unique."""
    return name.upper()


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
    """Doc text as lines safe inside a C block comment (no `*/`, no trigraphs)."""
    if not text:
        return []
    safe = text.replace("*/", "* /").replace("/*", "/ *")
    while "??" in safe:
        safe = safe.replace("??", "? ?")
    return [line.rstrip() for line in safe.splitlines()]


def write_if_changed(path: str, text: str) -> str:
    """Write `text` to `path` unless it already holds exactly that. The bytes go to a temporary
    file of its own in the same directory, renamed over `path` once complete: a reader (or a
    build that stops midway) never sees half a file, and generator runs writing the same
    directory at once never share a temporary file. The result has the mode a plain open()
    would give a new file (0666 less the umask)."""
    data = text.encode()
    try:
        with open(path, "rb") as f:
            if f.read() == data:
                return path
    except FileNotFoundError:
        pass
    except OSError as e:
        raise FatalError(f"cannot read {path}: {e.strerror}") from None
    directory, name = os.path.split(path)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=directory or ".", prefix=f".{name}.", suffix=".tmp")
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
        return os.path.abspath(p).replace("\\", "\\\\").replace(" ", "\\ ").replace("#", "\\#")

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
    stem = os.path.splitext(os.path.basename(model.path))[0]
    paths = Renderer(model, display_root).render(out_dir, stem)
    if depfile:
        write_depfile(depfile, paths, model.files)
    return paths
