"""The Python render stage: a checked model -> `<service>_ctl.py`, through one jinja2 template.

`ctlrpc-gen --lang python IDL -o DIR` uses it (the C renderer, render.py, stays the default).
The generated module holds a dataclass per record, an exception class per declared error kind,
a `Client` with one method per op (and `<op>_many`), its asyncio twin `AsyncClient` (the same
methods as coroutines), a `Handlers` base class and `serve()`, on
top of the pure-Python runtime (`ctlrpc`, runtime/python). It carries its own small codec: the
type descriptors of the service and the code that checks, encodes and decodes values by them,
producing the same bytes as the C stubs (see docs/PYTHON.md, "Generated modules").

This module decides what the model leaves open for Python:

- Python names (`py_names`). IDL names are used as they are, except where that would be invalid
  Python or would collide with a name the generated code itself needs; then the Python name gets
  a trailing `_` (more than one if that is taken too). The wire name never changes. The rules:
  records (module level, and named in annotations that may precede them): Python keywords,
  every builtin, the module's own public names (`AsyncClient`, `Client`, `Handlers`, `serve`,
  `SERVICE`) and the clients' methods (`close`, `rpc`, `<op>_many`); error kinds (module
  level): keywords, the builtins the module uses, and its public names; ops (methods of Client,
  AsyncClient and Handlers): keywords, the clients' own attributes (`close`, `rpc`) and the
  scalar types' names (`str`, `int`, ...: the class bodies spell types by them);
  arguments (parameters): keywords and the methods' own parameters (`self`, `address`,
  `addresses`, `timeout`; an argument named like a type its op returns keeps its name, and
  the method's body spells that type `_b.bytes`, or `_R_<record>` for a record); fields
  (dataclass attributes):
  keywords, `self` and the record class names (a class attribute would shadow them in the
  annotations of its class; a field named like a scalar type, `bytes`, makes that class spell
  the type `_b.bytes` instead).
- Python spellings: type annotations (`py_type`, with inputs accepting any sequence or mapping),
  default values as literals (`py_literal`), doc comments as docstrings (`docstring`).
"""

from __future__ import annotations

import os
from typing import Dict, Iterable, List, Optional, Set

from . import model as m
from .diag import FatalError, printable
from .render import (NAME_MAX, display_path, idl_hash, read_idl_files, template_env,
                     write_depfile, write_if_changed)

# Python keywords (soft keywords such as `match` are valid names). A fixed list, so the output
# does not depend on the Python that runs the generator.
_KEYWORDS = frozenset((
    "False", "None", "True", "and", "as", "assert", "async", "await", "break", "class",
    "continue", "def", "del", "elif", "else", "except", "finally", "for", "from", "global", "if",
    "import", "in", "is", "lambda", "nonlocal", "not", "or", "pass", "raise", "return", "try",
    "while", "with", "yield"))
# The builtins the generated module uses: a record or an error kind (a module name) must not
# shadow them. tests/pygen's test_generated checks that every builtin a generated module
# names is here.
_BUILTINS = frozenset((
    "bool", "int", "float", "str", "bytes", "bytearray", "memoryview", "list", "tuple", "dict",
    "object", "type", "isinstance", "hasattr", "len", "getattr", "repr", "super", "enumerate",
    "zip", "range", "reversed", "chr", "property", "BaseException", "Exception", "TypeError",
    "ValueError", "OverflowError", "NotImplementedError"))
