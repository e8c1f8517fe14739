#!/usr/bin/env python3
"""Writes docs/reference/flags.md and docs/reference/metrics.md, or checks
that the committed pages are what it would write.

Usage: tools/gen_reference.py [--check] [--bin_dir=DIR]

Flags come from the binaries themselves (and deploy/serve.sh's options from
its --help): each binary in BINARIES runs with
--helpfull (abseil flags), which lists every flag linked into it (those of
its libraries included) with its help and default; the type is read from the
ABSL_FLAG(type, name, ...) line in the source file --helpfull names. Without
--bin_dir the binaries are built first (`bazel build`, the default
configuration, so `bazel test //...` has usually built them already).

Metrics come from the source: every GetCounter, GetGauge, GetHistogram and
AddGaugeCallback call in the C++ that goes into the services (tests, benches
and fuzzers left out). Families are created when their code first runs (some
only in one role, some only with --elastic), so a scrape of one process shows a
subset; reading the source lists them all. A call whose metric name is not a
string literal, or whose help is neither a literal nor a `const char*` /
`std::string` variable initialised with literals in the same file, is an
error: the page could not list it. tools/docs_test.py runs --check, and
checks the families a live stack exports against the page.

--check: exit 1 and name each page that differs (with the first differing
line) when a flag or metric was added, changed or removed without
regenerating; prints how to regenerate.
"""
import difflib
import os
import re
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
FLAGS_PAGE = "docs/reference/flags.md"
METRICS_PAGE = "docs/reference/metrics.md"
REGENERATE = "/usr/bin/python3 tools/gen_reference.py"

# (heading, Bazel target, path under bazel-bin, what it is)
BINARIES = [
    ("router", "//router:router", "router/router",
     "the router: the public gRPC and OpenAI-compatible HTTP API, placement, the instance table"),
    ("encoder", "//encoder_service:encoder", "encoder_service/encoder",
     "an encoder instance: image and video preprocessing, the vision tower, embeddings out"),
    ("language", "//language_service:language", "language_service/language",
     "a language instance (role both, prefill, decode or elastic): the LM, its KV cache, "
     "scheduling"),
    ("tp_shard", "//worker:tp_shard", "worker/tp_shard",
     "a tensor-parallel rank 1..N-1 of a language instance (the language process starts these "
     "itself)"),
    ("mmserve_launch", "//deploy/launcher:mmserve_launch", "deploy/launcher/mmserve_launch",
     "the local launcher: starts and supervises a whole stack on one machine "
     "(deploy/serve.sh runs it)"),
    ("cli", "//client:cli", "client/cli", "the command-line gRPC client"),
]

# Source folders whose C++ goes into the service binaries.
METRIC_DIRS = ["common", "encoder_service", "kvpool", "language_service", "model", "router",
               "scheduler", "transfer", "worker"]
METRIC_PROCESSES = [("router", "mmserve_router_"), ("encoder", "mmserve_encoder_"),
                    ("language", "mmserve_language_")]
CALLS = {"GetCounter": "counter", "GetGauge": "gauge", "GetHistogram": "histogram",
         "AddGaugeCallback": "gauge"}


class ReferenceError(Exception):
    pass


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


# ---------------------------------------------------------------- C++ text

