"""The docs say what the programs print: every block of docs/*.md and README.md marked

    <!-- transcript -->
    ```console
    $ COMMAND
    OUTPUT (standard output and error, as a terminal shows them)
    [exit status N]          (when not 0)
    ```

is run, command by command, and its output compared line for line.

    test_transcripts.py --bin DIR --repo DIR

The commands run with bash in a fresh directory that stands for the repository's root (its
`idl`, `tests`, `examples` and `docs` are links to the real ones, so nothing is written into the
source tree), with the programs on PATH: ctl-storage-unit and ctl-storage from --bin, ctlrpc and
ctlrpc-gen from the source tree, on this Python.
"""

import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

OPTS = None
MARK = "<!-- transcript -->"


def transcripts(repo):
    """[(doc path, line number, [(command, [expected lines], status)])]."""
    found = []
    docs = sorted(glob.glob(os.path.join(repo, "docs", "*.md"))) + [
        os.path.join(repo, "README.md")]
    for path in docs:
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
        for i, line in enumerate(lines):
            if line.strip() != MARK:
                continue
            if lines[i + 1] != "```console":
                raise AssertionError(f"{path}:{i + 1}: {MARK} is not followed by ```console")
            end = lines.index("```", i + 2)
            steps = []
            for text in lines[i + 2:end]:
                if text.startswith("$ "):
                    steps.append([text[2:], [], 0])
                elif not steps:
                    raise AssertionError(f"{path}:{i + 1}: output before any command")
                elif re.fullmatch(r"\[exit status \d+\]", text):
                    steps[-1][2] = int(text[13:-1])
                else:
                    steps[-1][1].append(text)
            found.append((os.path.relpath(path, repo), i + 1, steps))
    return found


class Transcripts(unittest.TestCase):
    def setUp(self):
        self.root = tempfile.mkdtemp(prefix="ctlrpc-transcript-")
        self.addCleanup(shutil.rmtree, self.root, True)
        os.chmod(self.root, 0o755)
        for name in ("idl", "tests", "examples", "docs"):
            os.symlink(os.path.join(OPTS.repo, name), os.path.join(self.root, name))
        bin_dir = tempfile.mkdtemp(prefix="ctlrpc-transcript-bin-")
        self.addCleanup(shutil.rmtree, bin_dir, True)
        links = {"python3": sys.executable,
                 "ctl-storage-unit": os.path.join(OPTS.bin, "ctl-storage-unit"),
                 "ctl-storage": os.path.join(OPTS.bin, "ctl-storage"),
                 "ctlrpc": os.path.join(OPTS.repo, "tools", "ctlrpc", "ctlrpc"),
                 "ctlrpc-gen": os.path.join(OPTS.repo, "gen", "ctlrpc-gen")}
        for name, target in links.items():
            os.symlink(target, os.path.join(bin_dir, name))
        self.env = dict(os.environ, PATH=bin_dir + os.pathsep + os.environ["PATH"], LC_ALL="C")
        self.env.pop("PYTHONPATH", None)

    def test_every_transcript(self):
        found = transcripts(OPTS.repo)
        self.assertGreaterEqual(len(found), 4)
        for doc, line, steps in found:
            for command, expected, status in steps:
                with self.subTest(doc=f"{doc}:{line}", command=command):
                    r = subprocess.run(["bash", "-c", command + " 2>&1"], cwd=self.root,
                                       env=self.env, stdout=subprocess.PIPE, timeout=60)
                    got = r.stdout.decode("utf-8", "replace").split("\n")
                    if got and got[-1] == "":
                        got.pop()
                    self.assertEqual(got, expected)
                    self.assertEqual(r.returncode, status)


def main():
    global OPTS
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--repo", required=True)
    OPTS, rest = ap.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
