"""Build the QEMU command line for an emulated host from its profile.

q35, `-nodefaults`, TCG unless KVM is asked for. The project's own devices
(root disk, the two 9p shares, virtio-serial for the agent and the runtime)
sit on the root complex; every accelerator slot is a `pcie-root-port` with the
profile's chassis/slot numbers and link caps, and the stand-in device below it.
A slot behind one of the profile's switches is an `xio3130-downstream` port on
the switch's bus instead: pcie.0 -> `pcie-root-port` `rp-sw-<switch>` ->
`x3130-upstream` `up-<switch>` -> `xio3130-downstream` `rp-<slot>` -> the device.
"""

from __future__ import annotations

import json
from pathlib import Path

from .errors import InfrastructureError
from .image import CHECKOUT, GuestImage
from .layout import InstanceLayout
from .profile import MAX_SLOTS, MAX_SWITCH_SLOTS, DeviceKind, HostProfile, Slot, Switch
from .vfio_user.model import load_model, window_reserve

ACCELERATORS = ("tcg", "kvm")
KERNEL_ARGS = "console=ttyS0 root=/dev/vda rw loglevel=5 panic=-1"
FIRST_PORT_ADDR = 0x10
PORT_DEVICES = 0x1F - FIRST_PORT_ADDR  # device numbers 0x10 ... 0x1e; 0x1f is the ICH9 LPC bridge
assert PORT_DEVICES * 8 == MAX_SLOTS
RUNTIME_PORT_NAME = "org.hilconform.runtime.0"
AGENT_PORT_NAME = "org.qemu.guest_agent.0"
# Opt-in NIC for SSH into the guest (the guest as a stand-in "real host"): user-mode
# networking, no way out (restrict=on), the guest's port 22 forwarded to a loopback port.
SSH_NIC_ADDR = "0x6"


def _device(**props) -> list[str]:
    return ["-device", json.dumps(props, separators=(",", ":"))]


def port_address(index: int, ports: int) -> tuple[str, bool]:
    """(addr, multifunction) of the `index`-th of `ports` root ports on pcie.0.

    Up to PORT_DEVICES ports each get a device number of its own (0x10 ...); a host with more
    packs eight per device number as functions (0x10.0 ... 0x10.7, 0x11.0 ...), since device 0x1f
    is the ICH9 LPC bridge. Function 0 of a packed device is marked multifunction.
    """
    if ports > MAX_SLOTS:
        raise ValueError(f"{ports} root ports: at most {MAX_SLOTS} fit on pcie.0")
    if ports <= PORT_DEVICES:
        return f"0x{FIRST_PORT_ADDR + index:x}", False
    device, function = divmod(index, 8)
    return f"0x{FIRST_PORT_ADDR + device:x}.{function}", function == 0


def port_args(slot: Slot | Switch, index: int, ports: int, reserve: dict | None = None) -> list[str]:
    """The `pcie-root-port` on pcie.0 above a slot, or above a switch's upstream port."""
    addr, multifunction = port_address(index, ports)
    return _device(
        driver="pcie-root-port",
        id=slot.port_id,
        bus="pcie.0",
        addr=addr,
        **({"multifunction": True} if multifunction else {}),
        chassis=slot.chassis,
        slot=slot.slot,
        **{"x-speed": slot.link_speed, "x-width": slot.link_width},
        **(reserve or {}),
    )


def switch_args(switch: Switch, index: int, ports: int) -> list[str]:
    """A switch's root port (the `index`-th of `ports` on pcie.0) and its upstream port below it."""
    return [*port_args(switch, index, ports),
            *_device(driver="x3130-upstream", id=switch.upstream_id, bus=switch.port_id, addr="0x0")]


