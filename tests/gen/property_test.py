"""Property: whatever valid IDL it is given, ctlrpc-gen emits C that compilers accept, and a
Python module that imports (and, for the first cases, passes mypy --strict).

A seeded generator writes random IDL that is valid by construction (records of every type,
nested containers and optionals, records referring to each other in any declaration order,
defaults of every kind at the extremes of their ranges, hostile strings and doc comments,
identifiers near the names C, C++ and the headers reserve, an imported file under a hostile
path, file names starting with a digit or holding spaces, '*/' or non-ASCII letters). Each case
runs ctlrpc-gen; then every C compiler installed (gcc, clang as C11; g++, clang++ as C++11, the
header only) checks all generated pairs under -Wall -Wextra -Werror -pedantic. Each accepted
case is generated for Python too; the modules are imported in one child process (with the
Python runtime, when pyzmq and msgpack are there) and the first PY_MYPY of them go through
mypy --strict when it is installed.

A case may be refused only with clean diagnostics (status 1, no traceback): some random names
do meet a reserved one, and the generator must say so, not emit broken C. Most cases must pass.

    CTLRPC_PROPERTY_CASES=5000 CTLRPC_PROPERTY_SEED=7 python3 tests/gen/property_test.py

The seed, the failing case's IDL and the compiler's message are printed on failure; rerun with
that seed to reproduce. Defaults: 300 cases, seed 20240611. This file is not named test_*.py:
it runs as its own ctest (gen_property), not inside gen_unittest.
"""

import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import ccompile  # noqa: E402
import support  # noqa: E402

SEED = int(os.environ.get("CTLRPC_PROPERTY_SEED", "20240611"))
CASES = int(os.environ.get("CTLRPC_PROPERTY_CASES", "300"))
BATCH = 100
PY_MYPY = 12
PY_IMPORT = """
import importlib.util, sys
for i, path in enumerate(sys.argv[1:]):
    spec = importlib.util.spec_from_file_location(f"case_mod{i}", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # (dataclasses look their module up there)
    try:
        spec.loader.exec_module(mod)
        assert mod.Client and mod.Handlers and mod.serve, "no Client, Handlers or serve"
    except BaseException as e:
        print(path)
        print(f"{type(e).__name__}: {e}")
        sys.exit(1)
"""

WORDS = ["a", "b", "key", "size", "data", "value", "items", "count", "error", "result",
         "reply", "ctx", "h", "args", "opt", "entry", "init", "INIT", "handler", "handlers",
         "list", "map", "str", "op", "record", "service", "import", "raises", "notify",
         "idempotent", "true",
         "false", "null", "time", "index", "signal", "errno", "sched", "va", "yield", "X1",
         "a__b", "Zz_9", "present", "outcome", "many", "serve", "client_id", "stat", "EOF_",
         "SIZE", "max", "min", "abs", "free", "on", "on_x", "t", "u64x",
         # names Python takes otherwise: builtins, keywords, the generated methods' own
         "property", "chr", "range", "reversed", "hasattr", "bytes", "object", "type", "len",
         "Exception", "BaseException", "None", "lambda", "from", "self", "timeout", "address",
         "close", "rpc", "Client", "SERVICE", "R", "opt_R"]
BAD_NAMES = {"true", "false"}  # C keywords: always refused
BAD_TOP_NAMES = {"list", "map", "str", "op", "record", "service", "import", "raises", "notify",
                 "null", "handlers", "serve", "u64x_init"}
SERVICES = ["s", "svc", "storage", "sched2", "Time", "va_", "x9", "A_B", "stdio", "ctlx",
            "q" * 60]
STEMS = ["s", "9lives", "my-svc", "caf\u00e9", "two words", "x.y", "a_b", "_u", "v2"]
HOSTILE = ["*/", "/*", "\\\"", "\\\\", "\\0", "\\x01", "\\u202e", "\u202e", "\u2066", "??=",
           "??/", "\\n", "'", "\u00e9", "\U0001F600", "\\u2028", "%s", "\\t", "?", "*", "/"]
DOCS = ["plain words", "ends with */", "/* opens", "bidi \u202e\u2066 here", "trigraph ??/",
        "tab\there", "backslash \\", "\u00e9t\u00e9", "\u2028 separator"]
SCALARS = ["bool", "i32", "i64", "u32", "u64", "f64", "str", "bin"]
INT_RANGES = {"i32": (-2 ** 31, 2 ** 31 - 1), "i64": (-2 ** 63, 2 ** 63 - 1),
              "u32": (0, 2 ** 32 - 1), "u64": (0, 2 ** 64 - 1)}
FLOATS = ["0.0", "-0.0", "1.5", "-2e3", "1.7976931348623157e308", "5e-324", "2.2250738585072014e-308",
          "9007199254740992", "0.1", "1e-300", "123456789012345678901234567890.5"]


