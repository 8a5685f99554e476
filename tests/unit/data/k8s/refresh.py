"""Rewrite one vendored CRD schema from a CRD YAML (see SOURCES.md).

    git -C MIRROR show REF:PATH | python tests/unit/data/k8s/refresh.py VERSION OUT.schema.json.gz

Keeps only the openAPIV3Schema of the served VERSION, without its descriptions (the bulk of a CRD; the
checks do not read them). gzip's header carries no time, so the same CRD gives the same bytes.
"""
import gzip
import json
import sys

import yaml


def served_schema(crd: dict, version: str) -> dict:
    for entry in crd["spec"]["versions"]:
        if entry["name"] == version and entry.get("served", True):
            return entry["schema"]["openAPIV3Schema"]
    raise SystemExit(f"{crd['metadata']['name']}: no served version {version}")


def undescribed(schema):
    """The schema less its description keywords; a property that is itself named description stays."""
    if isinstance(schema, list):
        return [undescribed(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key == "properties":
            out[key] = {name: undescribed(sub) for name, sub in value.items()}
        elif key in ("items", "additionalProperties", "not", "anyOf", "oneOf", "allOf"):
            out[key] = undescribed(value)
        elif key != "description":
            out[key] = value
    return out


def main(argv: list[str]) -> None:
    version, out = argv
    crds = [doc for doc in yaml.safe_load_all(sys.stdin) if doc and doc.get("kind") == "CustomResourceDefinition"]
    if len(crds) != 1:
        raise SystemExit(f"expected one CustomResourceDefinition on stdin, got {len(crds)}")
    text = json.dumps(undescribed(served_schema(crds[0], version)), sort_keys=True, separators=(",", ":"))
    with open(out, "wb") as f, gzip.GzipFile(fileobj=f, mode="wb", mtime=0, filename="") as gz:
        gz.write(text.encode())


if __name__ == "__main__":
    main(sys.argv[1:])
