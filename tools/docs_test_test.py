#!/usr/bin/python3
"""tools/docs_test.py's readers: which words of a comment or a page are
repository paths, where comments are in C++, shell and Python, and which
named paths, file names and Bazel labels are refused."""
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import docs_test as d  # noqa: E402

FILES = {
    "README.md": "",
    "router/BUILD.bazel": 'cc_binary(\n    name = "router",\n)\ncc_test(name = "router_test")\n',
    "router/generate_call.cc": "",
    "router/generate_call.h": "",
    "common/event_loop.h": "",
    "common/event_loop.cc": "",
    "deploy/serve.sh": "",
    "deploy/launcher/launch_main.cc": "",
    "docs/lifecycle.md": "",
}


class CommentTextTest(unittest.TestCase):
    def test_cpp_comments_and_not_strings(self):
        text = ('int a = 1;  // see router/a.cc\n'
                'const char* s = "// router/not_a_comment.cc";\n'
                'auto r = R"(// router/raw.cc)";\n'
                '/* two\n   lines router/b.cc */\n'
                "int n = 1'000;  // deploy/c.sh\n")
        comments = d.comment_text("x.cc", text)
        self.assertEqual([n for n, _ in comments], [1, 4, 5, 6])
        joined = " ".join(c for _, c in comments)
        for named in ("router/a.cc", "router/b.cc", "deploy/c.sh"):
            self.assertIn(named, joined)
        for hidden in ("not_a_comment", "raw.cc"):
            self.assertNotIn(hidden, joined)

    def test_shell_and_python_comments(self):
        sh = '#!/bin/bash\n# runs deploy/serve.sh\necho "a # router/no.cc"\nn=${#arr[@]}\nx=1  # docs/x.md\n'
        self.assertEqual(d.comment_text("t.sh", sh), [(2, " runs deploy/serve.sh"), (5, "docs/x.md")])
        py = '"""Writes docs/reference/flags.md."""\nx = "# not/a/comment.py"\n# tools/y.py\n'
        self.assertEqual(d.comment_text("t.py", py),
                         [(1, "Writes docs/reference/flags.md."), (3, " tools/y.py")])


class PathTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        for rel, text in FILES.items():
            path = os.path.join(self.dir.name, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(text)
        self.repo = d.Repo(self.dir.name, list(FILES))

    def tearDown(self):
        self.dir.cleanup()

    def problems(self, line, source="router/x.cc"):
        return [why for token, explicit in d.tokens(line)
                if (why := self.repo.path_problem(token, source, explicit))]

    def test_paths_that_exist_pass(self):
        self.assertEqual(self.problems(
            "see router/generate_call.cc:120, `deploy/launcher`, deploy/launcher/, "
            "generate_call.h, ./deploy/serve.sh, //router:router, //router:router_test, "
            "common/event_loop, docs/lifecycle.md#router-the-call"), [])

    def test_dead_paths_are_named(self):
        self.assertEqual(self.problems(
            "see router/old_name.cc, docs/lifecycle_router.md, ARCHITECTURE.md, "
            "`deploy/gone`, //router:gone, //nopkg:x"), [
                "router/old_name.cc: not in the repository",
                "docs/lifecycle_router.md: not in the repository",
                "ARCHITECTURE.md: no file of that name in the repository",
                "deploy/gone: not in the repository",
                "//router:gone: no target gone in router/BUILD.bazel",
                "//nopkg:x: no package nopkg"])

    def test_words_that_are_not_repository_paths(self):
        self.assertEqual(self.problems(
            "P/D and TP, router/encoder processes, /tmp/x.cc, bazel-bin/router/router, "
            "$bin/router/nothing.cc, https://github.com/x/router/y.cc, config.json, "
            "--out=docs/img/new.png, > deploy/written.txt, FILE.md, tools/demo/NNNN.png"), [])

    def test_a_path_relative_to_the_naming_file(self):
        self.assertEqual(self.problems("launcher/launch_main.cc", source="deploy/serve.sh"), [])
        self.assertEqual(self.problems("launcher/gone.cc", source="deploy/serve.sh"),
                         ["launcher/gone.cc: not in the repository"])


if __name__ == "__main__":
    unittest.main()
