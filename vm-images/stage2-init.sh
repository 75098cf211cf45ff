#!/bin/sh
# Stage 2 (in the image): mount the project checkout shared over 9p and run
# its guest init from there, so changing the guest's start-up never needs an
# image rebuild.
mount -t tmpfs -o mode=0755 tmpfs /run
mount -t tmpfs tmpfs /tmp
for m in netfs fscache 9pnet 9pnet_virtio 9p; do modprobe "$m" 2>/dev/null; done
mkdir -p /opt/hilconform/src /opt/hilconform/run
if mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000,ro hilconform_src /opt/hilconform/src \
   && [ -x /opt/hilconform/src/vm-images/guest-init.sh ]; then
    exec /opt/hilconform/src/vm-images/guest-init.sh
fi
echo "hilconform-init: project share hilconform_src missing; powering off"
sleep 1
echo o > /proc/sysrq-trigger