def downstream_port_args(switch: Switch, slot: Slot, index: int) -> list[str]:
    """The slot's `xio3130-downstream` port, the `index`-th on the switch's bus (addr 0x0, 0x1, ...).

    It takes chassis/slot but no link properties (no x-speed/x-width in QEMU 7.2 or 11.1: its
    LnkCap is QEMU's fixed one) and no window reserves."""
    if not 0 <= index < MAX_SWITCH_SLOTS:
        raise ValueError(f"downstream port {index} of switch {switch.name}: at most {MAX_SWITCH_SLOTS}")
    return _device(driver="xio3130-downstream", id=slot.port_id, bus=switch.upstream_id,
                   addr=f"0x{index:x}", chassis=slot.chassis, slot=slot.slot)


def model_port_reserve(profile: HostProfile, slot: Slot) -> dict:
    """Window reserves for a slot that holds or accepts a device model (its BARs must fit)."""
    for name in (slot.device, slot.accepts):
        kind = profile.kinds.get(name)
        if kind is not None and kind.model:
            return window_reserve(load_model(kind.model))
    return {}


def queue_node(slot_name: str) -> str:
    """The block node a queue device is attached to (the top of its chain: the throttle)."""
    return f"q-{slot_name}"


def queue_format_node(slot_name: str) -> str:
    """The raw format node in a queue chain; fault injection re-points its `file` child."""
    return f"q-{slot_name}-raw"


def queue_nbd_node(slot_name: str) -> str:
    """The NBD client node at the bottom of a queue chain (talks to the slot's qemu-nbd)."""
    return f"q-{slot_name}-nbd"


def throttle_group(slot_name: str) -> str:
    """The QOM id of the slot's throttle group (unlimited until a fault sets limits)."""
    return f"tg-{slot_name}"


def throttle_group_object(slot_name: str) -> dict:
    """`-object` / `object-add` arguments of the slot's throttle group (no limits)."""
    return {"qom-type": "throttle-group", "id": throttle_group(slot_name)}


def nbd_blockdev(layout: InstanceLayout, slot_name: str) -> dict:
    """The node chain behind a queue device, as one QMP blockdev-add argument.

    device -> throttle `q-<slot>` (group `tg-<slot>`) -> raw `q-<slot>-raw` ->
    nbd `q-<slot>-nbd` -> the slot's qemu-nbd. The throttle lets a fault slow the
    queue (qom-set the group's limits); the raw node lets a fault swap a blkdebug
    node in under it (blockdev-reopen) to fail requests. Needs the slot's
    throttle group to exist (the command line creates one per slot).
    """
    return {
        "driver": "throttle",
        "node-name": queue_node(slot_name),
        "throttle-group": throttle_group(slot_name),
        "file": {
            "driver": "raw",
            "node-name": queue_format_node(slot_name),
            "file": {
                "driver": "nbd",
                "node-name": queue_nbd_node(slot_name),
                "server": {"type": "unix", "path": str(layout.nbd_socket(slot_name))},
                "export": slot_name,
            },
        },
    }


def model_socket(layout: InstanceLayout, slot_name: str) -> Path:
    """The unix socket a slot's device model (vfio-user server) listens on."""
    return layout.folder / f"vu-{slot_name}.sock"


def stand_in_device(slot: Slot, kind: DeviceKind, device_id: str,
                    layout: InstanceLayout | None = None) -> dict:
    """`device_add` / `-device` properties for the stand-in device in a slot."""
    props: dict = {"driver": kind.qemu_driver, "id": device_id, "bus": slot.port_id, "addr": "0"}
    if kind.model:
        if layout is None:
            raise InfrastructureError(f"slot {slot.name}: a device model ({kind.name}) needs the "
                                      "VM's instance folder for its vfio-user socket")
        props["socket"] = {"type": "unix", "path": str(model_socket(layout, slot.name))}
    if kind.queue == "nbd":
        props["drive"] = queue_node(slot.name)
        props["serial"] = f"HILC-{slot.name.upper()}"
    return props


