#!/usr/bin/env python3
"""The docs test: the docs' runnable shell blocks against a live stack, and
every relative link and image in README.md and docs/.

Usage: tools/docs_test.py [--links_only] [FILE.md ...]
       (default files: README.md and docs/**/*.md)

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

In every marked block, and in expected output, localhost:50051 and
127.0.0.1:50051 (gRPC) and the same with :8000 (HTTP) stand for the stack's
ports. Needs no network and no GPU. Runs the stack with
MMSERVE_SERVE_OPT=0 (reuse the default build) unless that is set.

Links: every [text](target), ![alt](target), <img src> and <a href> outside
code must name a file or folder inside the repository, and a #anchor in
a Markdown file must be one of its headings (GitHub's slugs).

Prints one line per check and "docs_test: PASS ..." or "docs_test: FAIL
..." last; exit status 0 only when everything passed.
"""
import glob
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time

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
    files = [os.path.abspath(a) for a in argv if not a.startswith("--")]
    if not files:
        files = [os.path.join(ROOT, "README.md")] + sorted(
            glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True))
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
    for problem in failures:
        print(f"docs_test: {problem}")
    print(f"docs_test: {links} relative links and images in {len(files)} files checked")
    starts = [b for b in blocks if b.kind == "start"]
    runs = [b for b in blocks if b.kind == "run"]
    if not links_only and runs:
        if len(starts) != 1:
            failures.append(f"{len(starts)} start blocks; the runnable blocks need exactly one")
        else:
            failures += run_against_stack(starts[0], runs)
    if failures:
        print(f"docs_test: FAIL {len(failures)} problem(s); the first: {failures[0][:300]}")
        return 1
    ran = "" if links_only else f", {len(runs)} runnable blocks passed against the stack"
    print(f"docs_test: PASS ({links} links{ran})")
    return 0


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