def strip_comments(text):
    """C++ text with comments blanked (newlines kept, so offsets and line
    numbers stay); string and character literals left as they are."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if c == '"' or c == "'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(text[i:j + 1])
            i = j + 1
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def call_args(text, open_paren):
    """The top-level, comma-separated arguments of the call whose "(" is at
    open_paren, each stripped, and the offset after the ")"."""
    args, depth, start, i = [], 0, open_paren + 1, open_paren
    pairs = {"(": ")", "{": "}", "[": "]"}
    while i < len(text):
        c = text[i]
        if c == '"' or c == "'":
            j = i + 1
            while j < len(text) and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            i = j + 1
            continue
        if c in pairs:
            depth += 1
        elif c in pairs.values():
            depth -= 1
            if depth == 0:
                args.append(text[start:i].strip())
                return [a for a in args if a], i + 1
        elif c == "," and depth == 1:
            args.append(text[start:i].strip())
            start = i + 1
        i += 1
    raise ReferenceError("unbalanced parentheses")


STRING_LITERALS = re.compile(r'^(?:\s*"(?:[^"\\\n]|\\.)*"\s*)+$')


def literal_value(expr):
    """The value of one or more adjacent C++ string literals, else None."""
    if not STRING_LITERALS.match(expr):
        return None
    parts = re.findall(r'"((?:[^"\\\n]|\\.)*)"', expr)
    return "".join(bytes(p, "utf-8").decode("unicode_escape") if "\\" in p else p
                   for p in parts)


def resolve_string(expr, text):
    """A string argument: literals, or a variable the file initialises with
    literals (`const char* help = "..." "...";`)."""
    value = literal_value(expr)
    if value is not None:
        return value
    if re.fullmatch(r"[A-Za-z_]\w*", expr):
        m = re.search(r"\b" + expr + r"\s*(?:\[\s*\])?\s*=\s*((?:\s*\"(?:[^\"\\\n]|\\.)*\")+)\s*;",
                      text)
        if m:
            return literal_value(m.group(1))
    return None


def line_of(text, offset):
    return text.count("\n", 0, offset) + 1


# ---------------------------------------------------------------- metrics

def metric_calls(path, text):
    """[(name, type, help, {label: set of values}, buckets, line)] of one
    source file."""
    code = strip_comments(text)
    found = []
    for m in re.finditer(r"(?:\.|->)\s*(" + "|".join(CALLS) + r")\s*\(", code):
        where = f"{os.path.relpath(path, ROOT)}:{line_of(code, m.start())}"
        try:
            args, _ = call_args(code, m.end() - 1)
        except ReferenceError as e:
            raise ReferenceError(f"{where}: {e}")
        kind = CALLS[m.group(1)]
        if len(args) < 2:
            raise ReferenceError(f"{where}: {m.group(1)} with fewer than two arguments")
        name = literal_value(args[0])
        if name is None:
            raise ReferenceError(f"{where}: the metric name {args[0]!r} is not a string literal; "
                                 "tools/gen_reference.py reads metric names from the source")
        help_text = resolve_string(args[1], code)
        if help_text is None:
            raise ReferenceError(f"{where}: the help of {name} ({args[1]!r}) is neither a string "
                                 "literal nor a variable this file initialises with literals")
        buckets = None
        label_arg = None
        if m.group(1) == "GetHistogram":
            if len(args) < 3:
                raise ReferenceError(f"{where}: GetHistogram without buckets")
            buckets = bucket_text(args[2])
            label_arg = args[3] if len(args) > 3 else None
        else:
            label_arg = args[2] if len(args) > 2 else None
        found.append((name, kind, help_text, labels_of(label_arg or "{}", where), buckets,
                      os.path.relpath(path, ROOT)))
    return found


def bucket_text(expr):
    if re.fullmatch(r"(?:metrics::)?LatencyBuckets\(\)", expr):
        return "latency: 0.001 to 60 s"
    m = re.fullmatch(r"\{([-\d.,\s e]*)\}", expr)
    if m:
        return ", ".join(v.strip() for v in m.group(1).split(",") if v.strip())
    return expr


def labels_of(expr, where):
    """{label name: set of literal values, or of the expressions that set them}."""
    if expr in ("{}", ""):
        return {}
    labels = {}
    for key, value in re.findall(r"\{\s*\"([A-Za-z_]\w*)\"\s*,\s*((?:[^{}]|\{[^{}]*\})+?)\s*\}",
                                 expr):
        literal = literal_value(value)
        labels.setdefault(key, set()).add(f"`{literal}`" if literal is not None
                                          else f"set by `{value}`")
    if not labels:
        raise ReferenceError(f"{where}: cannot read the labels {expr!r} (write them as "
                             "{{\"name\", value}, ...})")
    return labels


def source_files(dirs):
    for d in dirs:
        for folder, _, names in os.walk(os.path.join(ROOT, d)):
            for name in sorted(names):
                if not name.endswith((".cc", ".h")) or re.search(r"_test\.(cc|h)$", name):
                    continue
                path = os.path.join(folder, name)
                if os.path.relpath(path, ROOT) in ("common/metrics.h", "common/metrics.cc"):
                    continue  # the registry itself
                yield path


def collect_metrics(dirs=METRIC_DIRS):
    """{name: family dict}, merged over every call site."""
    families = {}
    for path in sorted(source_files(dirs)):
        text = read(path)
        for name, kind, help_text, labels, buckets, where in metric_calls(path, text):
            f = families.setdefault(name, {"kind": kind, "help": help_text, "labels": {},
                                           "buckets": buckets, "files": set()})
            if (f["kind"], f["help"], f["buckets"]) != (kind, help_text, buckets):
                raise ReferenceError(f"{where}: {name} registered with another type, help or "
                                     "buckets elsewhere (the registry refuses that at run time)")
            for key, values in labels.items():
                f["labels"].setdefault(key, set()).update(values)
            f["files"].add(where)
    return families


def md_cell(text):
    return text.replace("|", "\\|").replace("\n", " ")


def metrics_page(families):
    out = [
        "# Metrics reference",
        "",
        f"<!-- Generated by tools/gen_reference.py; do not edit. Regenerate: {REGENERATE} -->",
        "",
        "Every metric family the router, encoder and language processes export on",
        "`GET /metrics` (Prometheus text format 0.0.4; the port is each process's",
        "`--metrics_port`, see [flags.md](flags.md)).",
        "",
        "How this page is made: `tools/gen_reference.py` reads every `GetCounter`,",
        "`GetGauge`, `GetHistogram` and `AddGaugeCallback` call in the services' C++",
        "source (tests, benches and fuzzers left out) and refuses one whose name or",
        "help it cannot read. The source is the complete list: a process creates a",
        "family when its code path first runs, so a fresh process, or one in another",
        "role, exports only part of it (the `mmserve_router_elastic_*` families appear",
        "only with `--elastic`, the request counters after the first request).",
        "`tools/docs_test.py` fails when this page is not what the generator writes,",
        "and checks that every family a live stack exports is listed here.",
        "",
        "Histograms export `_bucket{le=...}`, `_sum` and `_count` series; the",
        "latency buckets are 0.001 to 60 s in 1-2.5-5 steps.",
        "",
    ]
    for process, prefix in METRIC_PROCESSES:
        names = sorted(n for n in families if n.startswith(prefix))
        out += [f"## {process}", "", "| name | type | labels | help | source |",
                "| --- | --- | --- | --- | --- |"]
        for name in names:
            f = families[name]
            labels = "; ".join(f"`{k}`: " + ", ".join(sorted(v))
                               for k, v in sorted(f["labels"].items()))
            kind = f["kind"] + (f" (buckets {f['buckets']})" if f["buckets"] else "")
            files = ", ".join(f"`{p}`" for p in sorted(f["files"]))
            out.append(f"| `{name}` | {md_cell(kind)} | {md_cell(labels) or '-'} | "
                       f"{md_cell(f['help'])} | {files} |")
        out.append("")
    other = sorted(n for n in families
                   if not any(n.startswith(p) for _, p in METRIC_PROCESSES))
    if other:
        raise ReferenceError(f"metric names without a process prefix "
                             f"({', '.join(p for _, p in METRIC_PROCESSES)}): {other}")
    return "\n".join(out)


# ---------------------------------------------------------------- flags

def parse_helpfull(text):
    """[(source file, flag name, help, default)] from absl's --helpfull."""
    flags, source, entry = [], None, None

    def finish():
        if entry is None:
            return
        joined = " ".join(entry)
        m = re.fullmatch(r"--(\w+) \((.*)\); default: (.*?);(?: currently: .*;)?", joined)
        if not m:
            raise ReferenceError(f"cannot read this --helpfull entry: {joined!r}")
        flags.append((source, m.group(1), m.group(2), m.group(3)))

    for line in text.split("\n"):
        m = re.match(r"^  Flags from (.+):$", line)
        if m:
            finish()
            entry, source = None, m.group(1)
        elif line.startswith("    --"):
            finish()
            entry = [line.strip()]
        elif line.startswith("      ") and entry is not None:
            entry.append(line.strip())
        elif line.strip() and entry is not None:
            finish()
            entry = None
    finish()
    return flags


