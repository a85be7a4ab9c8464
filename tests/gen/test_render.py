"""The render stage: deterministic, self-describing output, written only when it changes.

Needs jinja2 (Debian: python3-jinja2); skipped without it, because the parse and check tests must
run anywhere. The C compile and round-trip tests of the generated code are in tests/stubs/.
"""

import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import unittest
from unittest import mock

from support import GOOD, REPO, SCRIPT, STORAGE_IDL, run

try:
    import jinja2  # noqa: F401
    HAVE_JINJA2 = True
except ImportError:
    HAVE_JINJA2 = False

EVERYTHING = os.path.join(GOOD, "everything.idl")


@unittest.skipUnless(HAVE_JINJA2, "jinja2 is not installed (Debian: python3-jinja2)")
class RenderTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="ctlrpc-render-")
        self.addCleanup(shutil.rmtree, self.tmp)

    def gen(self, idl, name, *extra):
        out = os.path.join(self.tmp, name)
        status, _, err = run([idl, "-o", out, "--display-root", REPO, *extra])
        self.assertEqual(status, 0, err)
        return out

    def read(self, path):
        with open(path, "rb") as f:
            return f.read()

    def test_two_runs_give_the_same_bytes(self):
        for idl in (EVERYTHING, STORAGE_IDL):
            a = self.gen(idl, "a")
            b = self.gen(idl, "b")
            names = sorted(os.listdir(a))
            self.assertEqual(names, sorted(os.listdir(b)))
            stem = os.path.splitext(os.path.basename(idl))[0]
            self.assertEqual(names, [f"{stem}.ctl.c", f"{stem}.ctl.h"])
            for n in names:
                self.assertEqual(self.read(os.path.join(a, n)), self.read(os.path.join(b, n)), n)
            shutil.rmtree(a)
            shutil.rmtree(b)

    def test_unchanged_output_is_not_rewritten(self):
        out = self.gen(STORAGE_IDL, "s")
        header = os.path.join(out, "storage.ctl.h")
        past = time.time() - 1000
        os.utime(header, (past, past))
        self.gen(STORAGE_IDL, "s")
        self.assertEqual(int(os.stat(header).st_mtime), int(past))

    def test_banner_names_the_idl_and_no_absolute_path_leaks(self):
        out = self.gen(EVERYTHING, "e")
        for name in os.listdir(out):
            text = self.read(os.path.join(out, name)).decode()
            self.assertIn("generated from tests/gen/good/everything.idl by ctlrpc-gen. Do not edit",
                          text.splitlines()[1])
            self.assertNotIn(REPO, text)
            self.assertNotIn(self.tmp, text)

    def test_each_op_carries_its_declaration_and_doc(self):
        out = self.gen(STORAGE_IDL, "s")
        header = self.read(os.path.join(out, "storage.ctl.h")).decode()
        self.assertIn(" * idl/storage.idl:58  op put(key: str, data: bin, pin: bool = false) "
                      "-> u64 raises UnitFull, Busy\n", header)
        self.assertIn(" * Store `data` under `key`", header)
        self.assertIn("#if CTL_GEN_ABI != 4\n#error", header)
        # Sections in their fixed order.
        order = [header.index(s) for s in ("---- types", "---- client stubs",
                                           "---- server handler table",
                                           "---- dispatch descriptors")]
        self.assertEqual(order, sorted(order))

    def test_descriptor_table_is_in_idl_order(self):
        out = self.gen(STORAGE_IDL, "s")
        source = self.read(os.path.join(out, "storage.ctl.c")).decode()
        table = source[source.index("static const ctl_op storage__ops[]"):]
        table = table[:table.index("};")]
        names = [line.split('"')[1] for line in table.splitlines()
                 if line.strip().startswith("{.name = \"")]
        self.assertEqual(names, ["put", "get", "describe", "pin", "unpin", "abort", "delete",
                                 "list", "stats"])
        self.assertIn('{.name = "unpin", .handler = ctl_stub_serve, .flags = CTL_OP_NOREPLY, '
                      '.desc = &storage__op_unpin}', table)

    def test_idempotent_ops_are_flagged_and_say_so(self):
        out = self.gen(STORAGE_IDL, "s")
        source = self.read(os.path.join(out, "storage.ctl.c")).decode()
        header = self.read(os.path.join(out, "storage.ctl.h")).decode()
        for op in ("put", "get", "describe", "pin", "unpin", "abort", "delete", "list", "stats"):
            flags = {"unpin": "CTL_OP_NOREPLY", "abort": "CTL_OP_NOREPLY",
                     "put": None, "delete": None}.get(op, "CTL_OP_IDEMPOTENT")
            desc = source[source.index(f"static const ctl_op_desc storage__op_{op} = {{"):]
            desc = desc[:desc.index("};")]
            entry = source[source.index(f'{{.name = "{op}", .handler = ctl_stub_serve,'):]
            entry = entry[:entry.index("}") + 1]
            with self.subTest(op=op):
                if flags is None:
                    self.assertNotIn(".flags", desc)
                    self.assertNotIn(".flags", entry)
                else:
                    self.assertIn(f"    .flags = {flags},\n", desc)
                    self.assertIn(f" .flags = {flags}, ", entry)
        get = header[header.index(" * idl/storage.idl:68  idempotent op get("):]
        get = get[:get.index("*/")]
        self.assertIn(" * Idempotent: running it twice does what running it once does", get)
        self.assertIn("when its retry policy allows (ctl_client_options.retry;", get)
        put = header[header.index(" * idl/storage.idl:58  op put("):]
        self.assertNotIn("Idempotent", put[:put.index("*/")])
        self.assertIn("/* The handler of idempotent op stats() -> UnitStats: a retried call may "
                      "run it twice */", header)

    def test_initializer_macros(self):
        out = self.gen(EVERYTHING, "e")
        header = self.read(os.path.join(out, "everything.ctl.h")).decode()
        # Only members that do not start at zero, as designated initializers.
        self.assertIn("#define EVERYTHING_MATRIX_ARGS_INIT { \\\n    .cols = UINT32_C(16) \\\n}",
                      header)
        self.assertIn("#define EVERYTHING_FIND_ARGS_INIT {0}\n", header)
        # A record held by value starts from its own defaults; strings and optionals are brace
        # forms (constant expressions), never compound literals.
        containers = header[header.index("#define EVERYTHING_CONTAINERS_INIT"):]
        containers = containers[:containers.index("\n}\n")]
        self.assertIn(".when = EVERYTHING_STAMP_INIT", containers)
        self.assertIn('.maybe_d = {true, {"set", 3}}', containers)
        self.assertNotIn("(ctl_str)", containers)
        # The functions are the macros.
        source = self.read(os.path.join(out, "everything.ctl.c")).decode()
        self.assertIn("*args = (everything_matrix_args)EVERYTHING_MATRIX_ARGS_INIT;", source)

    def test_source_is_descriptors_and_one_line_entry_points(self):
        out = self.gen(STORAGE_IDL, "s")
        source = self.read(os.path.join(out, "storage.ctl.c")).decode()
        self.assertIn("static const ctl_op_desc storage__op_put = {", source)
        self.assertIn("static const ctl_type storage__r_BlobInfo = {", source)
        self.assertIn("    .args = &storage__at_put,\n", source)
        self.assertIn("    return ctl_stub_call(client, address, &storage__op_put, args, timeout_ms,",
                      source)
        # No hand-unrolled codecs: every value is packed and decoded by the runtime.
        self.assertNotIn("msgpack_pack_", source)
        self.assertNotIn("via.map", source)

    def test_depfile_lists_every_idl_read(self):
        dep = os.path.join(self.tmp, "e.d")
        self.gen(EVERYTHING, "e", "--depfile", dep)
        text = self.read(dep).decode()
        self.assertIn(os.path.join(GOOD, "everything.idl"), text)
        self.assertIn(os.path.join(GOOD, "inc", "common.idl"), text)

    def test_unwritable_output_dir_is_a_clean_error(self):
        blocker = os.path.join(self.tmp, "file")
        with open(blocker, "w") as f:
            f.write("x")
        status, _, err = run([STORAGE_IDL, "-o", os.path.join(blocker, "sub")])
        self.assertEqual(status, 1)
        self.assertIn("ctlrpc-gen: error: cannot create output directory", err)
        self.assertNotIn("Traceback", err)

    def test_outputs_have_a_plain_files_mode(self):
        mask = os.umask(0o022)
        os.umask(mask)
        out = self.gen(STORAGE_IDL, "s", "--depfile", os.path.join(self.tmp, "s.d"))
        for path in (os.path.join(out, "storage.ctl.h"), os.path.join(out, "storage.ctl.c"),
                     os.path.join(self.tmp, "s.d")):
            self.assertEqual(stat.S_IMODE(os.stat(path).st_mode), 0o666 & ~mask, path)

    def test_a_failed_write_leaves_no_temporary_file(self):
        from ctlrpc_gen import render
        out = os.path.join(self.tmp, "s")
        with mock.patch.object(render.os, "replace", side_effect=OSError(28, "No space left")):
            status, _, err = run([STORAGE_IDL, "-o", out])
        self.assertEqual(status, 1)
        self.assertIn("ctlrpc-gen: error: cannot write", err)
        self.assertEqual(os.listdir(out), [])