class Gen:
    """One random IDL program (a main file and maybe one imported file)."""

    def __init__(self, rng):
        self.rng = rng
        self.used = set()  # lower-case names of records and ops (one namespace)

    def ident(self, taken, top=False):
        """A name not yet in `taken` (lower-case). `top`: a record or op name, which may not be
        an IDL keyword, a built-in type or a name the generated code uses (checked rules that
        would only make the case invalid); fields and arguments may be contextual keywords."""
        rng = self.rng
        for _ in range(100):
            r = rng.random()
            if r < 0.6:
                name = rng.choice(WORDS)
            elif r < 0.9:
                name = rng.choice(WORDS) + "_" + rng.choice(WORDS)
            elif r < 0.97:
                name = "".join(rng.choice("abcXYZ_09") for _ in range(rng.randint(1, 8)))
                name = "n" + name
            else:
                name = "L" + "o" * rng.randint(100, 250)
            if name.lower() in BAD_NAMES or (top and name.lower() in BAD_TOP_NAMES):
                continue
            if name.lower() not in taken:
                taken.add(name.lower())
                return name
        n = f"n{len(taken)}"
        taken.add(n)
        return n

    def type_(self, records, by_value, depth=0):
        """A random type; `records`: names usable anywhere (inside containers and optionals),
        `by_value`: names usable as a plain field."""
        rng = self.rng
        r = rng.random()
        if depth < 3 and r < 0.25:
            inner = self.type_(records, records, depth + 1)
            t = f"list<{inner}>" if rng.random() < 0.6 else f"map<str, {inner}>"
        elif r < 0.3 and depth == 0:
            t = "list<" * 20 + "u32" + ">" * 20
        elif records and r < 0.5:
            pool = by_value if by_value else None
            if pool and rng.random() < 0.5:
                return rng.choice(pool) + ("?" if rng.random() < 0.3 else "")
            return rng.choice(records) + "?"
        else:
            t = rng.choice(SCALARS)
        if rng.random() < 0.25:
            t += "?"
        return t

    def string(self):
        rng = self.rng
        if rng.random() < 0.05:
            return '"' + "x" * rng.choice([4095, 4096, 5000]) + '"'
        return '"' + "".join(rng.choice(HOSTILE) for _ in range(rng.randint(0, 8))) + '"'

    def default(self, t):
        rng = self.rng
        if rng.random() < 0.5:
            return None
        optional = t.endswith("?") and not t.endswith(">?")
        base = t[:-1] if t.endswith("?") else t
        if t.endswith("?") and rng.random() < 0.3:
            return "null"
        if base.startswith("list<"):
            return "[]"
        if base.startswith("map<"):
            return "{}"
        if base == "bool":
            return rng.choice(["true", "false"])
        if base in INT_RANGES:
            lo, hi = INT_RANGES[base]
            v = rng.choice([lo, hi, 0, 1, -1 if lo < 0 else 2, rng.randint(lo, hi)])
            return hex(v) if v >= 0 and rng.random() < 0.3 else str(v)
        if base == "f64":
            return rng.choice(FLOATS)
        if base in ("str", "bin"):
            return self.string()
        if optional:
            return "null"
        return None  # a record: no default

    def doc(self, indent=""):
        if self.rng.random() < 0.3:
            return "".join(f"{indent}/// {self.rng.choice(DOCS)}\n"
                           for _ in range(self.rng.randint(1, 2)))
        return ""

    def members(self, records, by_value, sep, trailing):
        taken = set()
        out = []
        for _ in range(self.rng.randint(1, 5)):
            name = self.ident(taken)
            t = self.type_(records, by_value)
            d = self.default(t)
            out.append(self.doc("    ") + f"    {name}: {t}" + (f" = {d}" if d else "") + trailing)
        return sep.join(out)

    def program(self):
        rng = self.rng
        n_records = rng.randint(0, 5)
        names = [self.ident(self.used, top=True) for _ in range(n_records)]
        n_imported = rng.randint(0, n_records) if rng.random() < 0.3 else 0
        order = list(range(n_records))
        decls = {}
        for i, name in enumerate(names):
            # Plain record fields only name records declared before in this list (no cycle
            # without an optional); optionals and containers name any record of the same file
            # or of the imported file.
            if i < n_imported:
                visible = names[:n_imported]
            else:
                visible = names
            body = self.members(visible, names[:i] if i >= n_imported else names[:i], "", ";\n")
            decls[i] = self.doc() + f"record {name} {{\n{body}}}\n"
        rng.shuffle(order)  # declaration order is free
        imported = "".join(decls[i] for i in order if i < n_imported)
        main = [decls[i] for i in order if i >= n_imported]
        ops = []
        for _ in range(rng.randint(1, 4)):
            name = self.ident(self.used, top=True)
            notify = rng.random() < 0.2
            args = ""
            if rng.random() < 0.8:
                args = "\n" + self.members(names, names, ",\n", "") + ("," if rng.random() < 0.3
                                                                       else "") + "\n"
            idempotent = "" if notify or rng.random() < 0.7 else "idempotent "
            text = self.doc() + f"{idempotent}{'notify' if notify else 'op'} {name}({args})"
            if not notify:
                if rng.random() < 0.7:
                    text += f" -> {self.type_(names, names)}"
                kinds = [k for k in ("UnitFull", "Busy", "Missing") if rng.random() < 0.3]
                if kinds:
                    text += " raises " + ", ".join(kinds)
            ops.append(text + ";\n")
        body = main + ops
        rng.shuffle(body)
        svc = rng.choice(SERVICES)
        head = self.doc() + f"service {svc};\n"
        if n_imported:
            head += 'import "inc */ ??/common.idl";\n'
        return head + "".join(body), imported if n_imported else None


