#!/usr/bin/env python3
"""The docs test: every page's runnable shell blocks against a live stack,
every relative link and image, every repository path the pages and the code
comments name, and the generated references.

Usage: tools/docs_test.py [--links_only | --no_stack] [FILE.md ...]
       (default files: every Markdown page in the repository)
  --no_stack    everything except the blocks against a stack
  --links_only  links and paths only (no build, no stack)

A block is marked by an HTML comment (invisible once rendered) on the line
right before its fence:

  <!-- docs-test: start -->   the command that starts the stack (one per run
                              of the test, e.g. ./deploy/serve.sh). It runs
                              with --port/--http_port set to free ports until
                              its output has a line starting "READY serve.sh";
                              after the other blocks it gets SIGINT, as Ctrl-C
                              sends it, and must leave no process of its
                              session, no /dev/shm entry, no SysV segment and
                              no open port behind.
  <!-- docs-test: run -->     a shell block, run from the repository root by
                              bash with -e and -o pipefail once the stack is
                              up (a ```python block: by /usr/bin/python3);
                              it must exit 0 (`run exit=N`: exit N).
  <!-- docs-test: output -->  the block after a start or run block: what its
                              standard output must look like. "..." matches
                              any text (across lines too); trailing spaces
                              and blank lines at either end do not count.

The marked blocks of every page run, in page order, against the one stack
the single start block (on whichever page) describes.

In every marked block, and in expected output, localhost:50051 and
127.0.0.1:50051 (gRPC) and the same with :8000 (HTTP) stand for the stack's
ports. Needs no network and no GPU. Runs the stack with
MMSERVE_SERVE_OPT=0 (reuse the default build) unless that is set.

Links: every [text](target), ![alt](target), <img src> and <a href> outside
code must name a file or folder inside the repository, and a #anchor in
a Markdown file must be one of its headings (GitHub's slugs).

Paths: every repository path a page names (in prose, backticks or code) and
every one a comment names (C++ and proto // and /* */, # in shell, Python,
Bazel and YAML files, Python module docstrings) must exist: a/b/file.ext
(from the repository root or the naming file's folder), a folder written
in backticks or with a trailing /, a bare file name with a source extension
(some file in the repository, or an installed system header, must have that
name), a Bazel label (its package's BUILD.bazel must declare the target), or
a folder/name written for folder/name.h and .cc or for the target name in
that folder's package. Words whose
first folder is not one of the repository's (P/D, /tmp/x, URLs) are not
paths; nor are files a command writes (after out= or >), build outputs
.gitignore names, and placeholders (FILE.md, NNNN.png).

References: tools/gen_reference.py --check (docs/reference/flags.md and
metrics.md are what the binaries and the source say now); with a stack,
every metric family its processes export must be in metrics.md.

Prints one line per check and "docs_test: PASS ..." or "docs_test: FAIL
..." last; exit status 0 only when everything passed.
"""
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
MARKER = re.compile(r"^<!--\s*docs-test:\s*(start|run|output)\b([^>]*)-->\s*$")
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})(.*)$")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REF_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$")
HTML_REF = re.compile(r"<(?:img|a)\b[^>]*?\b(?:src|href)\s*=\s*\"([^\"]+)\"", re.I)
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
BLOCK_TIMEOUT_S = 120
READY_TIMEOUT_S = 600


class Block:
    def __init__(self, path, line, kind, args, lang, text):
        self.path, self.line, self.kind, self.args = path, line, kind, args
        self.lang, self.text = lang, text
        self.expected = None  # text of the output block that follows, if any

    def where(self):
        return f"{os.path.relpath(self.path, ROOT)}:{self.line}"


def parse(path):
    """Returns (blocks, prose lines with their numbers) of one Markdown file."""
    blocks, prose = [], []
    lines = open(path, encoding="utf-8").read().split("\n")
    marker = None
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            mk = MARKER.match(lines[i].strip())
            if mk:
                marker = (i + 1, mk.group(1), mk.group(2).strip())
            else:
                prose.append((i + 1, lines[i]))
                if lines[i].strip():
                    marker = None
            i += 1
            continue
        fence = m.group(2)
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence):
            j += 1
        if marker is not None:
            line, kind, args = marker
            lang = (m.group(3).split() or [""])[0]
            blocks.append(Block(path, line, kind, args, lang, "\n".join(lines[i + 1:j])))
        marker = None
        i = j + 1
    return blocks, prose