def build_argv(
    qemu: str,
    profile: HostProfile,
    image: GuestImage,
    layout: InstanceLayout,
    accel: str = "tcg",
    ssh_forward_port: int | None = None,
) -> list[str]:
    if accel not in ACCELERATORS:
        raise InfrastructureError(f"unknown accelerator {accel!r} (use one of {ACCELERATORS})")
    argv = [
        qemu,
        "-name", f"hilconform-{profile.name}",
        "-machine", "q35",
        "-accel", accel,
        "-cpu", "qemu64" if accel == "tcg" else "host",
        "-m", str(profile.memory_mib),
        "-smp", str(profile.cpus),
        "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot", "-S",
        "-qmp", f"unix:{layout.qmp_socket},server=on,wait=off",
        "-chardev", f"file,id=console,path={layout.console_log}",
        "-serial", "chardev:console",
        "-kernel", str(image.kernel),
        "-initrd", str(image.initramfs),
        "-append", KERNEL_ARGS,
        # Root disk: writes go to a throw-away overlay, so parallel VMs share one image.
        "-drive", f"if=none,id=root,format=raw,file={image.rootfs},snapshot=on",
    ]
    argv += _device(driver="virtio-blk-pci", drive="root", bus="pcie.0", addr="0x2")
    argv += _share_args("src", "hilconform_src", CHECKOUT, "0x3")
    argv += _share_args("run", "hilconform_run", layout.guest_share, "0x4")
    argv += _device(driver="virtio-serial-pci", id="vser", bus="pcie.0", addr="0x5")
    for chardev, sock, name in (
        ("qga", layout.agent_socket, AGENT_PORT_NAME),
        ("rt", layout.runtime_socket, RUNTIME_PORT_NAME),
    ):
        argv += ["-chardev", f"socket,id={chardev},path={sock},server=on,wait=off"]
        argv += _device(driver="virtserialport", bus="vser.0", chardev=chardev, name=name)
    if ssh_forward_port is not None:
        argv += ssh_nic_args(ssh_forward_port)
    if profile.hotplug_mode == "native":
        argv += ["-global", "ICH9-LPC.acpi-pci-hotplug-with-bridge-support=off"]
    # Root ports on pcie.0: the slots not behind a switch (profile order), then one per switch.
    ports = profile.root_ports
    for index, slot in enumerate(profile.root_port_slots):
        argv += _slot_args(profile, slot, layout,
                           port_args(slot, index, ports, model_port_reserve(profile, slot)))
    for index, switch in enumerate(profile.switches, start=len(profile.root_port_slots)):
        argv += switch_args(switch, index, ports)
        for position, slot in enumerate(profile.slots_below(switch.name)):
            argv += _slot_args(profile, slot, layout, downstream_port_args(switch, slot, position))
    return argv


def _slot_args(profile: HostProfile, slot: Slot, layout: InstanceLayout, port: list[str]) -> list[str]:
    """A slot's throttle group, its port, and the stand-in device below it (when populated)."""
    # One throttle group per slot, so any queue device (cold- or hot-plugged) can be slowed.
    argv = ["-object", json.dumps(throttle_group_object(slot.name), separators=(",", ":")), *port]
    if slot.populated:
        kind = profile.kind(slot.device)
        if kind.queue == "nbd":
            argv += ["-blockdev", json.dumps(nbd_blockdev(layout, slot.name), separators=(",", ":"))]
        argv += _device(**stand_in_device(slot, kind, slot.name, layout))
    return argv


def ssh_nic_args(port: int) -> list[str]:
    """A virtio-net NIC whose guest port 22 is 127.0.0.1:`port` on the host (only when asked)."""
    netdev = f"user,id=ssh0,restrict=on,net=10.0.2.0/24,hostfwd=tcp:127.0.0.1:{port}-:22"
    return ["-netdev", netdev,
            *_device(driver="virtio-net-pci", id="sshnic", netdev="ssh0", bus="pcie.0", addr=SSH_NIC_ADDR)]


def _share_args(fsdev: str, tag: str, path: Path, addr: str) -> list[str]:
    return [
        "-fsdev", f"local,id={fsdev},path={path},security_model=none,readonly=on",
        *_device(driver="virtio-9p-pci", fsdev=fsdev, mount_tag=tag, bus="pcie.0", addr=addr),
    ]
