"""A manifest's hostPath volumes given as the kubelet gives them (issue 45, "Any manifest,
unchanged"): any path of the node, translated where the stand-in owns it, its `type` checked on the
node's real file system by the script `ImagePlugin.start` runs there (fixtures/image_plugin.py
`host_path_script`, run here with /bin/sh against this machine's files), the mounts ordered and
given their propagation and capabilities as containerd does, and a container run for real by
this machine's crun with such mounts."""

from __future__ import annotations

import json
import socket
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_oci_image import executable_image

from hilconform.fixtures.image_plugin import (
    HOST_PATH_UNAVAILABLE_EXIT,
    capabilities,
    host_path_script,
    plugin_image,
    runtime_config,
    write_bundle,
)
from hilconform.fixtures.pod_manifest import (
    ManifestError,
    harness_folder,
    node_source,
    node_translations,
    read_manifest,
)
from hilconform.fixtures.real_kubelet_site import FIND_OCI_RUNTIME

POD = """\
apiVersion: v1
kind: Pod
metadata: {{name: p}}
spec:
  containers:
  - name: plugin
    image: example.com/p:1
    args: {args}
    securityContext: {security}
    volumeMounts: [{mounts}]
  volumes: [{volumes}]
"""


def _pod(tmp_path: Path, volumes: list[tuple[str, str, str]], mounts: list[str],
         security: str = "{privileged: true}", args: tuple[str, ...] = ()) -> Path:
    """volumes: (name, path, type); mounts: the volumeMounts' flow mappings."""
    path = tmp_path / "pod.yaml"
    path.write_text(POD.format(
        security=security, mounts=", ".join(mounts), args=json.dumps(list(args)),
        volumes=", ".join(f"{{name: {n}, hostPath: {{path: '{p}', type: '{t}'}}}}"
                          for n, p, t in volumes)))
    return path


def _check(spec) -> tuple[int, str, dict[str, str]]:
    done = subprocess.run(["sh", "-c", host_path_script(spec, {})], capture_output=True, text=True,
                          timeout=30)
    kinds = {}
    if done.returncode == 0:
        kinds = {spec.mounts[int(i)].container_path: k for i, k in
                 (line.split() for line in done.stdout.splitlines())}
    return done.returncode, done.stdout.strip(), kinds


def test_each_type_is_checked_on_the_nodes_file_system_as_the_kubelet_checks_it(tmp_path):
    made, there = tmp_path / "made" / "deep", tmp_path / "there"
    there.mkdir()
    (there / "file").write_text("x")
    with socket.socket(socket.AF_UNIX) as listening:
        listening.bind(str(there / "sock"))
        spec = read_manifest(_pod(tmp_path, [
            ("a", str(made), "DirectoryOrCreate"), ("b", str(there / "new-file"), "FileOrCreate"),
            ("c", str(there / "file"), "File"), ("d", str(there / "sock"), "Socket"),
            ("e", "/dev/null", "CharDevice"), ("f", str(tmp_path / "untyped"), ""),
            ("g", str(there), "Directory"),
        ], ["{name: a, mountPath: /a}", "{name: b, mountPath: /b}", "{name: c, mountPath: /etc/c}",
            "{name: d, mountPath: /d.sock}", "{name: e, mountPath: /dev/e}", "{name: f, mountPath: /f}",
            "{name: g, mountPath: /g, subPath: sub/dir}"]))
        code, said, kinds = _check(spec)
    assert code == 0, said
    assert kinds == {"/a": "dir", "/b": "file", "/etc/c": "file", "/d.sock": "file", "/dev/e": "file",
                     "/f": "dir", "/g": "dir"}
    assert made.is_dir() and (made.stat().st_mode & 0o777) == 0o755  # DirectoryOrCreate, its parents too
    assert (there / "new-file").is_file() and (there / "new-file").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "untyped").is_dir()  # no type: made a directory, as containerd does
    assert (there / "sub" / "dir").is_dir()  # a missing subPath is made, as the kubelet does


