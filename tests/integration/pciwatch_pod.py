"""A Pod manifest of the tests' own for pciwatch's image (tests/plugins/pciwatch), beside the
DaemonSet it ships with: used where a test needs other args or mounts than the DaemonSet's."""

from __future__ import annotations

import json
from pathlib import Path

PCIWATCH_REF = "example.com/pciwatch:1.0"  # the reference build.py gives pciwatch's images
POD = """\
apiVersion: v1
kind: Pod
metadata: {{name: pciwatch}}
spec:
  containers:
  - name: pciwatch
    image: {image}
    args: {args}
    securityContext: {{privileged: true}}
    volumeMounts: [{mounts}]
  volumes: [{volumes}]
"""


def pciwatch_pod(path: Path, args: list[str], host_paths=("/var/lib/kubelet/device-plugins",)) -> Path:
    """A Pod manifest of our own for pciwatch's image (not its DaemonSet): privileged, with `args`,
    each of `host_paths` mounted from the node at the same path."""
    names = [f"v{i}" for i in range(len(host_paths))]
    path.write_text(POD.format(
        image=PCIWATCH_REF, args=json.dumps(args),
        mounts=", ".join(f"{{name: {n}, mountPath: {p}}}" for n, p in zip(names, host_paths, strict=True)),
        volumes=", ".join(f"{{name: {n}, hostPath: {{path: {p}}}}}" for n, p in zip(names, host_paths,
                                                                                  strict=True))))
    return path
