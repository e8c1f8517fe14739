#!/usr/bin/python3
"""Checks the grammar's JSON schema output with an independent validator.

Documents made by random walks over the compiled grammars (schema_walks)
must be strict JSON valid against their schema (python3-jsonschema, draft
2020-12, with format checks). The corpus's own expectations are checked
against the validator too: `valid` and `refused_valid` documents are valid,
`invalid` ones are not.
"""
import json
import os
import subprocess
import sys

import jsonschema

CORPUS = "grammar/testdata/schema_corpus.json"
WALKS = 25


def strict_loads(text):
    def refuse(name):
        raise ValueError("not JSON: " + name)
    return json.loads(text, parse_constant=refuse)


def validator(schema):
    cls = jsonschema.Draft202012Validator
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def main():
    with open(CORPUS, encoding="utf-8") as f:
        cases = {c["name"]: c for c in json.load(f)}
    failures = []
    for c in cases.values():
        v = validator(c["schema"])
        for doc in c["valid"] + c["refused_valid"]:
            if not v.is_valid(strict_loads(doc)):
                failures.append(f"{c['name']}: corpus says valid: {doc}")
        for doc in c["invalid"]:
            try:
                ok = v.is_valid(strict_loads(doc))
            except ValueError:
                ok = False
            if ok:
                failures.append(f"{c['name']}: corpus says invalid: {doc}")
    out = subprocess.run(["grammar/schema_walks", CORPUS, str(WALKS)],
                         check=True, capture_output=True, text=True).stdout
    counts = {name: 0 for name in cases}
    for line in out.splitlines():
        item = json.loads(line)
        name, doc = item["name"], item["doc"]
        counts[name] += 1
        try:
            value = strict_loads(doc)
        except ValueError as e:
            failures.append(f"{name}: not JSON ({e}): {doc!r}")
            continue
        errors = list(validator(cases[name]["schema"]).iter_errors(value))
        if errors:
            failures.append(f"{name}: {errors[0].message}: {doc!r}")
    for name, n in counts.items():
        if n < WALKS // 2:
            failures.append(f"{name}: only {n} of {WALKS} walks finished")
    print(f"{sum(counts.values())} documents from {len(cases)} schemas")
    for f in failures:
        print("FAIL", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
