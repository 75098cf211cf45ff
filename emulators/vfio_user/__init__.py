"""Emulated accelerators with their real identities, served to QEMU over vfio-user.

`model` loads device models (emulators/models/*.toml), `device` is one card
(config space, BAR0 registers, memfd BARs, faults), `server` serves it on a
unix socket, `host` serves the models of one VM and `supervisor` notices a
dead or hung server. Standard library only; see docs/device-models.md.
"""
