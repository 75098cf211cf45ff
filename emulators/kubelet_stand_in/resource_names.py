"""Which resource names the kubelet accepts from a device plugin: extended resource names.

Why its own module: Register refuses any other name, and the reason goes into the
records, so the rule is written out once, as Kubernetes states it (v1helper's
IsExtendedResourceName): the name is `domain/name`, the domain is not in
`kubernetes.io` (nor a subdomain of it, nor anything containing `kubernetes.io/`), it does
not start with `requests.`, and `requests.` + name is a qualified name (DNS-1123
subdomain prefix of at most 253 characters, a name part of at most 63 characters of
[A-Za-z0-9._-] that starts and ends alphanumeric).
"""

from __future__ import annotations

import re

NATIVE_MARK = "kubernetes.io/"
QUOTA_PREFIX = "requests."
MAX_NAME_PART = 63
MAX_PREFIX = 253
_NAME_PART = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def extended_resource_name_problem(name: str) -> str | None:
    """Why ``name`` is not an extended resource name; None when it is one."""
    if "/" not in name:
        return "has no domain (an extended resource name is domain/name)"
    if NATIVE_MARK in name:
        return "is in the kubernetes.io domain, which is Kubernetes' own"
    if name.startswith(QUOTA_PREFIX):
        return f"starts with {QUOTA_PREFIX!r}, which quotas reserve"
    parts = (QUOTA_PREFIX + name).split("/")
    if len(parts) != 2:
        return "has more than one '/'"
    prefix, part = parts
    if len(prefix) > MAX_PREFIX or not _DNS1123_SUBDOMAIN.fullmatch(prefix):
        domain, most = prefix[len(QUOTA_PREFIX) :], MAX_PREFIX - len(QUOTA_PREFIX)
        return (
            f"domain {domain!r} is not a DNS-1123 subdomain (lower-case alphanumerics, '-' and '.', "
            f"starting and ending alphanumeric, at most {most} characters)"
        )
    if not part:
        return "has an empty name after the '/'"
    if len(part) > MAX_NAME_PART:
        return f"name part is longer than {MAX_NAME_PART} characters"
    if not _NAME_PART.fullmatch(part):
        return "name part must consist of alphanumerics, '-', '_' or '.', starting and ending alphanumeric"
    return None


def is_extended_resource_name(name: str) -> bool:
    return extended_resource_name_problem(name) is None
