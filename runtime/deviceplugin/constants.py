"""Constants the device-plugin API documents beside its messages (proto3 cannot hold them)."""

from __future__ import annotations

VERSION = "v1beta1"
SUPPORTED_VERSIONS = (VERSION,)  # what a kubelet of this API accepts in RegisterRequest.version
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
DEVICE_PLUGIN_PATH = "/var/lib/kubelet/device-plugins/"
KUBELET_SOCKET_NAME = "kubelet.sock"
KUBELET_SOCKET = DEVICE_PLUGIN_PATH + KUBELET_SOCKET_NAME
PRE_START_CONTAINER_TIMEOUT_S = 30  # the kubelet's deadline for PreStartContainer
