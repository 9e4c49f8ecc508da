"""Step 1 of scripts/validate-deploy: the kustomizations under deploy/kubernetes.

Every file they reference (resources, patches, configMapGenerator files) exists, every YAML
file there is referenced by one, every patch targets an object of its base, Services, the
PodDisruptionBudget, the HorizontalPodAutoscaler and the ServiceMonitor point at things that
exist, and the shutdown timings of the sluice Deployment fit together.

Usage: kustomizations.py WORK (run from the repository root). Writes to WORK: `objects` (the
object files to validate, one a line), `patches` (the strategic merge patch files),
`configs/<n>/` with `configs/<n>.label` (the configMapGenerator file sets) and `counts` (the
number of kustomizations). Prints each failure on stderr and exits 1 if there is any.
"""
import os, re, sys
import yaml

work = sys.argv[1]
root = "deploy/kubernetes"
errors = []
def err(msg): errors.append(msg)

# Kinds defined by CRDs, which kubernetes-validate has no schema for: checked here instead.
PLAIN_RULES = "deploy/prometheus/sluice-alerts.yaml"   # what a PrometheusRule must carry
CRD_KINDS = {("monitoring.coreos.com/v1", "ServiceMonitor"),
             ("monitoring.coreos.com/v1", "PrometheusRule")}

def load_docs(path):
    try:
        with open(path) as f:
            return [d for d in yaml.safe_load_all(f) if d is not None]
    except (OSError, yaml.YAMLError) as e:
        err(f"{path}: not valid YAML: {e}")
        return []

def is_kustomization(path):
    return os.path.basename(path) in ("kustomization.yaml", "kustomization.yml", "Kustomization")

yaml_files = set()
for d, dirs, files in os.walk(root):
    dirs[:] = [x for x in dirs if not x.startswith(".")]
    for f in files:
        if f.endswith((".yaml", ".yml")):
            yaml_files.add(os.path.normpath(os.path.join(d, f)))
kustomizations = sorted(p for p in yaml_files if is_kustomization(p))
if not kustomizations:
    err(f"no kustomization.yaml under {root}")

referenced = {}          # file -> role: object | patch | data
objects_of = {}          # kustomization dir -> [(file, doc)] reachable through resources
patches_of = {}          # kustomization dir -> [(file, doc)]
generated = {}           # kustomization dir -> {configmap name: (files, disable hash)}
config_sets = []

def kdir_file(d):
    for n in ("kustomization.yaml", "kustomization.yml", "Kustomization"):
        if os.path.isfile(os.path.join(d, n)):
            return os.path.join(d, n)
    return None

def walk(kdir, stack=()):
    kdir = os.path.normpath(kdir)
    if kdir in objects_of:
        return
    if kdir in stack:
        err(f"{kdir}: kustomization cycle"); return
    kfile = kdir_file(kdir)
    if kfile is None:
        err(f"{kdir}: referenced as a kustomization but has no kustomization.yaml"); return
    docs = load_docs(kfile)
    k = docs[0] if docs else {}
    if not isinstance(k, dict) or k.get("kind", "Kustomization") not in ("Kustomization", "Component"):
        err(f"{kfile}: not a Kustomization or a Component"); return
    objs, pats, gens = [], [], {}
    def ref(rel, what):
        p = os.path.normpath(os.path.join(kdir, rel))
        if "://" in rel or rel.startswith("github.com/"):
            err(f"{kfile}: {what} {rel!r} is remote; keep deploy/ self-contained"); return None
        if not os.path.exists(p):
            err(f"{kfile}: {what} {rel!r} does not exist ({p})"); return None
        return p
    for rel in k.get("resources", []) or []:
        p = ref(rel, "resource")
        if p is None: continue
        if os.path.isdir(p):
            walk(p, stack + (kdir,))
            objs.extend(objects_of.get(p, []))
            gens.update(generated.get(p, {}))
        else:
            referenced[p] = "object"
            objs.extend((p, doc) for doc in load_docs(p))
    for rel in k.get("components", []) or []:
        ref(rel, "component")
    entries = list(k.get("patches", []) or [])
    entries += [{"path": x} if isinstance(x, str) else {"patch": x} for x in k.get("patchesStrategicMerge", []) or []]
    entries += list(k.get("patchesJson6902", []) or [])
    for e in entries:
        if not isinstance(e, dict):
            err(f"{kfile}: bad patches entry {e!r}"); continue
        if "path" in e:
            p = ref(e["path"], "patch")
            if p is None: continue
            referenced[p] = "patch"
            if "target" in e:
                continue      # JSON 6902 or targeted patch: the target selects the objects
            pats.extend((p, doc) for doc in load_docs(p))
    for gkey in ("configMapGenerator", "secretGenerator"):
        for g in k.get(gkey, []) or []:
            files = []
            for spec in g.get("files", []) or []:
                key, _, rel = spec.partition("=") if "=" in spec else (None, None, spec)
                p = ref(rel, f"{gkey} file")
                if p is not None:
                    referenced[p] = "data"
                    files.append((key or os.path.basename(rel), p))
            for rel in ([g["env"]] if "env" in g else []) + (g.get("envs", []) or []):
                p = ref(rel, f"{gkey} env file")
                if p is not None:
                    referenced[p] = "data"
            if gkey == "configMapGenerator":
                hashless = bool((g.get("options") or {}).get("disableNameSuffixHash")
                                or (k.get("generatorOptions") or {}).get("disableNameSuffixHash"))
                gens[g.get("name")] = (files, hashless)
                if files:
                    config_sets.append((f"{kfile}: configMapGenerator {g.get('name')}", files))
    objects_of[kdir], patches_of[kdir], generated[kdir] = objs, pats, gens

