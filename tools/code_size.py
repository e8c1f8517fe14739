#!/usr/bin/env python3
"""Production functions past 80 lines, files past 600 and classes past 800.

The project's limits, checked over the tracked *.cc and *.h files outside tests,
benchmarks, fuzzers and third_party/. Function lengths come from lizard
(PyPI: pip install lizard), from the signature to the closing brace. A class's
size is its definition (from `class Name` to the closing `};`) plus every
member function defined outside it, summed over all files: splitting a class
over more files does not make it smaller. Prints one line per offender and a
closing count line.

  tools/code_size.py            # the whole tree
  tools/code_size.py --classes  # also every class's size, largest first
"""
import collections
import pathlib
import re
import subprocess
import sys

MAX_FUNCTION, MAX_FILE, MAX_CLASS = 80, 600, 800

try:
    import lizard
except ImportError:
    sys.exit("code_size: pip install lizard")

CLASS_HEAD = re.compile(r"^\s*(?:class|struct)\s+(?:\[\[[^\]]*\]\]\s*)?(\w+)(?:\s+final)?\s*(?::[^;{]*)?\{",
                        re.M)


def class_bodies(text):
    """(name, lines) of every class or struct defined in text."""
    out = []
    for m in CLASS_HEAD.finditer(text):
        depth, i = 0, m.end() - 1
        while i < len(text):
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    break
            i += 1
        out.append((m.group(1), text.count("\n", m.start(), i) + 1))
    return out


def main():
    root = pathlib.Path(__file__).resolve().parent.parent
    files = subprocess.run(["git", "ls-files", "*.cc", "*.h"], cwd=root, check=True,
                           capture_output=True, text=True).stdout.split()
    skip = re.compile(r"(_test\.cc|_fuzzer\.cc)$|^(third_party|bench|fuzz|tests)/")
    files = [f for f in files if not skip.search(f)]

    long_files = long_functions = 0
    # A class defined in a header is one class over all its files; one
    # defined in a .cc file is local to it (two files may each have a
    # "Parser"), so it is keyed by file.
    texts = {f: (root / f).read_text() for f in files}
    in_headers = {name for f in files if f.endswith(".h") for name, _ in class_bodies(texts[f])}
    class_lines = collections.Counter()
    class_files = collections.defaultdict(set)

    def key(name, f):
        return name if name in in_headers else f"{name} ({f})"

    for f in files:
        text = texts[f]
        lines = text.count("\n")
        if lines > MAX_FILE:
            print(f"file {f}: {lines} lines")
            long_files += 1
        for name, n in class_bodies(text):
            class_lines[key(name, f)] += n
            class_files[key(name, f)].add(f)
        for fn in lizard.analyze_file.analyze_source_code(f, text).function_list:
            if fn.length > MAX_FUNCTION:
                print(f"function {f}:{fn.start_line} {fn.name}: {fn.length} lines")
                long_functions += 1
            # Out-of-line members: "Class::Method" (lizard keeps the written
            # qualification; in-class definitions are inside the body above).
            # Namespaces are lower case here, classes upper camel case.
            parts = fn.name.split("::")
            if len(parts) >= 2 and parts[-2][:1].isupper():
                class_lines[key(parts[-2], f)] += fn.length
                class_files[key(parts[-2], f)].add(f)
    long_classes = [(n, c) for c, n in class_lines.items() if n > MAX_CLASS]
    for n, c in sorted(long_classes, reverse=True):
        print(f"class {c}: {n} lines over {len(class_files[c])} files")
    if "--classes" in sys.argv[1:]:
        for c, n in class_lines.most_common():
            print(f"  {n:6d}  {c}  ({len(class_files[c])} files)")
    print(f"code_size: {long_functions} functions past {MAX_FUNCTION} lines, "
          f"{long_files} files past {MAX_FILE} lines, "
          f"{len(long_classes)} classes past {MAX_CLASS} lines")


if __name__ == "__main__":
    main()
