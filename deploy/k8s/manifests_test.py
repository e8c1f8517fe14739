#!/usr/bin/env python3
"""Offline checks of the Kubernetes manifests in deploy/k8s (no cluster, no
API schema here: the manifests are untested on a cluster).

Checks that every resource kustomization.yaml lists parses and has the
fields the API requires; that each Deployment's selector matches its pod
labels, each probe and Service port names a container port, each referenced
ConfigMap, key and $(VAR) exists; that the topology is the compose one
(router, 2 encoders, 1 language instance of role both, tcp profile,
registering at the router's Service); and that every flag of the ConfigMap's
flagfiles and of the args is one the binary accepts, by running the binaries
(router, encoder, language, from Bazel's runfiles) with them and --helpfull.

Run by Bazel (//deploy/k8s:manifests_test) or by hand:
  deploy/k8s/manifests_test.py BAZEL_BIN
Prints one line per check and "manifests_test: PASS" last.
"""
import os
import re
import subprocess
import sys
import tempfile

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
API = {"ConfigMap": "v1", "Service": "v1", "Deployment": "apps/v1"}
BINARIES = {"router": "router/router", "encoder": "encoder_service/encoder",
            "language": "language_service/language"}
VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)
    return ok


def load():
    with open(os.path.join(HERE, "kustomization.yaml")) as f:
        kustomization = yaml.safe_load(f)
    docs = []
    for name in kustomization["resources"]:
        with open(os.path.join(HERE, name)) as f:
            docs += [d for d in yaml.safe_load_all(f) if d is not None]
    return docs


def check_required(doc):
    kind = doc.get("kind")
    name = doc.get("metadata", {}).get("name", "")
    ok = (check(kind in API, f"{kind} {name}: a kind these manifests use") and
          check(doc.get("apiVersion") == API[kind], f"{kind} {name}: apiVersion {API[kind]}") and
          check(re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name) is not None,
                f"{kind} {name}: metadata.name a DNS label"))
    if ok and kind == "ConfigMap":
        check(all(isinstance(v, str) for v in doc.get("data", {}).values()),
              f"ConfigMap {name}: every value a string")
    return ok


def container_ports(container):
    return {p["name"]: p["containerPort"] for p in container.get("ports", [])}


def probe_port(probe):
    if "grpc" in probe:
        return probe["grpc"]["port"]
    if "tcpSocket" in probe:
        return probe["tcpSocket"]["port"]
    return None


def check_deployment(dep, configmaps):
    name = dep["metadata"]["name"]
    spec = dep["spec"]
    labels = spec["template"]["metadata"]["labels"]
    check(spec["selector"]["matchLabels"].items() <= labels.items(),
          f"Deployment {name}: selector matches the pod labels")
    pod = spec["template"]["spec"]
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    for v in volumes.values():
        if "configMap" in v:
            check(v["configMap"]["name"] in configmaps,
                  f"Deployment {name}: volume {v['name']} names an existing ConfigMap")
    for c in pod["containers"]:
        what = f"Deployment {name} container {c.get('name')}"
        check(bool(c.get("name")) and bool(c.get("image")), f"{what}: name and image")
        ports = container_ports(c)
        for kind in ("readinessProbe", "livenessProbe"):
            probe = c.get(kind)
            if check(probe is not None, f"{what}: has a {kind}"):
                port = probe_port(probe)
                check(port in ports.values() or port in ports or "exec" in probe,
                      f"{what}: {kind} on a container port ({port})")
        check("grpc" in c.get("readinessProbe", {}),
              f"{what}: readiness from the gRPC health service")
        env = {e["name"] for e in c.get("env", [])}
        for ref in c.get("envFrom", []):
            check(ref["configMapRef"]["name"] in configmaps,
                  f"{what}: envFrom names an existing ConfigMap")
        for arg in c.get("args", []):
            for var in VAR.findall(arg):
                check(var in env, f"{what}: $({var}) in args is an env variable")
        for m in c.get("volumeMounts", []):
            check(m["name"] in volumes, f"{what}: mount {m['name']} is a volume")


def check_service(svc, deployments):
    name = svc["metadata"]["name"]
    sel = svc["spec"]["selector"]
    targets = [d for d in deployments
               if sel.items() <= d["spec"]["template"]["metadata"]["labels"].items()]
    if not check(len(targets) == 1, f"Service {name}: selects the pods of one Deployment"):
        return
    ports = {}
    for c in targets[0]["spec"]["template"]["spec"]["containers"]:
        ports.update(container_ports(c))
    for p in svc["spec"]["ports"]:
        t = p.get("targetPort", p["port"])
        check(t in ports or t in ports.values(), f"Service {name}: port {p['name']} -> {t} exists")


