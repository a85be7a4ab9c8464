"""The installed docs link only to what the packages ship: installs the `doc` component of a
build into a fresh prefix (`cmake --install BUILD --component doc`, what libctlrpc-dev carries
in share/doc/ctlrpc) and checks that every relative link of every installed Markdown file
resolves to a file or directory installed beside it.

    test_installed_links.py --cmake CMAKE --build BUILD
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

OPTS = None
LINK = re.compile(r"\]\(([^)\s]+)\)")


class InstalledLinks(unittest.TestCase):
    def test_links_resolve(self):
        prefix = tempfile.mkdtemp(prefix="ctlrpc-doc-")
        self.addCleanup(shutil.rmtree, prefix, True)
        subprocess.run([OPTS.cmake, "--install", OPTS.build, "--prefix", prefix,
                        "--component", "doc"], check=True, stdout=subprocess.DEVNULL,
                       timeout=120)
        docdir = os.path.join(prefix, "share", "doc", "ctlrpc")
        pages = [os.path.join(d, f) for d, _, files in os.walk(docdir) for f in files
                 if f.endswith(".md")]
        self.assertTrue(any(p.endswith(os.path.join("docs", "USING.md")) for p in pages))
        self.assertTrue(os.path.isfile(os.path.join(docdir, "examples", "consumer",
                                                    "CMakeLists.txt")))
        checked = 0
        for page in pages:
            with open(page, encoding="utf-8") as f:
                text = f.read()
            for target in LINK.findall(text):
                if re.match(r"^[a-z]+:", target) or target.startswith("#"):
                    continue  # a URL, or an anchor in the same page
                path = target.split("#", 1)[0]
                where = os.path.normpath(os.path.join(os.path.dirname(page), path))
                with self.subTest(page=os.path.relpath(page, docdir), link=target):
                    self.assertTrue(where.startswith(docdir + os.sep), where)
                    self.assertTrue(os.path.exists(where), where)
                checked += 1
        self.assertGreater(checked, 20)


def main():
    global OPTS
    ap = argparse.ArgumentParser()
    ap.add_argument("--cmake", required=True)
    ap.add_argument("--build", required=True)
    OPTS, rest = ap.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
