"""The kernel's AER recovery window is found at a root port and at a switch's downstream port."""

from __future__ import annotations

from types import SimpleNamespace

from hilconform.fixtures.guest_kernel_log import kernel_recovery_window

# As the guest kernel (Debian 6.1) logged them in QEMU 7.2: a fatal error injected at a root port,
# then one at a switch's downstream port (the root port above the switch prints the error line).
DMESG = """\
[   20.100000] pcieport 0000:00:10.0: AER: Uncorrected (Fatal) error message received from 0000:00:10.0
[   20.104000] nvme nvme0: frozen state error detected, reset controller
[   20.260000] pcieport 0000:00:10.0: AER: Root Port link has been reset (0)
[   20.300000] pcieport 0000:00:10.0: AER: device recovery successful
[   29.670717] pcieport 0000:00:12.0: AER: Uncorrected (Fatal) error message received from 0000:04:00.0
[   29.674370] nvme nvme2: frozen state error detected, reset controller
[   30.845628] pcieport 0000:04:00.0: AER: Downstream Port link has been reset (0)
[   30.845970] nvme nvme2: restart after slot reset
[   30.870343] pcieport 0000:04:00.0: AER: device recovery successful
"""


def _host(text: str):
    result = SimpleNamespace(stdout=text, check=lambda: result)
    return SimpleNamespace(run=lambda argv, timeout_s=30: result)


def test_recovery_window_at_a_root_port():
    assert kernel_recovery_window(_host(DMESG), "0000:00:10.0") == (
        20_100_000_000, 20_300_000_000, "successful")


def test_recovery_window_at_a_downstream_port_starts_at_the_root_ports_line_naming_it():
    assert kernel_recovery_window(_host(DMESG), "0000:04:00.0") == (
        29_670_717_000, 30_870_343_000, "successful")


def test_the_switchs_root_port_has_no_window_of_its_own():
    # it printed the error line, but the recovery ran at the downstream port
    assert kernel_recovery_window(_host(DMESG), "0000:00:12.0") is None


def test_windows_before_after_ns_are_ignored():
    assert kernel_recovery_window(_host(DMESG), "0000:00:10.0", after_ns=21_000_000_000) is None
