#!/usr/bin/env python3
"""Downloads the llama-cpp-python sdist (llama.cpp vendored) for bench/peer/.

`pip download --no-binary :all:` builds the sdist's metadata before it saves
the file (it installs scikit-build-core and cmake first), which can stall for
minutes or fail offline. This fetches the file itself: PyPI's Simple API in
its JSON form (PEP 691; the index pip is configured with, PIP_INDEX_URL, else
pypi.org), the one sdist of the version, its sha256 checked against the index
before it is kept. Uses pip's vendored `requests`, which honours PIP_CERT and
the proxies pip itself would use, and no other package.

  python3 tools/llamacpp_sdist.py --version=0.3.36 --dest=$HOME/.cache/mmserve/llamacpp
"""

import argparse
import hashlib
import os
import sys

from pip._vendor import requests

PROJECT = "llama-cpp-python"


def index_url():
    return os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")


def find_sdist(session, version):
    """(url, sha256, filename) of the version's sdist on the index."""
    url = f"{index_url()}/{PROJECT}/"
    r = session.get(url, headers={"Accept": "application/vnd.pypi.simple.v1+json"}, timeout=60)
    r.raise_for_status()
    if "json" not in r.headers.get("content-type", ""):
        sys.exit(f"llamacpp_sdist: {url} did not answer in the Simple API's JSON form")
    name = f"llama_cpp_python-{version}.tar.gz"
    for f in r.json()["files"]:
        if f["filename"] == name:
            return f["url"], f["hashes"].get("sha256"), name
    sys.exit(f"llamacpp_sdist: no {name} on {url}")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--version", required=True)
    p.add_argument("--dest", required=True, help="directory to save the sdist in")
    args = p.parse_args()
    session = requests.Session()
    cert = os.environ.get("PIP_CERT")
    if cert:
        session.verify = cert
    url, sha256, name = find_sdist(session, args.version)
    os.makedirs(args.dest, exist_ok=True)
    path = os.path.join(args.dest, name)
    h = hashlib.sha256()
    with session.get(url, stream=True, timeout=300) as r:
        r.raise_for_status()
        with open(path + ".tmp", "wb") as f:
            for block in r.iter_content(1 << 20):
                h.update(block)
                f.write(block)
    if sha256 and h.hexdigest() != sha256:
        os.remove(path + ".tmp")
        sys.exit(f"llamacpp_sdist: {name}: sha256 {h.hexdigest()}, the index says {sha256}")
    os.replace(path + ".tmp", path)
    print(f"llamacpp_sdist: {path} (sha256 {h.hexdigest()})", file=sys.stderr)


if __name__ == "__main__":
    main()
