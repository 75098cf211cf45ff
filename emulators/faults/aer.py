"""AER: uncorrectable non-fatal and fatal errors at the port above a slot's device.

The port is a root port, or a switch's downstream port (the error then travels up to the root port
above the switch, which counts it; the kernel's recovery runs at the downstream port)."""

from __future__ import annotations

import time
from collections.abc import Callable

from ..errors import FaultError
from ..host_action import action
from .base import FaultRecord, FaultsBase

OnInjected = Callable[[int], None] | None  # called with injected_ns once the error is in

AER_TIMEOUT_S = 10.0
# Uncorrectable errors by their default severity (the Uncorrectable Error Severity
# register's reset value, which QEMU (hw/pci/pcie_aer.c) and the guest kernel keep). The HMP names.
FATAL_ERRORS = frozenset({"DLP", "SDN", "FCP", "RX_OVER", "MALF_TLP", "INTN"})
NONFATAL_ERRORS = frozenset({
    "POISON_TLP", "COMP_TIME", "COMP_ABORT", "UNX_COMP", "ECRC", "UNSUP", "ACSV", "MCBTLP",
    "ATOP_EBLOCKED", "TLP_PRF_BLOCKED",
})
# Correctable errors are refused up front: no clause needs one, and QEMU 7.2 (the system QEMU a
# stock host may fall back to) never delivers them, so a host could not promise them. QEMU 11.1
# does (the root port's aer_rootport_total_err_cor counts them: docs/faults.md).
CORRECTABLE_ERRORS = frozenset({
    "RCVR", "BAD_TLP", "BAD_DLLP", "REP_ROLL", "REP_TIMER", "ADV_NONFATAL", "INTERNAL",
    "HL_OVERFLOW",
})


class AerFaults(FaultsBase):
    @action("aer-nonfatal")
    def aer_nonfatal(self, target: str, error: str = "UNSUP", wait_recovery: bool = False,
                     timeout_s: float = AER_TIMEOUT_S, on_injected: OnInjected = None) -> FaultRecord:
        """Uncorrectable non-fatal error at the port above the target's device."""
        if error.upper() not in NONFATAL_ERRORS:
            raise FaultError(f"aer-nonfatal at {target}: {error!r} is not a non-fatal "
                             f"uncorrectable error (use one of {', '.join(sorted(NONFATAL_ERRORS))})")
        return self.aer(target, error, wait_recovery, timeout_s, on_injected)

    @action("aer-fatal")
    def aer_fatal(self, target: str, error: str = "DLP", wait_recovery: bool = False,
                  timeout_s: float = AER_TIMEOUT_S, on_injected: OnInjected = None) -> FaultRecord:
        """Uncorrectable fatal error at the port above the target's device (link reset)."""
        if error.upper() not in FATAL_ERRORS:
            raise FaultError(f"aer-fatal at {target}: {error!r} is not a fatal uncorrectable "
                             f"error (use one of {', '.join(sorted(FATAL_ERRORS))})")
        return self.aer(target, error, wait_recovery, timeout_s, on_injected)

    @action("aer-nonfatal", "aer-fatal")
    def aer(self, target: str, error: str, wait_recovery: bool = False,
            timeout_s: float = AER_TIMEOUT_S, on_injected: OnInjected = None) -> FaultRecord:
        """HMP `pcie_aer_inject_error <port> <error>`; verified by the port's AER counters.

        `error` is an HMP error name (or a number QEMU accepts). The guest counts an
        error injected at a root port on the port (aer_rootport_total_err_*), not
        on the endpoint; one injected at a switch's downstream port is counted on
        the root port above the switch (details["root_port_bdf"]). wait_recovery=True
        also waits for the kernel's "device recovery successful|failed" line for the
        port the error was injected at (details["recovery"]). `on_injected(injected_ns)` is called
        as soon as QEMU accepted the error, before the guest's counters are read back (a test that
        times requests from the injection does not wait for the verification's round trips).
        """
        severity = ("fatal" if error.upper() in FATAL_ERRORS else
                    "nonfatal" if error.upper() in NONFATAL_ERRORS else None)
        fault = f"aer-{severity}" if severity else "aer"
        if error.upper() in CORRECTABLE_ERRORS:
            raise FaultError(f"{fault} at {target}: correctable error {error!r} is not offered: no "
                             f"clause needs one, and QEMU 7.2 never delivers it to the guest")
        resolved = self._resolve(fault, target)
        if severity != "nonfatal":  # a fatal error resets the link, hence the device
            self._refuse_if_freezing(fault, resolved)
        port = f"/sys/bus/pci/devices/{resolved.root_port_bdf}"  # where the guest counts it
        before = self._aer_counters(port)
        recoveries = self._recovery_lines(resolved.port_bdf) if wait_recovery else None
        command = f"pcie_aer_inject_error {resolved.port_id} {error}"
        requested_ns = time.monotonic_ns()
        reply = self._hmp(fault, target, command)
        injected_ns = time.monotonic_ns()
        if not reply.startswith("OK id:"):
            # QEMU 7.2 replies with the bare reason; later ones put "Error: " before it.
            reason = reply.strip().removeprefix("Error: ")
            raise FaultError(f"{fault} at {target}: QEMU refused `{command}`: {reason}")
        if on_injected is not None:
            on_injected(injected_ns)

        def counted():
            after = self._aer_counters(port)
            grew = [k for k in after if after[k] > before[k]]
            wanted = f"rootport_{severity}" if severity else None
            return after if (wanted in grew if wanted else grew) else None

        after = self._wait(fault, target, timeout_s, counted,
                           f"the guest counting the error on root port {resolved.root_port_bdf}")
        verified_ns = time.monotonic_ns()
        details = {"error": error, "port_bdf": resolved.port_bdf, "root_port_bdf": resolved.root_port_bdf,
                   "device_bdf": resolved.device.bdf,
                   "counters_before": before, "counters_after": after, "hmp_reply": reply.strip()}
        if wait_recovery:
            def recovered():
                lines = self._recovery_lines(resolved.port_bdf)
                new = lines[len(recoveries):]
                return new[-1] if new else None

            line = self._wait(fault, target, timeout_s, recovered,
                              f"the kernel's recovery line for port {resolved.port_bdf}")
            details["recovery"] = "successful" if line.endswith("successful") else "failed"
            details["recovered_ns"] = time.monotonic_ns()
        return FaultRecord(fault, resolved.name, resolved.port_id, requested_ns, injected_ns,
                           verified_ns, details)

    def _aer_counters(self, port: str) -> dict[str, int]:
        return {
            f"rootport_{sev}": int(self.vm.agent.read_file(
                f"{port}/aer_rootport_total_err_{sev}").decode().strip() or 0)
            for sev in ("fatal", "nonfatal")
        }

    def _recovery_lines(self, port_bdf: str) -> list[str]:
        needle = f"pcieport {port_bdf}: AER: device recovery"
        dmesg = self.vm.agent.run(["dmesg"], timeout_s=20).stdout
        return [line.strip() for line in dmesg.splitlines() if needle in line]
