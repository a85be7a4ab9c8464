"""The command line: exit statuses, output format, the render hook, internal errors."""

import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest
from unittest import mock

import support
from ctlrpc_gen import cli

GOOD = os.path.join(support.GOOD, "minimal.idl")


class Script(unittest.TestCase):
    """The real script, in a child process (the shebang and sys.path setup included)."""

    def run_script(self, *args, env=None):
        return subprocess.run([sys.executable, support.SCRIPT, *args], capture_output=True,
                              text=True, cwd=support.BAD, timeout=60, env=env)

    def test_version(self):
        r = self.run_script("--version")
        self.assertEqual((r.returncode, r.stdout, r.stderr),
                         (0, f"ctlrpc-gen {VERSION}\n", ""))

    def test_help(self):
        r = self.run_script("--help")
        self.assertEqual(r.returncode, 0)
        self.assertIn("usage: ctlrpc-gen", r.stdout)
        self.assertIn("--check", r.stdout)

    def test_bad_idl_exits_1_with_diagnostics_only(self):
        r = self.run_script("--check", "bad_char.idl")
        self.assertEqual(r.returncode, 1)
        self.assertEqual(r.stderr, "bad_char.idl:4:18: error: unexpected character '$'\n"
                                   "op put(key: str, $data: bin) -> u64;\n"
                                   "                 ^\n")
        self.assertEqual(r.stdout, "")

    def test_good_idl_exits_0_silently(self):
        r = self.run_script("--check", GOOD)
        self.assertEqual((r.returncode, r.stdout, r.stderr), (0, "", ""))


def _version_file():
    with open(os.path.join(support.GEN, "ctlrpc_gen", "version.py")) as f:
        return f.read()


# What the CMake build reads: the version, alone on its line in exactly this form.
VERSION = re.search(r'^__version__ = "(\d+\.\d+\.\d+)"$', _version_file(), re.M).group(1)


class Version(unittest.TestCase):
    def test_version_py_holds_one_plain_version(self):
        from ctlrpc_gen.version import __version__
        self.assertEqual(__version__, VERSION)
        self.assertEqual(len(re.findall(r'^__version__ = "', _version_file(), re.M)), 1)

    def test_version_flag_in_process(self):
        status, out, err = support.run(["--version"])
        self.assertEqual((status, out, err), (0, f"ctlrpc-gen {VERSION}\n", ""))