for kf in kustomizations:
    walk(os.path.dirname(kf))

# Every YAML file must play a part: an unreferenced one is a file an operator may edit in vain.
for p in sorted(yaml_files):
    if not is_kustomization(p) and p not in referenced:
        err(f"{p}: not referenced by any kustomization (resources, patches or generators)")

def meta(doc):
    return (doc.get("apiVersion"), doc.get("kind"), (doc.get("metadata") or {}).get("name"))

object_files = []
for p, role in sorted(referenced.items()):
    if role != "object":
        continue
    docs = load_docs(p)
    kinds = set()
    for doc in docs:
        api, kind, name = meta(doc) if isinstance(doc, dict) else (None, None, None)
        if not (api and kind and name):
            err(f"{p}: every document needs apiVersion, kind and metadata.name"); continue
        if "$patch" in doc:
            err(f"{p}: {kind}/{name} is a patch ($patch) listed under resources"); continue
        kinds.add((api, kind) in CRD_KINDS)
    if kinds == {False}:
        object_files.append(p)
    elif kinds == {True, False}:
        err(f"{p}: keep CRD objects ({', '.join(k for _, k in CRD_KINDS)}) in files of their own")

# Cross-references, per kustomization (on the objects before patches; patches here only
# change replicas, env and resources).
def selects(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())

