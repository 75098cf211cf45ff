#!/bin/bash
# Guest init (PID 1), read from the project share at every boot: start udev,
# the guest agent and, when the host asked for one, the device runtime.
# See docs/guest-contract.md. Never exits: PID 1 exiting panics the kernel.
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
log() { echo "hilconform-init: $*" > /dev/console; }

mount -t devpts devpts /dev/pts 2>/dev/null
mkdir -p /run/udev /run/hilconform /dev/pts
hostname hilconform-guest

# The guest runs from copies, never from the 9p shares: a mounted 9p share blocks QEMU's
# migration, and a ready VM saved by migration is how a fresh host is made without a boot
# (emulators/vm_snapshot.py). First pass: mount the per-VM run share (runtime configuration and
# selection), copy it and the code the guest runs into tmpfs, and start this script again
# from the copy (bash keeps the script it runs open). Second pass: unmount both shares and put
# the copies where they were, so every path stays as it was. The host changes a copied file
# through the guest agent (and in its share, which a reboot copies again).
if [ "$HILCONFORM_GUEST_COPY" != 1 ]; then
    mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000,ro hilconform_run /opt/hilconform/run \
        || log "no hilconform_run share"
    rm -rf /run/hilconform/src /run/hilconform/run
    mkdir -p /run/hilconform/src/vm-images /run/hilconform/run
    # tests/ (the mutant runtimes) is a checkout's only: an installed hilconform shares without it
    code=$(cd /opt/hilconform/src && ls -d runtime tests emulators 2>/dev/null)
    tar -C /opt/hilconform/src --exclude=__pycache__ --exclude=tests/unit -cf - $code \
        | tar -C /run/hilconform/src -xf - || log "could not copy the code"
    cp -a /opt/hilconform/src/vm-images/*.sh /run/hilconform/src/vm-images/
    # A plugin under test is run from the share itself (it may be larger than this tmpfs).
    tar -C /opt/hilconform/run --exclude=./device-plugin -cf - . | tar -C /run/hilconform/run -xf - \
        || log "could not copy the run share"
    export HILCONFORM_GUEST_COPY=1
    exec /run/hilconform/src/vm-images/guest-init.sh
fi
unset HILCONFORM_GUEST_COPY
umount /opt/hilconform/run || log "run share still mounted"
umount /opt/hilconform/src || log "code share still mounted"
mount --bind /run/hilconform/run /opt/hilconform/run
mount --bind /run/hilconform/src /opt/hilconform/src

# Drivers for the chipset's own SATA/SMBus/watchdog and for nested virtualisation
# cost seconds under TCG and serve nothing here: keep udev from loading them. nouveau
# probes an NVIDIA device model and fails noisily; a lab host running nvidia.ko
# blacklists it too.
mkdir -p /run/modprobe.d
for m in ahci libahci libata i2c_i801 lpc_ich iTCO_wdt iTCO_vendor_support kvm kvm_amd \
         kvm_intel powernow_k8 pcspkr serio_raw psmouse evdev joydev floppy sg sr_mod \
         i2c_smbus edac_mce_amd ccp k10temp nouveau; do
    echo "blacklist $m"
done > /run/modprobe.d/hilconform.conf

/lib/systemd/systemd-udevd --daemon --resolve-names=never
# Only the subsystems the runtime and the agent need: the rest is chipset noise.
udevadm trigger --type=devices --action=add --subsystem-match=pci --subsystem-match=virtio \
    --subsystem-match=virtio-ports --subsystem-match=block --subsystem-match=nvme \
    --subsystem-match=pci_bus --subsystem-match=pcie_port
udevadm settle --timeout=30 || log "udev did not settle in 30 s"

# The drivers the host's device models name (what the lab's stack binds), before the agent
# and the runtime start, so both see the cards bound; hot-added cards get a udev rule.
guest_drivers=/opt/hilconform/run/guest-drivers
[ -f "$guest_drivers" ] && /bin/sh /opt/hilconform/src/vm-images/guest-drivers.sh setup "$guest_drivers"

qga_port=/dev/virtio-ports/org.qemu.guest_agent.0
for _ in $(seq 100); do [ -e "$qga_port" ] && break; sleep 0.1; done
qemu-ga -m virtio-serial -p "$qga_port" -t /run/hilconform &
log "guest agent started"

# Import name hilconform.runtime without installing anything in the guest.
py=/run/hilconform/py/hilconform
mkdir -p "$py"
: > "$py/__init__.py"
ln -s /opt/hilconform/src/runtime "$py/runtime"
ln -s /opt/hilconform/src/tests "$py/tests"
ln -s /opt/hilconform/src/emulators "$py/emulators"  # the kubelet stand-in runs on the node
# The kubelet's plugin directory, private to this guest (device plugins and the stand-in).
mkdir -p /var/lib/kubelet && mount -t tmpfs -o mode=0750 tmpfs /var/lib/kubelet
# Bytecode goes to a tmpfs cache (the checkout is a read-only share): a deployed runtime has its
# .pyc files, and compiling every module on each start under TCG cost ~2 s of DISC-03.
export PYTHONPATH=/run/hilconform/py PYTHONPYCACHEPREFIX=/run/hilconform/pycache

# Opt-in sshd (the guest as a stand-in real host, docs/real-hosts.md): only when the host
# put an authorized_keys into the run share; the NIC is then the virtio-net at 00:06.0.
if [ -f /opt/hilconform/run/ssh/authorized_keys ]; then
    nic=
    for _ in $(seq 100); do
        for dev in /sys/class/net/*; do
            [ "$(readlink -f "$dev/device" 2>/dev/null | grep -c 0000:00:06.0)" = 1 ] && nic=${dev##*/}
        done
        [ -n "$nic" ] && break
        sleep 0.1
    done
    if [ -n "$nic" ]; then
        busybox ip link set dev "$nic" up
        busybox ip addr add 10.0.2.15/24 dev "$nic"
        mkdir -p /root/.ssh /run/sshd && chmod 700 /root/.ssh
        cp /opt/hilconform/run/ssh/authorized_keys /root/.ssh/authorized_keys
        chmod 600 /root/.ssh/authorized_keys
        [ -f /etc/ssh/ssh_host_ed25519_key ] || ssh-keygen -q -t ed25519 -N '' -f /etc/ssh/ssh_host_ed25519_key
        /usr/sbin/sshd -o UsePAM=no -o UseDNS=no -o PermitRootLogin=prohibit-password \
            -o PasswordAuthentication=no -o HostKey=/etc/ssh/ssh_host_ed25519_key \
            -E /run/hilconform/sshd.log && log "sshd started on $nic"
    else
        log "no NIC at 0000:00:06.0 for sshd"
    fi
fi

# The root file system is read from the image (QEMU's snapshot=on drops every write at exit):
# read-only from here on, a saved VM and the image it is restored over agree. Not with sshd
# (a stand-in real host is never saved).
[ -f /opt/hilconform/run/ssh/authorized_keys ] || mount -o remount,ro / || log "root stays read-write"

# What the host asked to run on the node before the runtime (emulators/vm.py node_services: the
# kubelet stand-in of a host started for the device-plugin suites, as a node's kubelet is up
# before its device plugins).
[ -f /opt/hilconform/run/node-services.sh ] && /bin/sh /opt/hilconform/run/node-services.sh

config=/opt/hilconform/run/runtime.toml
if [ -f "$config" ]; then
    module=hilconform.runtime
    [ -f /opt/hilconform/run/runtime.module ] && module=$(head -n1 /opt/hilconform/run/runtime.module)
    python3 -m "$module" --config "$config" > /run/hilconform/runtime.log 2>&1 &
    echo $! > /run/hilconform/runtime.pid
    log "runtime $module started (pid $!)"
fi
log "ready"

while true; do
    wait
    sleep 3600 &
    wait $!
done