# Every builtin of Python 3.8 to 3.13 (a fixed list: the output must not depend on the Python
# that runs the generator). A record is named in annotations that may come before its class,
# and mypy takes a name not yet defined for the builtin of that name: a record may shadow none.
_ALL_BUILTINS = frozenset((
    "ArithmeticError", "AssertionError", "AttributeError", "BaseException",
    "BaseExceptionGroup", "BlockingIOError", "BrokenPipeError", "BufferError", "BytesWarning",
    "ChildProcessError", "ConnectionAbortedError", "ConnectionError", "ConnectionRefusedError",
    "ConnectionResetError", "DeprecationWarning", "EOFError", "Ellipsis", "EncodingWarning",
    "EnvironmentError", "Exception", "ExceptionGroup", "FileExistsError", "FileNotFoundError",
    "FloatingPointError", "FutureWarning", "GeneratorExit", "IOError", "ImportError",
    "ImportWarning", "IndentationError", "IndexError", "InterruptedError", "IsADirectoryError",
    "KeyError", "KeyboardInterrupt", "LookupError", "MemoryError", "ModuleNotFoundError",
    "NameError", "NotADirectoryError", "NotImplemented", "NotImplementedError", "OSError",
    "OverflowError", "PendingDeprecationWarning", "PermissionError", "ProcessLookupError",
    "PythonFinalizationError", "RecursionError", "ReferenceError", "ResourceWarning",
    "RuntimeError", "RuntimeWarning", "StopAsyncIteration", "StopIteration", "SyntaxError",
    "SyntaxWarning", "SystemError", "SystemExit", "TabError", "TimeoutError", "TypeError",
    "UnboundLocalError", "UnicodeDecodeError", "UnicodeEncodeError", "UnicodeError",
    "UnicodeTranslateError", "UnicodeWarning", "UserWarning", "ValueError", "Warning",
    "ZeroDivisionError", "abs", "aiter", "all", "anext", "any", "ascii", "bin", "bool",
    "breakpoint", "bytearray", "bytes", "callable", "chr", "classmethod", "compile", "complex",
    "copyright", "credits", "delattr", "dict", "dir", "divmod", "enumerate", "eval", "exec",
    "exit", "filter", "float", "format", "frozenset", "getattr", "globals", "hasattr", "hash",
    "help", "hex", "id", "input", "int", "isinstance", "issubclass", "iter", "len", "license",
    "list", "locals", "map", "max", "memoryview", "min", "next", "object", "oct", "open", "ord",
    "pow", "print", "property", "quit", "range", "repr", "reversed", "round", "set", "setattr",
    "slice", "sorted", "staticmethod", "str", "sum", "super", "tuple", "type", "vars", "zip"))
MODULE_NAMES = frozenset({"AsyncClient", "Client", "Handlers", "serve", "SERVICE"})
# An op is a method of the clients and Handlers, whose class bodies spell the scalar types
# (`address: str`, `-> int`) by their builtin names: a method of that name would shadow them.
CLIENT_ATTRS = frozenset({"close", "rpc", "bool", "int", "float", "str", "bytes"})
PARAM_NAMES = frozenset({"self", "address", "addresses", "timeout"})
SCALAR_PY = {
    "bool": "bool",
    "i32": "int", "i64": "int", "u32": "int", "u64": "int",
    "f64": "float",
    "str": "str",
    "bin": "bytes",
}


def _free(name: str, reserved: Iterable[str], taken: Set[str]) -> str:
    """`name`, or `name` with trailing underscores until it is neither reserved nor taken."""
    reserved = set(reserved)
    out = name
    if out in reserved or out in _KEYWORDS:
        out += "_"
    while out in reserved or out in taken or out in _KEYWORDS:
        out += "_"
    taken.add(out)
    return out


class PyNames:
    """The Python name of every record, error kind, op, argument and field of a model."""

    def __init__(self, model: m.Model) -> None:
        taken: Set[str] = set()
        # A record is also named in the clients' class bodies (their annotations), beside
        # their methods: `close`, `rpc` and each op's `<op>_many` (an op's own name is never a
        # record's: the IDL keeps them apart).
        reserved_records = _ALL_BUILTINS | MODULE_NAMES | CLIENT_ATTRS | \
            {o.name + "_many" for o in model.ops}
        self.records = {r.name: _free(r.name, reserved_records, taken) for r in model.records}
        self.errors = {e.name: _free(e.name, _BUILTINS | MODULE_NAMES, taken)
                       for e in model.errors}
        ops_taken: Set[str] = set()
        self.ops = {o.name: _free(o.name, CLIENT_ATTRS, ops_taken) for o in model.ops}
        self.args: Dict[str, Dict[str, str]] = {}
        for o in model.ops:
            names: Set[str] = set()
            self.args[o.name] = {a.name: _free(a.name, PARAM_NAMES, names) for a in o.args}
        field_reserved = {"self"} | set(self.records.values())
        self.fields: Dict[str, Dict[str, str]] = {}
        for r in model.records:
            names = set()
            self.fields[r.name] = {f.name: _free(f.name, field_reserved, names)
                                   for f in r.fields}


