"""Step 5 of scripts/validate-deploy: the Grafana dashboards under deploy/grafana.

Each parses as JSON, has a title and a schemaVersion, every panel target has an expr, and a
panel's datasource variable is defined. Run from the repository root; prints each failure on
stderr and exits 1 if there is any.
"""
import glob, json, sys
bad = 0
files = sorted(glob.glob("deploy/grafana/*.json"))
if not files:
    print("  no dashboard under deploy/grafana", file=sys.stderr); bad = 1
for p in files:
    try:
        d = json.load(open(p))
    except ValueError as e:
        print(f"  {p}: not valid JSON: {e}", file=sys.stderr); bad = 1; continue
    variables = {v.get("name") for v in d.get("templating", {}).get("list", [])}
    exprs = [t.get("expr") for pn in d.get("panels", []) for t in pn.get("targets", [])]
    if not d.get("title") or not d.get("schemaVersion"):
        print(f"  {p}: needs a title and a schemaVersion", file=sys.stderr); bad = 1
    if not exprs or not all(exprs):
        print(f"  {p}: every panel target needs an expr", file=sys.stderr); bad = 1
    used = {v for e in exprs for v in variables if f"${v}" in e}
    for pn in d.get("panels", []):
        ds = (pn.get("datasource") or {}).get("uid", "")
        if ds.startswith("$") and ds.strip("${}") not in variables:
            print(f"  {p}: panel {pn.get('title')!r} uses undefined variable {ds}", file=sys.stderr); bad = 1
sys.exit(bad)