def slug(heading):
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path, cache={}):
    if path not in cache:
        seen, result = {}, set()
        for _, line in parse(path)[1]:
            m = HEADING.match(line)
            if not m:
                continue
            s = slug(m.group(2))
            n = seen.get(s, 0)
            seen[s] = n + 1
            result.add(s if n == 0 else f"{s}-{n}")
        cache[path] = result
    return cache[path]


def check_links(path):
    """Returns a list of problems with the file's relative links."""
    problems, count = [], 0
    for number, line in parse(path)[1]:
        text = re.sub(r"`[^`]*`", "", line)
        targets = LINK.findall(text) + HTML_REF.findall(text)
        m = REF_DEF.match(text)
        if m:
            targets.append(m.group(1))
        for target in targets:
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):
                continue  # http:, https:, mailto:, data:
            count += 1
            where = f"{os.path.relpath(path, ROOT)}:{number}"
            file_part, _, anchor = target.partition("#")
            resolved = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) \
                if file_part else path
            if os.path.commonpath([resolved, ROOT]) != ROOT:
                problems.append(f"{where}: {target} points outside the repository")
            elif not os.path.exists(resolved):
                problems.append(f"{where}: {target} does not exist")
            elif anchor and resolved.endswith(".md") and anchor not in anchors(resolved):
                problems.append(f"{where}: {target}: no heading with that anchor")
    return problems, count


# ---------------------------------------------------------------- paths

# A file name the checks treat as naming a repository file even without a
# folder (a bare `metrics.h` must be some file's name in the repository).
PATH_EXT = r"(?:md|cc|h|cu|c|proto|py|sh|bzl|bazel|yml|yaml|txt|png|svg|json|csv)"
BARE_EXT = ("md", "cc", "h", "cu", "proto", "py", "sh", "bzl", "bazel")
PATH_TOKEN = re.compile(
    r"(?<![\w.$/~@-])"  # not the tail of a longer path, URL, $var/ or ~/
    r"(//[\w/.+-]*:[\w.+-]+"  # a Bazel label
    r"|(?:\./)?[\w.+-]+(?:/[\w.+-]+)+/?"  # a/b/c, with or without a known extension
    r"|[\w+-][\w.+-]*\." + PATH_EXT + r")"  # a bare file name
    r"(?![\w/-])")
C_STYLE = (".cc", ".h", ".cu", ".c", ".proto")
HASH_STYLE = (".sh", ".py", ".bzl", ".bazel", ".yml", ".yaml")