class PyRenderer:
    def __init__(self, model: m.Model, display_root: Optional[str] = None) -> None:
        self.model = model
        self.names = PyNames(model)
        self.tvars = self._tvars()
        self.display_root = display_root
        self.env = template_env()
        f = self.env.filters
        f["py_type"] = self.py_type
        f["in_type"] = self.in_type
        f["out_type"] = self.out_type
        f["field_in_type"] = self.field_in_type
        f["py_literal"] = py_literal
        f["wire_literal"] = wire_literal
        f["pyrepr"] = repr
        f["tvar"] = self.tvar
        g = self.env.globals
        g["m"] = m
        g["names"] = self.names
        g["isinstance"] = isinstance
        g["docstring"] = docstring
        g["op_doc"] = self.op_doc
        g["record_doc"] = self.record_doc
        g["values_tuple"] = self.values_tuple
        g["shadow"] = self.shadow
        g["body_shadow"] = self.body_shadow
        g["record_aliases"] = self.record_aliases

    # -- types ----------------------------------------------------------------------------

    def py_type(self, t: m.Type, shadow: Iterable[str] = ()) -> str:
        """The annotation of a decoded value: `int`, `_t.List[str]`, `_t.Optional[BlobInfo]`.
        Scalar type names in `shadow` (a record's fields of those names would shadow them in its
        class body) are spelled `_b.bytes`."""
        if isinstance(t, m.Scalar):
            py = SCALAR_PY[t.name]
            return f"_b.{py}" if py in shadow else py
        if isinstance(t, m.ListOf):
            return f"_t.List[{self.py_type(t.elem, shadow)}]"
        if isinstance(t, m.MapOf):
            return f"_t.Dict[{self.py_type(m.Scalar('str'), shadow)}, " \
                   f"{self.py_type(t.value, shadow)}]"
        if isinstance(t, m.OptionalOf):
            return f"_t.Optional[{self.py_type(t.inner, shadow)}]"
        py = self.names.records[t.name]
        return f"_R_{py}" if py in shadow else py

    def in_type(self, t: m.Type) -> str:
        """The annotation of a value given to the generated code (an argument, a handler's
        result): any sequence for a list, any mapping for a map, at every depth."""
        if isinstance(t, m.ListOf):
            return f"_t.Sequence[{self.in_type(t.elem)}]"
        if isinstance(t, m.MapOf):
            return f"_t.Mapping[str, {self.in_type(t.value)}]"
        if isinstance(t, m.OptionalOf):
            return f"_t.Optional[{self.in_type(t.inner)}]"
        return self.py_type(t)

    def out_type(self, t: Optional[m.Type]) -> str:
        return "None" if t is None else self.py_type(t)

    def field_in_type(self, t: m.Type, shadow: Iterable[str] = ()) -> str:
        """A record constructor's parameter: a list field takes any sequence of its element type
        (it is copied into a list), a map field any mapping."""
        if isinstance(t, m.ListOf):
            return f"_t.Sequence[{self.py_type(t.elem, shadow)}]"
        if isinstance(t, m.MapOf):
            return f"_t.Mapping[{self.py_type(m.Scalar('str'), shadow)}, " \
                   f"{self.py_type(t.value, shadow)}]"
        if isinstance(t, m.OptionalOf) and isinstance(t.inner, (m.ListOf, m.MapOf)):
            return f"_t.Optional[{self.field_in_type(t.inner, shadow)}]"
        return self.py_type(t, shadow)

    def shadow(self, r: m.Record) -> List[str]:
        """The scalar type names a record's fields shadow in its class body."""
        return sorted(set(self.names.fields[r.name].values()) & set(SCALAR_PY.values()))

    def body_shadow(self, op: m.Op) -> List[str]:
        """The names an op's arguments and its method's own parameters (`timeout`, ...)
        shadow in the method's body, where its result type is spelled: scalar type names
        (spelled `_b.str`) and record class names (spelled `_R_<record>`, a module alias of
        the class: `record_aliases`)."""
        return sorted(set(self.names.args[op.name].values()) | PARAM_NAMES)

    def record_aliases(self) -> List[str]:
        """The records some op's argument shadows where the op's result spells them, in model
        order: each gets a module alias `_R_<record>`."""
        shadowed: Set[str] = set()
        for op in self.model.ops:
            if op.result is not None:
                shadowed |= {self.names.records[n] for n in _records_in(op.result)} & \
                    set(self.body_shadow(op))
        return [self.names.records[r.name] for r in self.model.records
                if self.names.records[r.name] in shadowed]

    def tname(self, t: m.Type) -> str:
        if isinstance(t, m.Scalar):
            return t.name
        if isinstance(t, m.ListOf):
            return "list_" + self.tname(t.elem)
        if isinstance(t, m.MapOf):
            return "map_" + self.tname(t.value)
        if isinstance(t, m.OptionalOf):
            return "opt_" + self.tname(t.inner)
        return t.name

    def tvar(self, t: m.Type) -> str:
        """The module variable holding the descriptor of `t` (`_T_list_str`): `_T_` and its
        spelled name, with trailing `_` where two types would spell the same (a record named
        `opt_R` and `R?`: the record keeps `_T_opt_R`), decided once over the model's types in
        their order."""
        return self.tvars[t]

    def _tvars(self) -> Dict[m.Type, str]:
        out: Dict[m.Type, str] = {}
        taken: Set[str] = set()
        # Scalars and records first: theirs are `_T_<name>` always (the template's own).
        types = [m.Scalar(s) for s in m.SCALARS] + \
            [m.RecordRef(r.name) for r in self.model.records] + list(self.model.types)
        for t in types:
            if t in out:
                continue
            name = "_T_" + self.tname(t)
            while name in taken:
                name += "_"
            taken.add(name)
            out[t] = name
        return out

    # -- docs -----------------------------------------------------------------------------

    def op_doc(self, op: m.Op, side: str) -> List[str]:
        """The docstring lines of an op's method: its doc comment, its declaration, the docs
        of its arguments, and what it raises."""
        lines: List[str] = []
        if op.doc:
            lines += op.doc.splitlines()
            lines.append("")
        lines.append(f"IDL: ``{op.idl}``")
        arg_docs = [(self.names.args[op.name][a.name], a) for a in op.args if a.doc]
        if arg_docs:
            lines += ["", "Args:"]
            for py, a in arg_docs:
                doc = a.doc.splitlines()
                lines.append(f"    {py}: {doc[0]}")
                lines += [f"        {line}" if line else "" for line in doc[1:]]
        if op.idempotent and side == "client":
            lines += ["", "Idempotent: running it twice does what running it once does, so it is "
                      "retried after", "a timeout or a failure after the request left when the "
                      "client's retry policy", "allows (ctlrpc.RetryPolicy)."]
        elif op.idempotent:
            lines += ["", "Idempotent: a retried call may run it more than once, and running it "
                      "twice must do", "what running it once does."]
        if side == "client":
            if op.notify:
                lines += ["", "A notify op: returns once the message is queued; the unit "
                          "sends no reply."]
            elif op.raises:
                lines += ["", "Raises: " + ", ".join(self.kind_class(k) for k in op.raises)
                          + " (and ctlrpc.Transfer)."]
        elif op.raises:
            lines += ["", "May raise: " + ", ".join(self.kind_class(k) for k in op.raises)
                      + " (any other kind is answered as a Protocol error)."]
        return lines

    def values_tuple(self, op: m.Op) -> str:
        """The tuple of an op's argument values in IDL order, as the method passes it on."""
        names = [self.names.args[op.name][a.name] for a in op.args]
        if len(names) == 1:
            return f"({names[0]},)"
        return "(" + ", ".join(names) + ")"

    def kind_class(self, kind: str) -> str:
        if kind in m.ERROR_KINDS:
            return f"ctlrpc.{kind}"
        return self.names.errors[kind]

    def record_doc(self, r: m.Record) -> List[str]:
        lines = r.doc.splitlines() if r.doc else [f"The record {r.name}."]
        return lines

    # -- output ---------------------------------------------------------------------------

    def display(self, path: str) -> str:
        return display_path(path, self.display_root)

    def idl_sources(self) -> tuple:
        """Every IDL file read (main first) as the module embeds it for _describe: (display
        path, its text as Python string literals, one per line), and the hash of their bytes
        (render.py's rule, the C stubs' hash)."""
        texts = read_idl_files(self.model.files)
        files = [(self.display(path),
                  [repr(line) for line in data.decode("utf-8").splitlines(keepends=True) or [""]])
                 for path, data in zip(self.model.files, texts)]
        return files, idl_hash(texts)

    def render(self, out_dir: str) -> List[str]:
        model = self.model
        descs = [t for t in model.types if not isinstance(t, (m.Scalar, m.RecordRef))]
        idl_files, idl_sha256 = self.idl_sources()
        text = self.env.get_template("python.py.j2").render(
            model=model, svc=model.service.name, idl_path=self.display(model.path),
            descs=descs, scalars=[m.Scalar(s) for s in m.SCALARS], idl_files=idl_files,
            idl_sha256=idl_sha256)
        name = f"{model.service.name}_ctl.py"
        return [write_if_changed(os.path.join(out_dir, name), text)]

    def check_module_name(self) -> None:
        """The module's file name, `<service>_ctl.py`, must be a name a file may have."""
        svc = self.model.service
        size = len(f"{svc.name}_ctl.py".encode())
        if size > NAME_MAX:
            loc = svc.loc
            raise FatalError(f"{loc.path}:{loc.line}:{loc.col}: service '{svc.name[:40]}...' "
                             f"is too long a name for Python: its module {svc.name[:8]}..._ctl.py "
                             f"would be a file name of {size} bytes, more than the "
                             f"{NAME_MAX} a file name may have (at most "
                             f"{NAME_MAX - len('_ctl.py')} characters)")