@unittest.skipUnless(HAVE_JINJA2, "jinja2 is not installed (Debian: python3-jinja2)")
class ConcurrentRuns(unittest.TestCase):
    """Generator processes writing one output directory (and one depfile) at once, as parallel
    builds of several targets of one IDL do: each succeeds, the files are whole and the same as
    one run's, and no temporary file is left."""

    PROCESSES = 8
    ROUNDS = 20

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="ctlrpc-race-")
        self.addCleanup(shutil.rmtree, self.tmp)

    def snapshot(self, out):
        files = {}
        for name in sorted(os.listdir(out)):
            with open(os.path.join(out, name), "rb") as f:
                files[name] = f.read()
        return files

    def test_parallel_runs_agree_and_leave_no_temporary_files(self):
        out = os.path.join(self.tmp, "out")
        argv = [STORAGE_IDL, "-o", out, "--depfile", os.path.join(out, "storage.d")]
        status, _, err = run(argv)
        self.assertEqual(status, 0, err)
        expected = self.snapshot(out)
        self.assertEqual(sorted(expected), ["storage.ctl.c", "storage.ctl.h", "storage.d"])
        for n in range(self.ROUNDS):
            # Every other round starts from no outputs, the rest from stale ones: both make
            # every run write.
            for name in expected:
                path = os.path.join(out, name)
                if n % 2:
                    with open(path, "wb") as f:
                        f.write(b"stale\n")
                else:
                    os.unlink(path)
            procs = [subprocess.Popen([sys.executable, SCRIPT, *argv], stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE)
                     for _ in range(self.PROCESSES)]
            for p in procs:
                stdout, stderr = p.communicate(timeout=60)
                self.assertEqual((p.returncode, stdout, stderr), (0, b"", b""),
                                 f"round {n}")
            self.assertEqual(self.snapshot(out), expected, f"round {n}")


if __name__ == "__main__":
    unittest.main()
