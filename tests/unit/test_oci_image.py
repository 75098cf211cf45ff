"""Container images read strictly and unpacked safely (fixtures/oci_image.py).

The archives here are written by hand from the OCI image-spec and Docker's save format, so each
field can be got wrong on purpose. The project's integration tests take real ones written by
umoci and skopeo (tests/plugins/pciwatch/build.py)."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import subprocess
import tarfile
from pathlib import Path

import pytest

from hilconform.fixtures.oci_image import OCI_CONFIG, OCI_MANIFEST, ImageError, read_image, unpack

LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"


def _tar(entries: list[tuple]) -> bytes:
    """(name, bytes | None for a folder | ('symlink', target) | ('hardlink', target)) entries."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, data in entries:
            info = tarfile.TarInfo(name)
            if data is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            elif isinstance(data, tuple):
                info.type = tarfile.SYMTYPE if data[0] == "symlink" else tarfile.LNKTYPE
                info.linkname = data[1]
                tar.addfile(info)
            else:
                info.size, info.mode = len(data), 0o755
                tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def oci_archive(path: Path, layers: list[bytes], *, config: dict | None = None, corrupt: bool = False,
                manifests: int = 1, arch: str = "amd64") -> Path:
    blobs: dict[str, bytes] = {}
    layer_descriptors = []
    for layer in layers:
        packed = gzip.compress(layer)
        blobs[_digest(packed)] = packed
        layer_descriptors.append({"mediaType": LAYER, "digest": _digest(packed), "size": len(packed)})
    image_config = config or {"Entrypoint": ["/usr/bin/plugin"], "Env": ["A=1"]}
    config_bytes = json.dumps({"architecture": arch, "os": "linux", "config": image_config,
                               "rootfs": {"type": "layers", "diff_ids": []}}).encode()
    blobs[_digest(config_bytes)] = config_bytes
    manifest = json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": {
        "mediaType": OCI_CONFIG, "digest": _digest(config_bytes), "size": len(config_bytes)},
        "layers": layer_descriptors}).encode()
    blobs[_digest(manifest)] = manifest
    index = {"schemaVersion": 2, "manifests": [{"mediaType": OCI_MANIFEST, "digest": _digest(manifest),
                                                "size": len(manifest), "annotations": {
                                                    "org.opencontainers.image.ref.name": "1.0"}}] * manifests}
    entries = [("oci-layout", b'{"imageLayoutVersion": "1.0.0"}'), ("index.json", json.dumps(index).encode())]
    for digest, data in blobs.items():
        if corrupt and data is blobs[layer_descriptors[0]["digest"]]:
            data = data[:-1] + bytes([data[-1] ^ 1])
        entries.append((f"blobs/sha256/{digest.split(':')[1]}", data))
    path.write_bytes(_tar(entries))
    return path


def executable_image(path: Path, executable: str, config: dict) -> Path:
    """An OCI archive whose one layer holds this machine's `executable` and the libraries `ldd`
    names for it."""
    files = [executable]
    loaded = subprocess.run(["ldd", executable], capture_output=True, text=True, check=True).stdout
    for line in loaded.splitlines():
        files += [word for word in line.split() if word.startswith("/")]
    entries, folders = [], set()
    for name in files:
        parts = Path(name).parts[1:]
        for i in range(1, len(parts)):
            folders.add("/".join(parts[:i]))
        entries.append(("/".join(parts), Path(name).resolve().read_bytes()))
    layer = _tar([(folder, None) for folder in sorted(folders)] + entries)
    return oci_archive(path, [layer], config=config)


def docker_archive(path: Path, layers: list[bytes]) -> Path:
    diff_ids = [_digest(layer) for layer in layers]
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {"Cmd": ["/plugin"]},
                         "rootfs": {"type": "layers", "diff_ids": diff_ids}}).encode()
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    entries = [(config_name, config)]
    names = []
    for i, layer in enumerate(layers):
        names.append(f"layer{i}/layer.tar")
        entries.append((names[-1], layer))
    entries.append(("manifest.json", json.dumps([{"Config": config_name, "RepoTags": ["example.com/p:1"],
                                                  "Layers": names}]).encode()))
    path.write_bytes(_tar(entries))
    return path


def test_an_oci_archive_is_named_by_its_manifest_digest_and_unpacked_with_whiteouts(tmp_path):
    base = _tar([("usr", None), ("usr/bin", None), ("usr/bin/plugin", b"v1"), ("etc", None),
                 ("etc/old", b"x"), ("etc/keep", b"k"), ("opt", None), ("opt/a", b"a")])
    top = _tar([("usr/bin/plugin", b"v2"), ("etc/.wh.old", b""), ("opt/.wh..wh..opq", b""), ("opt/b", b"b"),
                ("usr/bin/link", ("symlink", "plugin")), ("usr/bin/hard", ("hardlink", "usr/bin/plugin"))])
    image = read_image(oci_archive(tmp_path / "img.tar", [base, top]))
    assert image.form == "oci-archive" and image.ref == "1.0" and image.digest.startswith("sha256:")
    assert image.config["Entrypoint"] == ["/usr/bin/plugin"]
    root = unpack(image, tmp_path / "rootfs")
    assert (root / "usr/bin/plugin").read_bytes() == b"v2" and (root / "usr/bin/hard").read_bytes() == b"v2"
    assert not (root / "etc/old").exists() and (root / "etc/keep").exists()
    assert sorted(p.name for p in (root / "opt").iterdir()) == ["b"]
    assert (root / "usr/bin/link").is_symlink()


def test_a_docker_save_tarball_is_named_by_its_image_id(tmp_path):
    layer = _tar([("plugin", b"#!/bin/sh\n")])
    image = read_image(docker_archive(tmp_path / "d.tar", [layer]))
    assert image.form == "docker-archive" and image.ref == "example.com/p:1"
    assert (unpack(image, tmp_path / "root") / "plugin").read_bytes() == b"#!/bin/sh\n"


@pytest.mark.parametrize("case, error", [
    ("corrupt", "a damaged or altered image"),
    ("two", "names 2 images"),
    ("arm", "linux/arm64; the node is linux/amd64"),
    ("not-tar", "not a tar archive"),
    ("missing", "no such file"),
])
def test_a_bad_image_is_refused_naming_what_is_wrong(tmp_path, case, error):
    layer = _tar([("plugin", b"x")])
    path = {
        "corrupt": lambda: oci_archive(tmp_path / "i.tar", [layer], corrupt=True),
        "two": lambda: oci_archive(tmp_path / "i.tar", [layer], manifests=2),
        "arm": lambda: oci_archive(tmp_path / "i.tar", [layer], arch="arm64"),
        "not-tar": lambda: (tmp_path / "i.tar").write_bytes(b"\x7fELF not an image") and tmp_path / "i.tar",
        "missing": lambda: tmp_path / "none.tar",
    }[case]()
    with pytest.raises(ImageError, match=error):
        read_image(path)


@pytest.mark.parametrize("entries, error", [
    ([("../escape", b"x")], "points outside"),
    ([("/abs", b"x")], "points outside"),
    ([("d", ("symlink", "/tmp")), ("d/file", b"x")], "outside the root file system"),
])
def test_a_layer_never_writes_outside_the_root_file_system(tmp_path, entries, error):
    image = read_image(oci_archive(tmp_path / "i.tar", [_tar(entries)]))
    with pytest.raises(ImageError, match=error):
        unpack(image, tmp_path / "root")