def flagfile(configmaps, container):
    """The flagfile a container's args name, as (ConfigMap key, text)."""
    mounts = {m["mountPath"]: m["name"] for m in container.get("volumeMounts", [])}
    for arg in container.get("args", []):
        if arg.startswith("--flagfile="):
            path = arg.split("=", 1)[1]
            key = os.path.basename(path)
            for cm in configmaps.values():
                if key in cm.get("data", {}) and os.path.dirname(path) in mounts:
                    return key, cm["data"][key]
    return None, ""


def flags_of(text, args):
    flags = {}
    for line in text.splitlines() + list(args):
        line = line.strip()
        if line.startswith("--") and "=" in line:
            k, v = line[2:].split("=", 1)
            flags[k] = v
    return flags


def check_binary(bazel_bin, binary, text, args):
    """Runs the binary with the flagfile and args: every flag must parse."""
    path = os.path.join(bazel_bin, BINARIES[binary])
    if not check(os.access(path, os.X_OK), f"{binary}: binary {path} built"):
        return
    with tempfile.TemporaryDirectory() as tmp:
        ff = os.path.join(tmp, "flags")
        with open(ff, "w") as f:
            f.write(text)
        args = [VAR.sub("x-0", a) for a in args if not a.startswith("--flagfile=")]
        run = subprocess.run([path, f"--flagfile={ff}"] + args + ["--helpfull"],
                             capture_output=True, text=True, timeout=60)
        errors = [line for line in run.stderr.splitlines() if "ERROR" in line]
        check(not errors, f"{binary}: accepts every flag of its flagfile and args {errors[:2]}")


def main():
    bazel_bin = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.environ.get("TEST_SRCDIR", ""), os.environ.get("TEST_WORKSPACE", "mmserve"))
    docs = load()
    if not all(check_required(d) for d in docs):
        return 1
    configmaps = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}
    deployments = [d for d in docs if d["kind"] == "Deployment"]
    services = [d for d in docs if d["kind"] == "Service"]
    for d in deployments:
        check_deployment(d, configmaps)
    for s in services:
        check_service(s, deployments)

    # The compose topology, and each container's flags.
    by_binary = {}
    router_service = None
    for d in deployments:
        c = d["spec"]["template"]["spec"]["containers"][0]
        binary = os.path.basename(c["command"][0])
        key, text = flagfile(configmaps, c)
        check(key is not None, f"{binary}: its --flagfile is a key of a mounted ConfigMap")
        by_binary[binary] = (d["spec"].get("replicas", 1), flags_of(text, c.get("args", [])))
        check_binary(bazel_bin, binary, text, c.get("args", []))
        if binary == "router":
            labels = d["spec"]["template"]["metadata"]["labels"]
            router_service = next((s for s in services
                                   if s["spec"]["selector"].items() <= labels.items()), None)
        else:
            port = by_binary[binary][1].get("port")
            check(by_binary[binary][1].get("advertise", "").endswith(":" + str(port)) and
                  int(port) in container_ports(c).values(),
                  f"{binary}: --advertise and the grpc containerPort are its --port")
    check(sorted(by_binary) == ["encoder", "language", "router"],
          "one Deployment each for router, encoder, language")
    check(by_binary.get("router", (0,))[0] == 1 and by_binary.get("encoder", (0,))[0] == 2 and
          by_binary.get("language", (0,))[0] == 1, "replicas: 1 router, 2 encoders, 1 language")
    check(by_binary.get("language", (0, {}))[1].get("role") == "both", "language: --role=both")
    if check(router_service is not None, "a Service selects the router"):
        # Instances register on the router's internal plane (Registry is
        # never on the public port).
        internal = next((p["port"] for p in router_service["spec"]["ports"]
                         if p["name"] == "internal"), None)
        check(internal is not None, "the router's Service has an internal port")
        for binary in ("encoder", "language"):
            flags = by_binary.get(binary, (0, {}))[1]
            check(flags.get("router") == f"{router_service['metadata']['name']}:{internal}",
                  f"{binary}: registers at the router Service's internal port "
                  f"({flags.get('router')})")
            check(flags.get("profile") == "tcp", f"{binary}: tcp profile (pods on several hosts)")
    if failures:
        print(f"manifests_test: FAIL {len(failures)} check(s): {failures[0]}")
        return 1
    print("manifests_test: PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