class WithoutJinja2(unittest.TestCase):
    """ctlrpc-gen run by a Python where jinja2 cannot be imported: a fake jinja2 package, first
    on the path, stands in for a missing or broken one whatever this machine has installed."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="ctlrpc-nojinja2-")
        self.addCleanup(shutil.rmtree, self.tmp)
        os.mkdir(os.path.join(self.tmp, "jinja2"))

    def fake_jinja2(self, body):
        with open(os.path.join(self.tmp, "jinja2", "__init__.py"), "w") as f:
            f.write(body)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (self.tmp, env.get("PYTHONPATH")) if p)
        return env

    def run_gen(self, env, *args):
        return subprocess.run([sys.executable, support.SCRIPT, *args], capture_output=True,
                              text=True, cwd=self.tmp, timeout=60, env=env)

    def check_message(self, body):
        env = self.fake_jinja2(body)
        out = os.path.join(self.tmp, "out")
        r = self.run_gen(env, support.STORAGE_IDL, "-o", out)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertEqual(r.stdout, "")
        self.assertNotIn("Traceback", r.stderr)
        lines = r.stderr.splitlines()
        self.assertEqual(len(lines), 1, r.stderr)
        self.assertTrue(lines[0].startswith("ctlrpc-gen: error: rendering needs jinja2, which "
                                            f"{sys.executable} cannot import"), lines[0])
        self.assertIn("python3-jinja2", lines[0])
        self.assertFalse(os.path.exists(out))

    def test_jinja2_that_raises_import_error(self):
        self.check_message('raise ImportError("this jinja2 cannot be imported")\n')

    def test_jinja2_missing_a_dependency(self):
        self.check_message("import ctlrpc_no_such_module\n")

    def test_check_and_version_need_no_jinja2(self):
        env = self.fake_jinja2('raise ImportError("this jinja2 cannot be imported")\n')
        r = self.run_gen(env, "--version")
        self.assertEqual((r.returncode, r.stdout, r.stderr),
                         (0, f"ctlrpc-gen {VERSION}\n", ""))
        r = self.run_gen(env, "--check", support.STORAGE_IDL)
        self.assertEqual((r.returncode, r.stdout, r.stderr), (0, "", ""))


class Statuses(unittest.TestCase):
    def test_usage_errors_exit_1(self):
        status, _, err = support.run([])
        self.assertEqual(status, 1)
        self.assertIn("usage:", err)
        status, _, err = support.run([GOOD])  # neither -o nor --check
        self.assertEqual(status, 1)
        self.assertIn("-o OUTDIR is required", err)

    def test_unreadable_file(self):
        status, _, err = support.run(["--check", "missing.idl"], cwd=support.BAD)
        self.assertEqual(status, 1)
        self.assertEqual(err, "missing.idl: error: cannot read file: No such file or directory\n")

    def test_caret_spans_the_token_and_keeps_tabs(self):
        status, _, err = support.run(["--check", "unknown_type.idl"], cwd=support.BAD)
        self.assertEqual(status, 1)
        self.assertTrue(err.startswith(
            "unknown_type.idl:9:13: error: unknown type 'strng' (did you mean 'str'?)\n"
            "op put(key: strng) -> u64;\n"
            "            ^~~~~\n"), err)

    def test_internal_error_exits_2_with_its_own_message(self):
        with mock.patch.object(cli, "check", side_effect=ZeroDivisionError("boom")):
            status, _, err = support.run(["--check", GOOD])
        self.assertEqual(status, 2)
        self.assertTrue(err.startswith("ctlrpc-gen: internal error: this is a bug in ctlrpc-gen"))
        self.assertIn("ZeroDivisionError: boom", err)


class RenderHook(unittest.TestCase):
    def test_missing_render_stage_is_a_note(self):
        err = ModuleNotFoundError("No module named 'ctlrpc_gen.render'", name="ctlrpc_gen.render")
        with mock.patch.object(cli.importlib, "import_module", side_effect=err):
            status, out, stderr = support.run([GOOD, "-o", "unused-out-dir"])
        self.assertEqual(status, 0)
        self.assertIn("note:", stderr)
        self.assertFalse(os.path.exists("unused-out-dir"))

    def test_missing_jinja2_names_the_package(self):
        err = ModuleNotFoundError("No module named 'jinja2'", name="jinja2")
        with mock.patch.object(cli.importlib, "import_module", side_effect=err):
            status, _, stderr = support.run([GOOD, "-o", "unused-out-dir"])
        self.assertEqual(status, 1)
        self.assertEqual(stderr, f"ctlrpc-gen: error: rendering needs jinja2, which "
                                 f"{sys.executable} cannot import (No module named 'jinja2'): "
                                 "install it for that Python (Debian: apt-get install "
                                 "python3-jinja2), or pass --check to only check the IDL\n")

    def test_check_never_imports_the_render_stage(self):
        with mock.patch.object(cli.importlib, "import_module",
                               side_effect=AssertionError("render imported")):
            status, _, _ = support.run([GOOD, "--check"])
        self.assertEqual(status, 0)

    def test_render_is_called_with_the_model(self):
        calls = []
        fake = mock.Mock(render=lambda model, out, **options: calls.append(
            (model.service.name, out)))
        with mock.patch.object(cli.importlib, "import_module", return_value=fake):
            status, _, _ = support.run([GOOD, "-o", "out"])
        self.assertEqual((status, calls), (0, [("tiny", "out")]))


if __name__ == "__main__":
    unittest.main()