def repo_files():
    """Every file of the checkout (git's list when there is one)."""
    r = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True)
    if r.returncode == 0 and r.stdout:
        listed = [p for p in r.stdout.split("\0") if p]
        # Files added but not yet committed count too.
        r2 = subprocess.run(["git", "ls-files", "-z", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True)
        return sorted(set(listed + [p for p in r2.stdout.split("\0") if p]))
    found = []
    for folder, dirs, names in os.walk(ROOT):
        dirs[:] = [d for d in dirs if not d.startswith((".", "bazel-"))]
        found += [os.path.relpath(os.path.join(folder, n), ROOT) for n in names]
    return sorted(found)


class Repo:
    """The files of a checkout (default: this one) and what names them."""

    def __init__(self, root=ROOT, files=None):
        self.root = root
        if files is None:
            files = [f for f in repo_files() if os.path.exists(os.path.join(root, f))]
        self.files = sorted(files)
        self.file_set = set(self.files)
        self.dirs = {os.path.dirname(f) for f in self.files}
        for d in list(self.dirs):
            while d:
                d = os.path.dirname(d)
                self.dirs.add(d)
        self.top = {f.split("/")[0] for f in self.files}
        self.basenames = {os.path.basename(f) for f in self.files}
        self.ignored_cache = {}

    def exists(self, rel):
        rel = os.path.normpath(rel).rstrip("/")
        return rel in self.file_set or rel in self.dirs

    def label_problem(self, label):
        pkg, _, name = label[2:].partition(":")
        build = [f"{pkg}/BUILD.bazel" if pkg else "BUILD.bazel", f"{pkg}/BUILD" if pkg else "BUILD"]
        build = [b for b in build if b in self.file_set]
        if not build:
            return f"{label}: no package {pkg or '(root)'}"
        if "*" in name or "..." in name or not name:
            return None
        with open(os.path.join(self.root, build[0]), encoding="utf-8") as f:
            text = f.read()
        if re.search(r"\bname\s*=\s*\"" + re.escape(name) + "\"", text) or \
                f"{pkg}/{name}" in self.file_set:
            return None
        return f"{label}: no target {name} in {build[0]}"

    def path_problem(self, token, source, explicit):
        """None when `token`, named in the file `source`, is a path that
        exists (or not a repository path at all); else the problem.
        explicit: the token stood alone in backticks or a link, so a folder
        path without an extension counts too."""
        if token.startswith("//"):
            return self.label_problem(token)
        clean = re.sub(r":\d+(?:-\d+)?$", "", token)  # file.cc:123
        clean = clean[2:] if clean.startswith("./") else clean
        if "/" not in clean.rstrip("/"):
            name = clean.rstrip("/")
            ext = name.rsplit(".", 1)[-1] if "." in name else ""
            if ext not in BARE_EXT or name in self.basenames or name in system_headers():
                return None
            if self.exists(os.path.join(os.path.dirname(source), name)):
                return None
            return f"{token}: no file of that name in the repository"
        first = clean.split("/")[0]
        here = os.path.normpath(os.path.join(os.path.dirname(source), clean))
        if first not in self.top and first not in ("..", ".") and \
                not self.exists(os.path.join(os.path.dirname(source), first)):
            return None  # not a repository path (a URL tail, a path on the host, P/D, ...)
        if not (explicit or re.search(r"\." + PATH_EXT + r"$", clean) or clean.endswith("/")):
            return None  # prose such as router/encoder: only explicit folder paths count
        if self.exists(clean) or (not here.startswith("..") and self.exists(here)):
            return None
        if self.module_or_target(clean) or self.ignored(clean):
            return None
        return f"{token}: not in the repository"

    def module_or_target(self, rel):
        """`common/event_loop` for common/event_loop.{h,cc}, or
        `tests/stack_pd_test` for the target //tests:stack_pd_test."""
        rel = rel.rstrip("/")
        if any(rel + ext in self.file_set for ext in (".h", ".cc", ".py", ".sh")):
            return True
        pkg, name = os.path.dirname(rel), os.path.basename(rel)
        return "/" in rel and self.label_problem(f"//{pkg}:{name}") is None

    def ignored(self, rel):
        """A build output .gitignore names (client/python/gen/)."""
        cache = self.ignored_cache
        if rel not in cache:
            r = subprocess.run(["git", "check-ignore", "-q", "--no-index", rel], cwd=self.root,
                               capture_output=True)
            cache[rel] = r.returncode == 0
        return cache[rel]


def system_headers(cache=[]):
    """Names of the installed system headers and protos (`jpeglib.h`)."""
    if not cache:
        names = set()
        for folder, _, files in os.walk("/usr/include"):
            names.update(files)
        cache.append(names)
    return cache[0]


def comment_text(path, text):
    """[(line number, comment text)] of a C++/proto, shell, Python, Bazel or
    YAML file."""
    out = []
    if path.endswith(C_STYLE):
        i, n = 0, len(text)
        while i < n:
            c = text[i]
            if c == '"' or c == "'":
                if c == "'" and i > 0 and text[i - 1].isalnum():
                    i += 1  # a digit separator (1'000)
                    continue
                j = text.find("\n", i)
                m = re.compile(r'R"([^(\s]*)\(').match(text, i - 1) if c == '"' and i > 0 \
                    and text[i - 1] == "R" else None
                if m:
                    end = text.find(")" + m.group(1) + '"', i)
                    i = (n if end < 0 else end + len(m.group(1)) + 2)
                    continue
                k = i + 1
                while k < n and text[k] != c and text[k] != "\n":
                    k += 2 if text[k] == "\\" else 1
                i = k + 1
            elif text.startswith("//", i):
                j = text.find("\n", i)
                j = n if j < 0 else j
                out.append((text.count("\n", 0, i) + 1, text[i + 2:j]))
                i = j
            elif text.startswith("/*", i):
                j = text.find("*/", i + 2)
                j = n if j < 0 else j
                line = text.count("\n", 0, i) + 1
                for k, part in enumerate(text[i + 2:j].split("\n")):
                    out.append((line + k, part))
                i = j + 2
            else:
                i += 1
        return out
    lines = text.split("\n")
    if path.endswith(".py"):
        m = re.match(r'(?:#[^\n]*\n|\s)*("""|\'\'\')(.*?)\1', text, re.S)
        if m:
            start = text.count("\n", 0, m.start(2)) + 1
            out += [(start + k, part) for k, part in enumerate(m.group(2).split("\n"))]
    for number, line in enumerate(lines, 1):
        stripped = line.lstrip()
        if stripped.startswith("#!"):
            continue
        if stripped.startswith("#"):
            out.append((number, stripped[1:]))
        else:
            m = re.search(r"\s#\s(.*)$", line)
            if m and line.count('"', 0, m.start()) % 2 == 0 and \
                    line.count("'", 0, m.start()) % 2 == 0:
                out.append((number, m.group(1)))
    return out


def tokens(text):
    """[(token, explicit)] of the path-like words of one line of text."""
    found = []
    explicit_spans = set()
    for m in re.finditer(r"`([^`\s]+)`|\]\(([^)\s]+)\)", text):
        explicit_spans.add(m.group(1) or m.group(2))
    for m in PATH_TOKEN.finditer(text):
        token = m.group(1).rstrip(".")
        before = text[:m.start()]
        if re.search(r"(?:out|output)=$|>\s*$", before):
            continue  # a file the command named here writes
        if re.search(r"(?:^|/)(?:[A-Z]{2,4}|N{2,})(?:\.\w+)?$", token) and \
                token.rsplit("/", 1)[-1].split(".")[0] in ("FILE", "DIR", "PATH", "NAME") or \
                re.search(r"(?:^|/)N{2,}\.", token):
            continue  # a placeholder (FILE.md, NNNN.png)
        found.append((token, token in explicit_spans))
    return found


def check_paths(repo, md_files):
    """Problems with the repository paths named in Markdown pages and in
    comments; and how many names were checked."""
    problems, count = [], 0
    sources = []
    for path in md_files:
        rel = os.path.relpath(path, repo.root)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        sources.append((rel, list(enumerate(text.split("\n"), 1))))
    for rel in repo.files:
        if rel.startswith(("third_party/", "models/")) or "/testdata/" in rel:
            continue
        if not (rel.endswith(C_STYLE + HASH_STYLE) or os.path.basename(rel) in
                ("BUILD", "WORKSPACE")):
            continue
        try:
            with open(os.path.join(repo.root, rel), encoding="utf-8") as f:
                text = f.read()
        except (UnicodeDecodeError, OSError):
            continue
        sources.append((rel, comment_text(rel, text)))
    for rel, lines in sources:
        for number, line in lines:
            if "http://" in line or "https://" in line:
                line = re.sub(r"https?://\S+", "", line)
            for token, explicit in tokens(line):
                count += 1
                why = repo.path_problem(token, rel, explicit)
                if why:
                    problems.append(f"{rel}:{number}: {why}")
    return problems, count


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def with_ports(text, grpc, http):
    text = re.sub(r"\b(?:localhost|127\.0\.0\.1):50051\b", f"127.0.0.1:{grpc}", text)
    return re.sub(r"\b(?:localhost|127\.0\.0\.1):8000\b", f"127.0.0.1:{http}", text)


def matches(expected, actual):
    def norm(s):
        return "\n".join(l.rstrip() for l in s.strip("\n").split("\n")).strip("\n")
    pattern = ""
    for line in norm(expected).split("\n"):
        if line.strip() == "...":
            pattern += r"(?:[^\n]*\n)*?"  # any number of whole lines, none included
        else:
            pattern += ".*?".join(re.escape(part) for part in line.split("...")) + "\n"
    return re.fullmatch(pattern, norm(actual) + "\n", re.S) is not None


def run_block(block, grpc, http):
    """Runs one run block; returns None or the reason it failed."""
    want = 0
    m = re.search(r"exit=(\d+)", block.args)
    if m:
        want = int(m.group(1))
    script = with_ports(block.text, grpc, http)
    if block.lang == "python":
        command = ["/usr/bin/python3", "-"]
    else:
        command = ["bash", "-e", "-o", "pipefail", "-c", script]
        script = ""
    try:
        r = subprocess.run(command, cwd=ROOT, input=script, capture_output=True, text=True,
                           timeout=BLOCK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"still running after {BLOCK_TIMEOUT_S} s"
    if r.returncode != want:
        return f"exit {r.returncode}, expected {want}; stderr: {r.stderr.strip()[-800:]}"
    if block.expected is not None and not matches(with_ports(block.expected, grpc, http),
                                                  r.stdout):
        return f"output differs from the documented output:\n{r.stdout[-1500:]}"
    return None


def shm_state():
    entries = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    sysv = {}
    try:
        with open("/proc/sysvipc/shm") as f:
            for row in f.read().split("\n")[1:]:
                cols = row.split()
                if len(cols) > 6:
                    sysv[cols[1]] = int(cols[6])  # shmid -> nattch
    except OSError:
        pass
    return entries, sysv


def held_shm_names():
    """/dev/shm names some live process has open or mapped."""
    held = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/maps") as f:
                held.update(re.findall(r"/dev/shm/(\S+)", f.read()))
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("/dev/shm/"):
                    held.add(target[len("/dev/shm/"):])
        except OSError:
            continue
    return held


def session_pids(sid):
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[3]) == sid and fields[0] != "Z":
                pids.append(int(pid))
        except (OSError, IndexError, ValueError):
            continue
    return pids


def port_open(port):
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


class Stack:
    """The stack a start block describes, on free ports."""

    def __init__(self, block):
        self.block = block
        self.grpc, self.http = free_port(), free_port()
        self.before = shm_state()
        self.log = tempfile.NamedTemporaryFile("w+", prefix="docs_test-", suffix=".log")
        env = dict(os.environ)
        env.setdefault("MMSERVE_SERVE_OPT", "0")
        command = with_ports(block.text.strip(), self.grpc, self.http)
        command += f" --port={self.grpc} --http_port={self.http}"
        self.proc = subprocess.Popen(["bash", "-c", "exec " + command], cwd=ROOT, env=env,
                                     stdin=subprocess.DEVNULL, stdout=self.log,
                                     stderr=subprocess.STDOUT, start_new_session=True)

    def output(self):
        self.log.seek(0)
        return self.log.read()

    def wait_ready(self):
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            out = self.output()
            if re.search(r"^READY serve\.sh", out, re.M):
                return None
            if self.proc.poll() is not None:
                return f"exited ({self.proc.returncode}) before it was ready:\n{out[-2000:]}"
            time.sleep(0.5)
        return f"not ready in {READY_TIMEOUT_S} s"

    def stop(self):
        """Ctrl-C, then the leftovers; returns a list of problems."""
        problems = []
        sid = self.proc.pid
        try:
            os.killpg(sid, signal.SIGINT)
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            problems.append("still running 30 s after SIGINT")
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + 10
        while session_pids(sid) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = session_pids(sid)
        if left:
            problems.append(f"processes left behind: {left}")
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        entries, sysv = shm_state()
        new = entries - self.before[0] - held_shm_names()
        if new:
            problems.append(f"/dev/shm entries left: {sorted(new)}")
        orphans = [s for s, nattch in sysv.items() if s not in self.before[1] and nattch == 0]
        if orphans:
            problems.append(f"SysV segments left: {orphans}")
        for port in (self.grpc, self.http):
            if port_open(port):
                problems.append(f"port {port} still open")
        return problems


def main(argv):
    links_only = "--links_only" in argv
    no_stack = links_only or "--no_stack" in argv
    unknown = [a for a in argv if a.startswith("--") and a not in ("--links_only", "--no_stack")]
    if unknown:
        print(f"docs_test: unknown option {unknown[0]} (see the usage at the top of "
              f"tools/docs_test.py)")
        return 2
    files = [os.path.abspath(a) for a in argv if not a.startswith("--")]
    repo = Repo()
    if not files:
        files = [os.path.join(ROOT, f) for f in repo.files if f.endswith(".md")
                 and not f.startswith("third_party/")]
    failures = []
    links = 0
    blocks = []
    for path in files:
        problems, count = check_links(path)
        links += count
        failures += problems
        found = parse(path)[0]
        for prev, block in zip([None] + found, found):
            if block.kind != "output":
                blocks.append(block)
            elif prev is None or prev.kind == "output" or prev.expected is not None:
                failures.append(f"{block.where()}: an output block must follow a start or run block")
            else:
                prev.expected = block.text
    problems, paths = check_paths(repo, files)
    failures += problems
    for problem in failures:
        print(f"docs_test: {problem}")
    print(f"docs_test: {links} relative links and images in {len(files)} files checked")
    print(f"docs_test: {paths} repository paths named in those pages and in code comments "
          f"checked, {len(problems)} not in the repository")
    if not links_only:
        failures += check_references()
    starts = [b for b in blocks if b.kind == "start"]
    runs = [b for b in blocks if b.kind == "run"]
    if not no_stack and runs:
        if len(starts) != 1:
            failures.append(f"{len(starts)} start blocks; the runnable blocks need exactly one")
        else:
            failures += run_against_stack(starts[0], runs)
    if failures:
        print(f"docs_test: FAIL {len(failures)} problem(s); the first: {failures[0][:300]}")
        return 1
    ran = "" if no_stack else f", {len(runs)} runnable blocks passed against the stack"
    refs = "" if links_only else ", references current"
    print(f"docs_test: PASS ({links} links, {paths} paths{refs}{ran})")
    return 0


def check_references():
    """tools/gen_reference.py --check: the generated flag and metric pages
    are what the binaries and the source say now."""
    r = subprocess.run(["/usr/bin/python3", os.path.join(ROOT, "tools", "gen_reference.py"),
                        "--check"], cwd=ROOT, capture_output=True, text=True)
    for line in r.stdout.strip().split("\n"):
        print(f"docs_test: {line}")
    if r.returncode != 0:
        last = (r.stdout.strip().split("\n") or [""])[-1]
        return [f"the generated references: {last} ({r.stderr.strip()[-300:]})"]
    return []


def reference_metrics():
    """{family name: type} of docs/reference/metrics.md."""
    path = os.path.join(ROOT, "docs", "reference", "metrics.md")
    families = {}
    for m in re.finditer(r"^\| `(mmserve_\w+)` \| (\w+)", open(path, encoding="utf-8").read(),
                         re.M):
        families[m.group(1)] = m.group(2)
    return families


def check_live_metrics(stack_output):
    """Every family the stack's processes export (their metrics ports from
    the launcher's address lines) is in docs/reference/metrics.md with its
    type."""
    problems = []
    ports = [int(p) for p in re.findall(r"metrics :(\d+)", stack_output)]
    if not ports:
        return ["the stack printed no metrics ports"]
    documented = reference_metrics()
    seen = 0
    for port in ports:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
                page = r.read().decode()
        except OSError as e:
            problems.append(f"GET :{port}/metrics: {e}")
            continue
        for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", page, re.M):
            seen += 1
            if name not in documented:
                problems.append(f":{port}/metrics exports {name}, which "
                                "docs/reference/metrics.md does not list")
            elif documented[name] != kind:
                problems.append(f":{port}/metrics exports {name} as a {kind}; "
                                f"docs/reference/metrics.md says {documented[name]}")
    print(f"docs_test: {seen} metric families exported by {len(ports)} processes checked "
          "against docs/reference/metrics.md")
    return problems


def run_against_stack(start, runs):
    failures = []
    stack = Stack(start)
    print(f"docs_test: starting the stack ({start.where()}) on ports {stack.grpc}/{stack.http}")
    t0 = time.monotonic()
    problem = stack.wait_ready()
    if problem is None:
        print(f"docs_test: stack ready after {time.monotonic() - t0:.1f} s")
        if start.expected is not None and not matches(
                with_ports(start.expected, stack.grpc, stack.http), stack.output()):
            failures.append(f"{start.where()}: the start output differs from the documented "
                            f"output:\n{stack.output()[-1500:]}")
        for block in runs:
            t1 = time.monotonic()
            why = run_block(block, stack.grpc, stack.http)
            state = "ok" if why is None else "FAILED"
            print(f"docs_test: {block.where()} {state} ({time.monotonic() - t1:.1f} s)")
            if why is not None:
                print(f"   {why}")
                failures.append(f"{block.where()}: {why}")
        # After the blocks, so that the request-path families exist too.
        failures += check_live_metrics(stack.output())
    else:
        failures.append(f"{start.where()}: the stack {problem}")
    for p in stack.stop():
        failures.append(f"{start.where()}: after the stop: {p}")
    for f in failures:
        if "after the stop" in f:
            print(f"docs_test: {f}")
    return failures


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
