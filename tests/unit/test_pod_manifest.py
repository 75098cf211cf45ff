"""A plugin's DaemonSet manifest read for what the node must give its container, strictly
(fixtures/pod_manifest.py), and turned into the OCI runtime configuration crun runs
(fixtures/image_plugin.py)."""

from __future__ import annotations

import textwrap

import pytest

from hilconform.fixtures.image_plugin import container_argv, runtime_config
from hilconform.fixtures.pod_manifest import ManifestError, read_manifest

DAEMONSET = """\
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: pciwatch, namespace: kube-system}
spec:
  selector: {matchLabels: {name: pciwatch}}
  template:
    metadata: {labels: {name: pciwatch}}
    spec:
      priorityClassName: system-node-critical
      tolerations: [{key: example.com/gpu, operator: Exists, effect: NoSchedule}]
      containers:
      - name: plugin
        image: example.com/pciwatch:1.0
        args: ["--resource", "example.com/a100", "--ids", "10de:20b0"]
        env: [{name: PCIWATCH_LOG, value: info}]
        securityContext: {privileged: true}
        resources: {limits: {memory: 64Mi}}
        volumeMounts:
        - {name: device-plugins, mountPath: /var/lib/kubelet/device-plugins}
        - {name: sys, mountPath: /sys, readOnly: true}
        - {name: scratch, mountPath: /scratch}
        - {name: dev, mountPath: /dev/vfio, subPath: vfio, mountPropagation: HostToContainer}
        - {name: dev, mountPath: /host/dev, mountPropagation: Bidirectional}
      volumes:
      - {name: device-plugins, hostPath: {path: /var/lib/kubelet/device-plugins}}
      - {name: sys, hostPath: {path: /sys}}
      - {name: scratch, emptyDir: {}}
      - {name: dev, hostPath: {path: /dev/, type: Directory}}
"""


def _manifest(tmp_path, text=DAEMONSET):
    path = tmp_path / "daemonset.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def test_a_daemonset_gives_the_container_as_deployed(tmp_path):
    spec = read_manifest(_manifest(tmp_path))
    assert (spec.kind, spec.name, spec.image, spec.privileged) == ("DaemonSet", "plugin",
                                                                   "example.com/pciwatch:1.0", True)
    assert spec.args == ("--resource", "example.com/a100", "--ids", "10de:20b0") and spec.command is None
    assert [(m.container_path, m.host_path, m.read_only, m.host_type, m.sub_path, m.propagation)
            for m in spec.mounts] == [
        ("/var/lib/kubelet/device-plugins", "/var/lib/kubelet/device-plugins", False, "", "", "None"),
        ("/sys", "/sys", True, "", "", "None"), ("/scratch", None, False, "", "", "None"),
        ("/dev/vfio", "/dev", False, "Directory", "vfio", "HostToContainer"),
        ("/host/dev", "/dev", False, "Directory", "", "Bidirectional")]
    assert "pod tolerations: no meaning on one node" in spec.left_aside
    assert "container resources: not applied on the node" in spec.left_aside
    assert container_argv({"Entrypoint": ["/usr/bin/pciwatch"], "Cmd": ["--help"]}, spec) == [
        "/usr/bin/pciwatch", "--resource", "example.com/a100", "--ids", "10de:20b0"]


@pytest.mark.parametrize("change, error", [
    (("env: [{name: PCIWATCH_LOG, value: info}]",
      "env: [{name: NODE, valueFrom: {fieldRef: {fieldPath: x}}}]"), "takes its value from the API server"),
    (("{path: /sys}", "{path: /run/hilconform/control.sock}"),
     "mounts host path /run/hilconform/control.sock, which the node cannot give a plugin: it is at or "
     "under /run/hilconform, the harness's folder on an emulated node"),
    (("{path: /sys}", "{path: /tmp/hilconform-kubelet.Ab12Cd}"),
     "volume sys mounts host path /tmp/hilconform-kubelet.Ab12Cd, which the node cannot give"),
    (("{path: /sys}", "{path: /sys, type: Dir}"), "hostPath.type 'Dir' is none of the kubelet's"),
    (("{path: /sys}", "{path: /sys, server: x}"),
     "hostPath fields this harness cannot honour: \\['server'\\]"),
    (("- {name: sys, mountPath: /sys, readOnly: true}", "- {name: sys, mountPath: /sys, subPath: ../etc}"),
     "volumeMount sys: subPath '../etc' must be a relative path without '..'"),
    (("- {name: sys, mountPath: /sys, readOnly: true}",
      "- {name: sys, mountPath: /sys, subPathExpr: $(NODE)}"), "subPathExpr is not honoured: .*downward API"),
    (("securityContext: {privileged: true}", "securityContext: {privileged: false}"),
     "Bidirectional mount propagation is for privileged containers only"),
    (("mountPropagation: Bidirectional", "mountPropagation: Both"), "mountPropagation 'Both' is none of"),
    (("readOnly: true", "readOnly: yes please"), "readOnly must be true or false"),
    (("emptyDir: {}", "configMap: {name: c}"), "this harness gives hostPath"),
    (("securityContext: {privileged: true}", "securityContext: {seccompProfile: {type: x}}"),
     "securityContext fields this harness cannot honour"),
    (("kind: DaemonSet", "kind: Deployment"), "exactly one DaemonSet or Pod"),
    (("- {name: sys, mountPath: /sys, readOnly: true}", "- {name: sys, mountPath: /sys, subPaths: x}"),
     "fields this harness cannot honour: \\['subPaths'\\]"),
])
def test_what_the_node_cannot_honour_is_refused_naming_the_field(tmp_path, change, error):
    with pytest.raises(ManifestError, match=error):
        read_manifest(_manifest(tmp_path, DAEMONSET.replace(*change)))


def test_the_runtime_configuration_binds_the_node_paths_and_privilege(tmp_path):
    from types import SimpleNamespace

    spec = read_manifest(_manifest(tmp_path))
    image = SimpleNamespace(config={"Entrypoint": ["/usr/bin/pciwatch"], "Env": ["PATH=/usr/bin", "A=1"]})
    plugin = SimpleNamespace(image=image, manifest=spec, argv=tuple(container_argv(image.config, spec)))
    config = runtime_config(plugin, {"/var/lib/kubelet/device-plugins": "/tmp/stand-in/device-plugins"})
    binds = {m["destination"]: m for m in config["mounts"] if m["type"] == "bind"}
    assert binds["/var/lib/kubelet/device-plugins"]["source"] == "/tmp/stand-in/device-plugins"
    assert binds["/sys"]["options"] == ["rbind", "rprivate", "ro"]
    assert binds["/dev/vfio"] == {"destination": "/dev/vfio", "type": "bind", "source": "/dev/vfio",
                                  "options": ["rbind", "rslave", "rw"]}  # the subPath, HostToContainer
    assert binds["/host/dev"]["options"] == ["rbind", "rshared", "rw"]  # Bidirectional
    assert config["linux"]["rootfsPropagation"] == "rshared"
    assert "CAP_SYS_ADMIN" in config["process"]["capabilities"]["bounding"]  # privileged
    assert "PCIWATCH_LOG=info" in config["process"]["env"] and "A=1" in config["process"]["env"]
    assert config["root"] == {"path": "rootfs", "readonly": True}