class Property(unittest.TestCase):
    def test_valid_idl_compiles_everywhere(self):
        compilers = ccompile.available()
        rng = random.Random(SEED)
        tmp = tempfile.mkdtemp(prefix="ctlrpc-property-")
        self.addCleanup(shutil.rmtree, tmp)
        started = time.monotonic()
        refused, cases, texts, modules = 0, [], {}, []
        for case in range(CASES):
            main, imported = Gen(rng).program()
            d = os.path.join(tmp, f"case{case}")
            os.makedirs(os.path.join(d, "inc */ ??"))
            stem = rng.choice(STEMS)
            path = os.path.join(d, stem + ".idl")
            with open(path, "w", encoding="utf-8") as f:
                f.write(main)
            if imported is not None:
                with open(os.path.join(d, "inc */ ??", "common.idl"), "w", encoding="utf-8") as f:
                    f.write(imported)
            texts[d] = (main, imported)
            status, out, err = support.run([path, "-o", d])
            context = self.context(case, main, imported, err)
            self.assertIn(status, (0, 1), context)
            self.assertNotIn("Traceback", err, context)
            if status == 1:
                self.assertIn(": error: ", err, context)
                refused += 1
                continue
            cases.append((d, stem))
            status, out, err = support.run(["--lang", "python", path, "-o",
                                            os.path.join(d, "py")])
            self.assertEqual(status, 0, context + err)
            (py,) = os.listdir(os.path.join(d, "py"))
            modules.append((os.path.join(d, "py", py), case))
        generated = time.monotonic() - started
        self.check_python(modules, texts)
        self.assertLess(refused, CASES // 2, f"seed {SEED}: {refused} of {CASES} refused")
        failures = []
        if compilers:
            for i in range(0, len(cases), BATCH):
                failures += ccompile.compile_batch(cases[i:i + BATCH], compilers)
        if failures:
            cc, d, message = failures[0]
            main, imported = texts[d]
            self.fail(f"{len(failures)} failures; the first: {cc} refused "
                      f"{os.path.basename(d)}\n" + self.context(
                          int(os.path.basename(d)[4:]), main, imported, message[:4000]))
        sys.stderr.write(f"\nproperty: seed {SEED}, {CASES} cases ({refused} refused cleanly), "
                         f"generated in {generated:.1f}s, compiled with "
                         f"{', '.join(os.path.basename(c) for c, _ in compilers) or 'nothing'} "
                         f"in {time.monotonic() - started - generated:.1f}s\n")

    def check_python(self, modules, texts):
        """Import every generated module in one child; mypy --strict over the first few."""
        runtime = os.path.join(support.REPO, "runtime", "python")
        env = dict(os.environ, PYTHONPATH=runtime)
        probe = subprocess.run([sys.executable, "-c", "import zmq, msgpack"], env=env,
                               capture_output=True)
        if probe.returncode != 0:
            sys.stderr.write("property: Python modules not imported (no pyzmq or msgpack)\n")
            return
        paths = [p for p, _ in modules]
        got = subprocess.run([sys.executable, "-c", PY_IMPORT] + paths, env=env,
                             capture_output=True, text=True, timeout=600)
        if got.returncode != 0:
            bad = got.stdout.split("\n")[0]
            case = dict(modules).get(bad, -1)
            d = os.path.dirname(os.path.dirname(bad))
            main, imported = texts.get(d, ("?", None))
            self.fail("a generated Python module does not import\n" +
                      self.context(case, main, imported, got.stdout + got.stderr[-4000:]))
        mypy = shutil.which("mypy")
        if mypy is None or not paths:
            return
        sample, names = [], set()  # (one module of a name: mypy takes files as modules)
        for p in paths:
            if os.path.basename(p) not in names and len(sample) < PY_MYPY:
                names.add(os.path.basename(p))
                sample.append(p)
        got = subprocess.run([mypy, "--strict", "--no-incremental", "--cache-dir", os.devnull]
                             + sample,
                             env=dict(env, MYPYPATH=runtime), capture_output=True, text=True,
                             timeout=600)
        self.assertEqual(got.returncode, 0, f"seed {SEED}: mypy --strict over "
                         f"{len(sample)} generated modules\n" + got.stdout[-6000:])

    @staticmethod
    def context(case, main, imported, err):
        text = f"seed {SEED}, case {case}\n--- IDL ---\n{main}"
        if imported is not None:
            text += f"--- inc */ ??/common.idl ---\n{imported}"
        return text + f"--- output ---\n{err}"


if __name__ == "__main__":
    unittest.main()
