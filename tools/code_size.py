#!/usr/bin/env python3
"""Production functions past 80 lines and production files past 600 lines.

The project's limits, checked over the tracked *.cc and *.h files outside tests,
benchmarks, fuzzers and third_party/. Function lengths come from lizard
(PyPI: pip install lizard), from the signature to the closing brace. Prints
one line per offender and a closing count line.

  tools/code_size.py            # the whole tree
"""
import pathlib
import re
import subprocess
import sys

MAX_FUNCTION, MAX_FILE = 80, 600

try:
    import lizard
except ImportError:
    sys.exit("code_size: pip install lizard")

root = pathlib.Path(__file__).resolve().parent.parent
files = subprocess.run(["git", "ls-files", "*.cc", "*.h"], cwd=root, check=True,
                       capture_output=True, text=True).stdout.split()
skip = re.compile(r"(_test\.cc|_fuzzer\.cc)$|^(third_party|bench|fuzz|tests)/")
files = [f for f in files if not skip.search(f)]

long_files = long_functions = 0
for f in files:
    text = (root / f).read_text()
    lines = text.count("\n")
    if lines > MAX_FILE:
        print(f"file {f}: {lines} lines")
        long_files += 1
    for fn in lizard.analyze_file.analyze_source_code(f, text).function_list:
        if fn.length > MAX_FUNCTION:
            print(f"function {f}:{fn.start_line} {fn.name}: {fn.length} lines")
            long_functions += 1
print(f"code_size: {long_functions} functions past {MAX_FUNCTION} lines, "
      f"{long_files} files past {MAX_FILE} lines")