def _records_in(t: m.Type) -> Set[str]:
    """The names of the records type `t` spells (a list's element, a map's value, ...)."""
    if isinstance(t, m.RecordRef):
        return {t.name}
    if isinstance(t, m.ListOf):
        return _records_in(t.elem)
    if isinstance(t, m.MapOf):
        return _records_in(t.value)
    if isinstance(t, m.OptionalOf):
        return _records_in(t.inner)
    return set()


def py_literal(v: m.Value, t: m.Type) -> str:
    """A default as a Python literal of the argument's input type (an empty tuple for a list,
    `_NO_ENTRIES` for a map, so no default is a shared mutable object)."""
    if v.kind == "null":
        return "None"
    if isinstance(t, m.OptionalOf):
        t = t.inner
    if isinstance(t, m.ListOf):
        return "()"
    if isinstance(t, m.MapOf):
        return "_NO_ENTRIES"
    assert isinstance(t, m.Scalar)
    if t.name == "bool":
        return "True" if v.value else "False"
    if t.name == "f64":
        return repr(float(v.value))  # type: ignore[arg-type]
    if t.name == "bin":
        data = v.value if isinstance(v.value, bytes) else str(v.value).encode()
        return repr(data)
    if t.name == "str":
        return repr(v.value)
    return repr(int(v.value))  # type: ignore[call-overload]