@pytest.mark.parametrize("volume, mount, said", [
    (("/dev/hilc-no-such-gpu0", "CharDevice"), "",
     "volume v: host path /dev/hilc-no-such-gpu0: type CharDevice: no such character device on the node"),
    (("/dev/null", "BlockDevice"), "",
     "host path /dev/null: type BlockDevice: it is there but no block device"),
    (("{tmp}/missing", "Directory"), "", "type Directory: no such directory on the node"),
    (("{tmp}/file", "Directory"), "", "type Directory: it is there but no directory"),
    (("{tmp}/file", "DirectoryOrCreate"), "", "type DirectoryOrCreate: it is there but no directory"),
    (("{tmp}/no-parent/f", "FileOrCreate"), "", "missing, and so is its parent directory"),
    (("{tmp}", "File"), "", "type File: it is there but no regular file"),
    (("{tmp}/file", "Socket"), "", "type Socket: it is there but no UNIX socket"),
    (("{tmp}", "Directory"), ", subPath: out", "subPath out leads outside the volume"),
    (("{tmp}/file", ""), ", subPath: x", "subPath x: the volume is no directory"),
])
def test_a_path_the_node_cannot_give_is_named_with_its_volume_and_why(tmp_path, volume, mount, said):
    (tmp_path / "file").write_text("x")
    (tmp_path / "out").symlink_to("/etc")  # a subPath whose link leaves the volume
    path, kind = volume
    spec = read_manifest(_pod(tmp_path, [("v", path.format(tmp=tmp_path), kind)],
                              [f"{{name: v, mountPath: /m{mount}}}"]))
    code, out, _ = _check(spec)
    assert code == HOST_PATH_UNAVAILABLE_EXIT and said in out, out
    assert out.startswith("volume v: host path "), out


def test_the_harness_folders_and_only_they_are_never_given():
    assert harness_folder("/run/hilconform")[0] == "/run/hilconform"
    assert harness_folder("/run/hilconform/crun/state.json")[0] == "/run/hilconform"
    assert harness_folder("/tmp/hilconform-kubelet.x1Y2z3/device-plugins")[0] == "/tmp/hilconform-kubelet.*"
    for given in ("/run", "/run/hilconformx", "/dev/vfio", "/var/run/cdi", "/tmp/hilconform-kubelet", "/"):
        assert harness_folder(given) is None, given


def test_the_kubelet_paths_and_those_under_them_are_translated_on_a_real_host():
    places = node_translations({"plugin_dir": "/tmp/hk.1/device-plugins", "folder": "/tmp/hk.1"})
    assert node_source("/var/lib/kubelet/device-plugins", places) == "/tmp/hk.1/device-plugins"
    socket_path = "/var/lib/kubelet/device-plugins/kubelet.sock"
    assert node_source(socket_path, places) == "/tmp/hk.1/device-plugins/kubelet.sock"
    assert node_source("/var/lib/kubelet/pod-resources", places) == "/tmp/hk.1/pod-resources"
    assert node_source("/var/lib/kubeletx", places) == "/var/lib/kubeletx"
    assert node_source("/dev/vfio", places) == "/dev/vfio"
    assert node_translations({}) == {}  # an emulated node: the standard paths are the stand-in's


