"""Step 2 of scripts/validate-deploy: strategic merge patches against the strict schemas.

Patches are partial objects: each is checked against the same strict Kubernetes schemas as the
object files, ignoring only missing required fields (the base provides those), so that a
misspelled field in a patch is caught. Delete patches (`$patch: delete`) carry nothing else to
check.

Usage: patches.py PATCH_LIST VERSION... (PATCH_LIST: a file of patch paths, one a line; the
Kubernetes versions to check against). Needs kubernetes-validate (its schemas, jsonschema,
referencing, PyYAML). Prints each failure on stderr and exits 1 if there is any.
"""
import re, sys
import jsonschema, yaml
from referencing import Registry, Resource
from kubernetes_validate import utils

bad = 0
for path in open(sys.argv[1]).read().split():
    for doc in yaml.safe_load_all(open(path)):
        if not doc or doc.get("$patch") == "delete":
            continue
        for version in sys.argv[2:]:
            mm = utils.major_minor(version)
            v = [x for x in utils.all_versions() if utils.major_minor(x) <= mm][-1]
            sdir = f"kubernetes-json-schema/v{v}-local-strict"
            api = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", doc["apiVersion"])
            try:
                schema = utils.schema_contents(f"{sdir}/{doc['kind'].lower()}-{api}.json", version)
            except FileNotFoundError:
                print(f"  {path}: no schema for {doc['kind']} {doc['apiVersion']} in Kubernetes {mm}",
                      file=sys.stderr)
                bad = 1
                continue
            defs = utils.schema_contents(f"{sdir}/_definitions.json", version)
            registry = Resource.from_contents(defs) @ (Resource.from_contents(schema) @ Registry())
            validator = jsonschema.validators.Draft202012Validator(schema, registry=registry)
            for e in validator.iter_errors(doc):
                if e.validator == "required":
                    continue
                where = ".".join(str(x) for x in e.absolute_path)
                print(f"  {path}: Kubernetes {mm}: {where}: {e.message}", file=sys.stderr)
                bad = 1
sys.exit(bad)
