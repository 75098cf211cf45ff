#!/bin/busybox sh
# Stage 1 (initramfs): load the few modules needed to reach the root disk,
# mount it and hand over to the image's own init. Kept tiny: under TCG every
# instruction counts.
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
while read -r module; do
    insmod "/modules/$module" 2>/dev/null || echo "initramfs: insmod $module failed"
done < /modules/order
i=0
while [ ! -b /dev/vda ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i + 1)); done
if ! mount -t ext4 -o rw /dev/vda /newroot; then
    echo "initramfs: cannot mount the root disk /dev/vda"; sleep 2; poweroff -f
fi
mount --move /proc /newroot/proc
mount --move /sys /newroot/sys
mount --move /dev /newroot/dev
exec switch_root /newroot /sbin/hilconform-init