def test_capabilities_mounts_order_and_propagation_follow_containerd(tmp_path):
    spec = read_manifest(_pod(tmp_path, [("dp", "/var/lib/kubelet/device-plugins", ""), ("dev", "/dev", ""),
                                         ("vfio", "/dev/vfio", "CharDevice")],
                              ["{name: vfio, mountPath: /dev/vfio, readOnly: true}",
                               "{name: dev, mountPath: /dev, mountPropagation: HostToContainer}",
                               "{name: dp, mountPath: /var/lib/kubelet/device-plugins}"],
                              security="{allowPrivilegeEscalation: false, "
                                       "capabilities: {drop: [ALL], add: [SYS_RAWIO]}}"))
    assert capabilities(spec) == ["CAP_SYS_RAWIO"]
    plugin = SimpleNamespace(image=SimpleNamespace(config={}), manifest=spec, argv=("/p",))
    config = runtime_config(plugin, {})
    binds = [m["destination"] for m in config["mounts"] if m["type"] == "bind"]
    assert binds == ["/dev", "/dev/vfio", "/var/lib/kubelet/device-plugins"]  # parents first, else as written
    assert config["linux"]["rootfsPropagation"] == "rslave"
    assert config["process"]["capabilities"]["effective"] == ["CAP_SYS_RAWIO"]
    dropped = read_manifest(_pod(tmp_path, [("dp", "/var/lib/kubelet/device-plugins", "")],
                                 ["{name: dp, mountPath: /x}"],
                                 security="{capabilities: {drop: [NET_RAW, kill]}}"))
    left = capabilities(dropped)
    assert {"CAP_NET_RAW", "CAP_KILL"}.isdisjoint(left) and "CAP_CHOWN" in left
    with pytest.raises(ManifestError, match="capabilities fields this harness cannot honour: "
                                            "\\['ambient'\\]"):
        read_manifest(_pod(tmp_path, [], [], security="{capabilities: {ambient: [X]}}"))


def test_the_container_sees_each_host_path_as_its_type_and_mount_say(tmp_path):
    """This machine's crun (or runc) runs a container with a file, a socket, a character device, a
    subPath and a read-only directory bound from here, mount points made from what the check found."""
    found = subprocess.run(["sh", "-c", FIND_OCI_RUNTIME], capture_output=True, text=True, timeout=30)
    assert found.returncode == 0, f"make test installs crun and runc: {found.stdout}"
    runtime = found.stdout.split()[-1]  # crun, or runc where the cgroups are hybrid (crun refuses them)
    node = tmp_path / "node"
    (node / "data" / "sub").mkdir(parents=True)
    (node / "data" / "sub" / "seen").write_text("yes")
    with socket.socket(socket.AF_UNIX) as listening:
        listening.bind(str(node / "plugin.sock"))
        script = ("[ -c /dev/hilc-null ] && [ -S /run/p.sock ] && [ -f /etc/cdi/spec.yaml ] "
                  "&& [ -f /sub/seen ] && ! (: > /ro/w) 2>/dev/null && : > /sub/w && echo CONTAINER-OK")
        manifest = _pod(tmp_path, [
            ("devnull", "/dev/null", "CharDevice"), ("sock", f"{node}/plugin.sock", "Socket"),
            ("cdi", f"{node}/cdi.yaml", "FileOrCreate"), ("data", f"{node}/data", "Directory"),
        ], ["{name: devnull, mountPath: /dev/hilc-null, readOnly: true}",
            "{name: sock, mountPath: /run/p.sock}",
            "{name: cdi, mountPath: /etc/cdi/spec.yaml}", "{name: data, mountPath: /sub, subPath: sub}",
            "{name: data, mountPath: /ro, readOnly: true, mountPropagation: HostToContainer}"],
            security="{capabilities: {drop: [ALL]}}", args=(script,))
        image = executable_image(tmp_path / "sh.tar", "/bin/sh", {"Entrypoint": ["/bin/sh", "-c"]})
        plugin = plugin_image(str(image), str(manifest))
        code, said, kinds = _check(plugin.manifest)
        assert code == 0, said
        bundle = write_bundle(plugin, tmp_path / "share", {}, kinds)
        assert (bundle / "rootfs" / "etc" / "cdi" / "spec.yaml").is_file()  # a file's mount point in the root
        assert json.loads((bundle / "config.json").read_text())["linux"]["rootfsPropagation"] == "rslave"
        state, cid = tmp_path / "state", f"hilc-unit-{time.monotonic_ns()}"
        done = subprocess.run([runtime, "--root", str(state), "run", "--bundle", str(bundle), cid],
                              capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        subprocess.run([runtime, "--root", str(state), "delete", "-f", cid], capture_output=True, timeout=30)
    assert done.stdout.strip() == "CONTAINER-OK", (done.returncode, done.stdout, done.stderr)
    assert (node / "data" / "sub" / "w").exists() and not (node / "data" / "w").exists()