def flag_type(source, name, cache={}):
    if source not in cache:
        path = os.path.join(ROOT, source)
        if not os.path.exists(path):
            raise ReferenceError(f"--helpfull names {source}, not a file in the repository")
        cache[source] = strip_comments(read(path))
    m = re.search(r"\bABSL_FLAG\(\s*([^,]+?)\s*,\s*" + name + r"\s*,", cache[source])
    if not m:
        raise ReferenceError(f"{source}: no ABSL_FLAG(type, {name}, ...) line")
    return re.sub(r"\s+", "", m.group(1)).replace("std::", "")


def build_binaries():
    cache = os.environ.get("MMSERVE_BAZEL_CACHE",
                           os.path.expanduser("~/.cache/mmserve/bazel-disk"))
    targets = [b[1] for b in BINARIES]
    r = subprocess.run(["bazel", "build", f"--disk_cache={cache}", "--color=no", "--curses=no"]
                       + targets, cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0:
        raise ReferenceError(f"bazel build {' '.join(targets)} failed:\n{r.stderr[-2000:]}")
    return subprocess.run(["bazel", "info", "bazel-bin"], cwd=ROOT, capture_output=True,
                          text=True, check=True).stdout.strip()


def collect_flags(bin_dir):
    """{binary heading: [(source, name, type, default, help)]}, and absl's
    own flags [(name, help)]."""
    result, absl_flags = {}, {}
    for heading, _, path, _ in BINARIES:
        exe = os.path.join(bin_dir, path)
        if not os.access(exe, os.X_OK):
            raise ReferenceError(f"{exe} is not built")
        r = subprocess.run([exe, "--helpfull"], capture_output=True, text=True, timeout=60,
                           cwd=ROOT)
        rows = []
        for source, name, help_text, default in parse_helpfull(r.stdout):
            if not source.startswith(("./", "/", "absl/", "external/")) and \
                    os.path.exists(os.path.join(ROOT, source)):
                rows.append((source, name, flag_type(source, name), default, help_text))
            else:
                absl_flags[name] = help_text
        if not rows:
            raise ReferenceError(f"{exe} --helpfull listed no flags of its own:\n"
                                 f"{(r.stdout + r.stderr)[-1000:]}")
        result[heading] = sorted(rows, key=lambda row: row[1])
    return result, sorted(absl_flags.items())


def serve_help():
    r = subprocess.run([os.path.join(ROOT, "deploy", "serve.sh"), "--help"], capture_output=True,
                       text=True, timeout=60)
    if r.returncode != 0 or not r.stdout.strip():
        raise ReferenceError(f"deploy/serve.sh --help failed: {r.stderr[-500:]}")
    return r.stdout


def flags_page(flags, absl_flags, serve_help):
    out = [
        "# Flag reference",
        "",
        f"<!-- Generated by tools/gen_reference.py; do not edit. Regenerate: {REGENERATE} -->",
        "",
        "The flags of each binary, as the binary itself lists them: `tools/gen_reference.py`",
        "runs each with `--helpfull` (the flags are abseil flags) and takes name, help and",
        "default from there, and the type from the flag's `ABSL_FLAG` definition in the",
        "source file `--helpfull` names. Flags defined in a shared library (such as",
        "`--cpu_isa`) appear under every binary that links it. `tools/docs_test.py`",
        "fails when this page is not what the generator writes.",
        "",
        "Write a flag as `--name=value` (a bool also as `--name` or `--noname`, a list",
        "comma-separated). String defaults are shown quoted; \"(none)\" is an empty",
        "list or an unset optional value. `--help` and `--helpfull` print a binary's",
        "flags.",
        "",
        "`deploy/serve.sh` passes options on to these processes; its own options are",
        "[at the end](#deployservesh).",
        "",
        "Contents: " + ", ".join(f"[{h}](#{h})" for h, *_ in BINARIES)
        + ", [flags every binary takes](#flags-every-binary-takes), "
        "[deploy/serve.sh](#deployservesh).",
        "",
    ]
    for heading, target, path, what in BINARIES:
        out += [f"## {heading}", "", f"`{target}` (`bazel-bin/{path}`): {what}.", "",
                "| flag | type | default | help | defined in |",
                "| --- | --- | --- | --- | --- |"]
        for source, name, ftype, default, help_text in flags[heading]:
            shown = f"`{md_cell(default)}`" if default else "(none)"
            out.append(f"| `--{name}` | {md_cell(ftype)} | {shown} | {md_cell(help_text)} | "
                       f"`{source}` |")
        out.append("")
    out += ["## Flags every binary takes", "",
            "Abseil's own flags (from `absl/flags/parse.cc` in the system's abseil), the",
            "same in each binary above:", "",
            "| flag | help |", "| --- | --- |"]
    for name, help_text in absl_flags:
        out.append(f"| `--{name}` | {md_cell(help_text)} |")
    out += ["", "## deploy/serve.sh", "", "`./deploy/serve.sh --help`:", "", "```text",
            serve_help.rstrip("\n"), "```", ""]
    return "\n".join(out)


# ---------------------------------------------------------------- main

def pages(bin_dir):
    flags, absl_flags = collect_flags(bin_dir)
    return {FLAGS_PAGE: flags_page(flags, absl_flags, serve_help()),
            METRICS_PAGE: metrics_page(collect_metrics())}


def stale_pages(generated):
    """[(page, first differing line)] of the committed pages that differ."""
    stale = []
    for page, text in generated.items():
        path = os.path.join(ROOT, page)
        current = read(path) if os.path.exists(path) else ""
        if current != text:
            diff = [l for l in difflib.unified_diff(current.split("\n"), text.split("\n"),
                                                    lineterm="", n=0)
                    if l[:1] in "+-" and not l.startswith(("+++", "---"))]
            stale.append((page, diff[0] if diff else "(whitespace)"))
    return stale


def main(argv):
    check = "--check" in argv
    bin_dir = next((a.split("=", 1)[1] for a in argv if a.startswith("--bin_dir=")), None)
    unknown = [a for a in argv if a != "--check" and not a.startswith("--bin_dir=")]
    if unknown:
        print(f"gen_reference: unknown argument {unknown[0]} (usage: {__doc__.split(chr(10))[3]})",
              file=sys.stderr)
        return 2
    try:
        generated = pages(bin_dir or build_binaries())
    except (ReferenceError, subprocess.SubprocessError, OSError) as e:
        print(f"gen_reference: FAIL {e}")
        return 1
    if check:
        stale = stale_pages(generated)
        for page, line in stale:
            print(f"gen_reference: {page} is stale (not what the binaries and the source say now: "
                  f"a flag or metric added, changed or removed); first difference: {line[:200]}")
        if stale:
            print(f"gen_reference: FAIL regenerate with: {REGENERATE}")
            return 1
        print(f"gen_reference: PASS ({', '.join(generated)} current)")
        return 0
    for page, text in generated.items():
        os.makedirs(os.path.dirname(os.path.join(ROOT, page)), exist_ok=True)
        with open(os.path.join(ROOT, page), "w", encoding="utf-8") as f:
            f.write(text)
        print(f"gen_reference: wrote {page}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