def check_grace(p, dep):
    spec = dep["spec"]["template"]["spec"]
    def secs(v):
        m = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m|h)", str(v))
        return float(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[m.group(2)] if m else None
    grace = spec.get("terminationGracePeriodSeconds", 30)
    for c in spec.get("containers", []):
        env = {e["name"]: e.get("value") for e in c.get("env", []) or []}
        delay = secs(env.get("SHUTDOWN_DELAY", "5s"))
        drain = secs(env.get("SHUTDOWN_GRACE_PERIOD", "15s"))
        if delay is None or drain is None:
            err(f"{p}: SHUTDOWN_DELAY/SHUTDOWN_GRACE_PERIOD are not durations"); continue
        if not grace > delay + drain:
            err(f"{p}: terminationGracePeriodSeconds {grace} must exceed SHUTDOWN_DELAY + "
                f"SHUTDOWN_GRACE_PERIOD ({delay + drain:g}s), or pods are killed mid-drain")
        lp = c.get("livenessProbe") or {}
        window = lp.get("failureThreshold", 3) * lp.get("periodSeconds", 10)
        if lp and window <= grace:
            err(f"{p}: livenessProbe failureThreshold x periodSeconds ({window}s) must exceed "
                f"terminationGracePeriodSeconds ({grace}s): /healthcheck fails during shutdown")
        args = c.get("args", []) or []
        cfg = args[args.index("--config") + 1] if "--config" in args[:-1] else None
        mounts = {m["mountPath"]: m for m in c.get("volumeMounts", []) or []}
        if cfg and cfg in mounts and "subPath" in mounts[cfg]:
            err(f"{p}: the config mount uses subPath, which never receives ConfigMap updates")

for kdir, objs in sorted(objects_of.items()):
    by_kind = {}
    for p, doc in objs:
        if isinstance(doc, dict):
            by_kind.setdefault(doc.get("kind"), []).append((p, doc))
    names = {(d.get("kind"), (d.get("metadata") or {}).get("name")) for _, d in objs if isinstance(d, dict)}
    names |= {("ConfigMap", n) for n in generated.get(kdir, {})}
    pods = [(p, d) for p, d in by_kind.get("Deployment", [])]
    for p, doc in patches_of.get(kdir, []):
        _, kind, name = meta(doc)
        if (kind, name) not in names:
            err(f"{p}: patches {kind}/{name}, which {kdir} does not contain")
    for p, svc in by_kind.get("Service", []):
        sel = svc["spec"].get("selector", {})
        match = [d for _, d in pods if selects(sel, d["spec"]["template"]["metadata"].get("labels", {}))]
        if not match:
            err(f"{kdir}: Service {svc['metadata']['name']} selects no Deployment's pods"); continue
        ports = {cp.get("name") for d in match for c in d["spec"]["template"]["spec"]["containers"]
                 for cp in c.get("ports", []) or []}
        for sp in svc["spec"].get("ports", []):
            tp = sp.get("targetPort")
            if isinstance(tp, str) and tp not in ports:
                err(f"{p}: targetPort {tp!r} is not a container port name of the selected pods")
    for p, dep in pods:
        d_sel = dep["spec"]["selector"].get("matchLabels", {})
        if not selects(d_sel, dep["spec"]["template"]["metadata"].get("labels", {})):
            err(f"{p}: Deployment selector does not match its pod template labels")
        for v in dep["spec"]["template"]["spec"].get("volumes", []) or []:
            cm = (v.get("configMap") or {}).get("name")
            if cm and ("ConfigMap", cm) not in names:
                err(f"{p}: mounts ConfigMap {cm}, which {kdir} does not generate or declare")
            if cm and cm in generated.get(kdir, {}) and not generated[kdir][cm][1]:
                err(f"{kdir}: ConfigMap {cm} needs disableNameSuffixHash: true to be updated in place")
        if dep["metadata"]["name"] == "sluice":
            check_grace(p, dep)
    for p, hpa in by_kind.get("HorizontalPodAutoscaler", []):
        t = hpa["spec"]["scaleTargetRef"]
        if (t.get("kind"), t.get("name")) not in names:
            err(f"{p}: scaleTargetRef {t.get('kind')}/{t.get('name')} does not exist")
    for p, pdb in by_kind.get("PodDisruptionBudget", []):
        sel = pdb["spec"].get("selector", {}).get("matchLabels", {})
        if not any(selects(sel, d["spec"]["template"]["metadata"].get("labels", {})) for _, d in pods):
            err(f"{p}: PodDisruptionBudget selects no pods")
    for p, sm in by_kind.get("ServiceMonitor", []):
        spec = sm.get("spec") or {}
        sel = (spec.get("selector") or {}).get("matchLabels", {})
        svcs = [s for _, s in by_kind.get("Service", []) if selects(sel, s["metadata"].get("labels", {}))]
        if not svcs:
            err(f"{p}: ServiceMonitor selects no Service by its labels")
        eps = spec.get("endpoints")
        if not isinstance(eps, list) or not eps:
            err(f"{p}: ServiceMonitor needs spec.endpoints")
            continue
        for ep in eps:
            allowed = {"port", "path", "interval", "scrapeTimeout", "scheme", "honorLabels",
                       "relabelings", "metricRelabelings", "targetPort", "tlsConfig"}
            for key in set(ep) - allowed:
                err(f"{p}: unexpected ServiceMonitor endpoint field {key!r}")
            port_names = {sp.get("name") for s in svcs for sp in s["spec"].get("ports", [])}
            if "port" in ep and ep["port"] not in port_names:
                err(f"{p}: endpoint port {ep['port']!r} is not a port name of the selected Service")
            for key in ("interval", "scrapeTimeout"):
                if key in ep and not re.fullmatch(r"(\d+(ms|s|m|h))+", str(ep[key])):
                    err(f"{p}: {key} {ep[key]!r} is not a Prometheus duration")
    # A PrometheusRule carries the groups of the plain rule file, unchanged.
    for p, rule in by_kind.get("PrometheusRule", []):
        groups = (rule.get("spec") or {}).get("groups")
        if not isinstance(groups, list) or not groups:
            err(f"{p}: PrometheusRule needs spec.groups"); continue
        for g in groups:
            for r in g.get("rules", []) or []:
                if not r.get("expr") or not (r.get("alert") or r.get("record")):
                    err(f"{p}: group {g.get('name')}: every rule needs expr and alert (or record)")
        plain = load_docs(PLAIN_RULES)
        if not plain or plain[0].get("groups") != groups:
            err(f"{p}: spec.groups differ from {PLAIN_RULES}: keep the two the same")

with open(os.path.join(work, "objects"), "w") as f:
    f.write("".join(p + "\n" for p in object_files))
with open(os.path.join(work, "patches"), "w") as f:
    f.write("".join(p + "\n" for p in sorted({p for ps in patches_of.values() for p, _ in ps})))
for i, (label, files) in enumerate(config_sets):
    d = os.path.join(work, "configs", str(i))
    os.makedirs(d)
    with open(d + ".label", "w") as f:
        f.write(label + "\n")
    for key, p in files:
        with open(p, "rb") as src, open(os.path.join(d, key), "wb") as dst:
            dst.write(src.read())
with open(os.path.join(work, "counts"), "w") as f:
    f.write(f"{len(kustomizations)}\n")

for e in dict.fromkeys(errors):         # each once, in order (bases are seen per overlay)
    print(f"  {e}", file=sys.stderr)
sys.exit(1 if errors else 0)