def wire_literal(v: m.Value, t: m.Type) -> str:
    """A default as it goes on the wire (what an encoded argument is compared with, and what
    a decoder fills in): `[]` and `{}` for containers, a float for an f64."""
    if v.kind == "list":
        return "[]"
    if v.kind == "map":
        return "{}"
    return py_literal(v, t)


def docstring(lines: Iterable[str], indent: str) -> str:
    """A docstring of `lines` indented by `indent` (the first line right after the quotes),
    escaped so that no doc text can end it or start an escape."""
    lines = [line.rstrip() for line in lines]
    while lines and not lines[-1]:
        lines.pop()
    # Backslashes first; then control, format (bidi controls included) and separator
    # characters as escapes (diag.printable, as the C comments have them): the docstring's
    # value keeps them, its source shows them.
    text = "\n".join(printable(line.replace("\\", "\\\\")) for line in lines)
    text = text.replace('"""', '\\"\\"\\"')
    if text.endswith('"'):
        text = text[:-1] + '\\"'
    body = "\n".join((indent + line) if (line and i) else line
                     for i, line in enumerate(text.split("\n")))
    if "\n" in body:
        return f'"""{body}\n{indent}"""'
    return f'"""{body}"""'


def render(model: m.Model, out_dir: str, display_root: Optional[str] = None,
           depfile: Optional[str] = None) -> List[str]:
    """Render `model` into `out_dir/<service>_ctl.py` (the directory is created if missing)."""
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as e:
        raise FatalError(f"cannot create output directory {out_dir}: {e.strerror}") from None
    renderer = PyRenderer(model, display_root)
    renderer.check_module_name()
    paths = renderer.render(out_dir)
    if depfile:
        write_depfile(depfile, paths, model.files)
    return paths
