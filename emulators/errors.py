"""Errors of the emulated-host library.

Everything here is *infrastructure* trouble (QEMU died, no image, a bad
profile): the pytest plugin reports it as an error, never as a failed clause
and never as a pass. Each message names what was wrong and, where there is
one, the command that fixes it.
"""


class InfrastructureError(RuntimeError):
    """The test bed, not the system under test, went wrong."""


class ProfileError(InfrastructureError, ValueError):
    """A host profile is unknown or malformed (names the file and the key)."""


class ImageMissing(InfrastructureError):
    """The guest image has not been built."""


class ToolMissing(InfrastructureError):
    """A host program (QEMU, qemu-nbd, ...) is not installed."""


class QemuDied(InfrastructureError):
    """The QEMU process exited while we still needed it."""


class QmpError(InfrastructureError):
    """A QMP command failed, or got no reply within its deadline."""


class GuestAgentError(InfrastructureError):
    """The guest agent did not answer in time, or a guest command failed to start."""


class WaitTimeout(InfrastructureError, TimeoutError):
    """A wait for an event ran past its deadline (the message says what was awaited)."""


class FaultError(InfrastructureError):
    """A fault could not be injected (unknown slot, no capability, or QEMU refused it)."""
