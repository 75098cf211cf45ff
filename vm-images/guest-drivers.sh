#!/bin/sh
# Bind the Linux drivers the host's device models name (what the lab's stack would bind),
# as emulators/vfio_user/guest_driver.py wrote them into the run share:
#   module NAME [OPTION...]      modprobe, in order
#   bind VENDOR DEVICE DRIVER    bind every such card now, and each hot-added one (udev rule)
#
#   guest-drivers.sh setup FILE      at boot (guest-init.sh), before the agent and the runtime
#   guest-drivers.sh bind BDF DRIVER one card, by hand
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
log() { echo "hilconform-init: guest-drivers: $*" > /dev/console; }
RULES=/run/udev/rules.d/70-hilconform-guest-drivers.rules

# True while the kernel still has a BAR of the card to place: its `add` uevent comes before the
# hot-plug driver (acpiphp, pciehp) sizes the bridges and assigns the BARs, and an `enable` written
# in that window fails ("BAR 0 ...: not claimed; can't enable device"). A placed BAR has a start;
# one the kernel gave up on reads all zeros.
unplaced_bar() {
    while read -r start end _flags; do
        [ "$start" = 0x0000000000000000 ] && [ "$end" != 0x0000000000000000 ] && return 0
    done < "$1/resource"
    return 1
}

# Wait (at most ~3 s) while the check `$1` holds for the device folder `$2`.
wait_while() {
    tries=150
    while "$1" "$2"; do
        tries=$((tries - 1))
        [ "$tries" -gt 0 ] || return 1
        sleep 0.02
    done
}

unbound() { [ ! -e "$1/driver" ]; }

bind_one() {
    bdf=$1 driver=$2 dev=/sys/bus/pci/devices/$1
    [ -e "$dev" ] || { log "$bdf: no such PCI device"; return 1; }
    if [ -e "$dev/driver" ]; then
        have=$(basename "$(readlink "$dev/driver")")
        [ "$have" = "$driver" ] && return 0
        log "$bdf: held by $have, not binding $driver"
        return 1
    fi
    # Memory decoding on, as the lab's stack has it once it opens the card: nothing enables a
    # hot-added card, and with a driver bound the kernel refuses this write (EBUSY). A hot-added
    # card's BARs are placed only after its add uevent: wait for that first.
    wait_while unplaced_bar "$dev" || log "$bdf: BARs still unplaced after 3 s"
    [ "$(cat "$dev/enable")" != 0 ] || echo 1 > "$dev/enable" || log "$bdf: enable failed"
    echo "$driver" > "$dev/driver_override"
    # The kernel accepts drivers only once it has added the card (after its BARs are placed); it
    # then binds the override itself, or drivers_probe does.
    echo "$bdf" > /sys/bus/pci/drivers_probe 2>/dev/null
    wait_while unbound "$dev"
    if [ "$(basename "$(readlink "$dev/driver" 2>/dev/null)")" = "$driver" ]; then
        log "$bdf bound to $driver"
    else
        log "$bdf: $driver did not bind (dmesg: $(dmesg | grep "$bdf" | tail -n 1))"
        return 1
    fi
}

setup() {
    self=$(readlink -f "$0")  # what the udev rule runs for each hot-added card
    mkdir -p "$(dirname "$RULES")"
    : > "$RULES"
    binds=
    while read -r verb a b c rest; do
        case "$verb" in
            module)
                # shellcheck disable=SC2086  # options are separate words
                modprobe "$a" $b $c $rest || log "modprobe $a failed"
                ;;
            bind)
                # bind_one from udev (the runtime hears of the card only after its rules ran):
                # a program, not ATTR writes, because the add uevent comes before the BARs are
                # placed and decoding can be turned on only between that and the driver binding.
                echo "ACTION==\"add\", SUBSYSTEM==\"pci\", ATTR{vendor}==\"0x$a\", ATTR{device}==\"0x$b\", TEST!=\"driver\", RUN+=\"/bin/sh $self bind \$kernel $c\"" >> "$RULES"
                binds="$binds $a:$b:$c"
                ;;
            ''|'#'*) ;;
            *) log "unknown line: $verb $a $b $c $rest" ;;
        esac
    done < "$1"
    udevadm control --reload || log "udev did not reload its rules"
    for dev in /sys/bus/pci/devices/*; do
        ids="$(sed 's/^0x//' "$dev/vendor"):$(sed 's/^0x//' "$dev/device")"
        for entry in $binds; do
            [ "${entry%:*}" = "$ids" ] && bind_one "${dev##*/}" "${entry##*:}"
        done
    done
    return 0
}

case "$1" in
    setup) setup "$2" ;;
    bind) bind_one "$2" "$3" ;;
    *) log "usage: $0 setup FILE | bind BDF DRIVER"; exit 2 ;;
esac
