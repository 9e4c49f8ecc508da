"""Step 3 of scripts/validate-deploy: a rendered kustomization without its CRD objects.

Usage: drop_crds.py RENDERED OUT: copies the documents of RENDERED (the output of kustomize)
to OUT, less the monitoring.coreos.com/v1 objects (checked structurally in step 1), for the
schema check.
"""
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
keep = [d for d in docs if d.get("apiVersion") != "monitoring.coreos.com/v1"]
yaml.safe_dump_all(keep, open(sys.argv[2], "w"), sort_keys=False)
