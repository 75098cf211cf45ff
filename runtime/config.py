"""Runtime configuration: default-config.toml overridden by the --config file.

Why strict: a lab profile with a misspelt budget must fail at start with the
file and key named (exit 2), not run silently with the default.
"""

from __future__ import annotations

import os
import re
import tomllib
from typing import Any

DEFAULTS_PATH = os.path.join(os.path.dirname(__file__), "default-config.toml")
HEALTH_STATES = ("HEALTHY", "DEGRADED", "FAULTED")
_ID = re.compile(r"^[0-9a-f]{4}:([0-9a-f]{4}|\*)$")
_POSITIVE = {
    "batch_window_ms",
    "drain_timeout_ms",
    "drain_poll_ms",
    "reset_timeout_ms",
    "power_off_timeout_ms",
    "hot_add_step_timeout_ms",
    "lease_ttl_s",
    "lease_check_ms",
    "health_poll_ms",
    "max_outgoing_bytes",
    "max_clients",
    "max_requests_in_flight",
    "request_workers",
}
# keys are device IDs / hook options, not fixed names
_FREE_TABLES = {"firmware", "hooks", "device_plugin_resources"}


class ConfigError(Exception):
    def __init__(self, path: str, key: str, message: str):
        super().__init__(f"{path}: {key}: {message}")
        self.path, self.key, self.message = path, key, message


class Config:
    """The merged settings; top-level keys read as attributes (``cfg.drain_timeout_ms``)."""

    def __init__(self, data: dict, path: str):
        self.data = data
        self.path = path

    def __getattr__(self, name: str) -> Any:
        try:
            return self.data[name]
        except KeyError:
            raise AttributeError(name) from None

    def transport_kind(self) -> tuple[str, str]:
        kind, _, where = self.data["transport"].partition(":")
        return kind, where

    def summary(self) -> dict:
        """What ``hello`` reports: the budgets and policy a suite may want to know."""
        keys = (
            "name",
            "transport",
            "batch_window_ms",
            "uevent_source",
            "drain_timeout_ms",
            "reset_timeout_ms",
            "lease_ttl_s",
            "lease_check_ms",
            "health_poll_ms",
            "bus_master_off",
            "hot_add_step_timeout_ms",
            "max_clients",
            "max_requests_in_flight",
        )
        return {
            **{k: self.data[k] for k in keys},
            "selector": self.data["selector"],
            "aer": self.data["aer"],
            "config_file": self.path,
        }


def _read(path: str) -> dict:
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except OSError as exc:
        raise ConfigError(path, "-", f"cannot read: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(path, "-", f"not valid TOML: {exc}") from None


def _merge(defaults: dict, given: dict, path: str, prefix: str = "") -> dict:
    out = dict(defaults)
    for key, value in given.items():
        name = f"{prefix}{key}"
        if key not in defaults and prefix.rstrip(".") not in _FREE_TABLES:
            raise ConfigError(path, name, "unknown key")
        default = defaults.get(key)
        if isinstance(default, dict) and prefix.rstrip(".") not in _FREE_TABLES:
            if not isinstance(value, dict):
                raise ConfigError(path, name, "must be a table")
            out[key] = _merge(default, value, path, f"{name}.")
            continue
        if default is not None and not _same_type(default, value):
            raise ConfigError(path, name, f"must be {type(default).__name__}, got {type(value).__name__}")
        out[key] = float(value) if isinstance(default, float) else value
    return out


def _same_type(default: Any, value: Any) -> bool:
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(default, bool) and isinstance(value, bool)
    if isinstance(default, float):
        return isinstance(value, (int, float))
    return isinstance(value, type(default))


def _check(data: dict, path: str) -> None:
    for key in _POSITIVE:
        if not data[key] > 0:
            raise ConfigError(path, key, "must be > 0")
    if data["client_fd_reserve"] < 0:
        raise ConfigError(path, "client_fd_reserve", "must be >= 0")
    kind, _, where = data["transport"].partition(":")
    if kind not in ("unix", "virtio-serial") or not where:
        raise ConfigError(path, "transport", 'must be "unix:/path" or "virtio-serial:/dev/virtio-ports/NAME"')
    if kind == "unix" and len(where.encode()) > 107:
        raise ConfigError(path, "transport", "unix socket path longer than 107 bytes")
    if data["uevent_source"] not in ("kernel", "udev"):
        raise ConfigError(path, "uevent_source", 'must be "kernel" or "udev"')
    if data["bus_master_off"] not in ("before_drain", "after_drain"):
        raise ConfigError(path, "bus_master_off", 'must be "before_drain" or "after_drain"')
    aer = data["aer"]
    for key in ("nonfatal_recovered", "fatal_recovered"):
        aer[key] = str(aer[key]).upper()
        if aer[key] not in HEALTH_STATES:
            raise ConfigError(path, f"aer.{key}", f"must be one of {', '.join(HEALTH_STATES)}")
    for key in ("half_life_s", "degrade_weight", "reset_weight", "fault_weight"):
        if not aer[key] > 0:
            raise ConfigError(path, f"aer.{key}", "must be > 0")
    for sev, weight in aer["error_weight"].items():
        if weight < 0:
            raise ConfigError(path, f"aer.error_weight.{sev}", "must be >= 0")
    for dev_id, version in data["firmware"].items():
        if not _ID.match(dev_id):
            raise ConfigError(path, f"firmware.{dev_id}", 'key must be "vvvv:dddd" (lowercase hex)')
        if not (
            isinstance(version, str)
            or (isinstance(version, list) and all(isinstance(v, str) for v in version))
        ):
            raise ConfigError(path, f"firmware.{dev_id}", "must be a version string or a list of them")
    hooks = data["hooks"]
    for key, value in hooks.items():
        if key == "firmware" and not (
            isinstance(value, dict) and all(isinstance(v, str) for v in value.values())
        ):
            raise ConfigError(path, "hooks.firmware", 'must be a table of "vvvv:dddd" = "version"')
        elif key == "driverless" and not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            raise ConfigError(path, "hooks.driverless", 'must be a list of "vvvv:dddd"')
        elif key == "models" and not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            raise ConfigError(path, "hooks.models", 'must be a list of "vvvv:dddd"')
        elif key not in ("firmware", "driverless", "models"):
            raise ConfigError(path, f"hooks.{key}", "unknown key (known: firmware, driverless, models)")
    for dev_id, resource in data["device_plugin_resources"].items():
        where = f"device_plugin_resources.{dev_id}"
        if not _ID.match(dev_id) or dev_id.endswith("*"):
            raise ConfigError(path, where, 'key must be "vvvv:dddd" (lowercase hex)')
        if not isinstance(resource, str) or resource.count("/") != 1:
            raise ConfigError(path, where, 'must be "domain/name"')
    for key in ("classes", "ids"):
        values = data["selector"][key]
        if not all(isinstance(v, str) for v in values):
            raise ConfigError(path, f"selector.{key}", "must be a list of strings")


def load(path: str | None, overrides: dict | None = None) -> Config:
    """Defaults, then the file at ``path`` (if any), then ``overrides`` (tests)."""
    data = _read(DEFAULTS_PATH)
    origin = DEFAULTS_PATH
    if path:
        data = _merge(data, _read(path), path)
        origin = path
    if overrides:
        data = _merge(data, overrides, origin)
    _check(data, origin)
    try:
        from .selector import Selector

        Selector.from_config(data["selector"])
    except ValueError as exc:
        raise ConfigError(origin, "selector", str(exc)) from None
    except NotImplementedError:
        pass
    return Config(data, origin)
