"""Hypothesis strategies for every device-plugin message, built from the messages' own field tables.

Why from the tables: a field added to messages.py is generated (and round-tripped) at once.
"""

from __future__ import annotations

from hypothesis import strategies as st

from hilconform.runtime.deviceplugin.wire import BOOL, INT32, INT64, MAP, MESSAGE, STRING, FieldSpec

_text = st.text(max_size=12)
_SCALARS = {
    STRING: _text,
    BOOL: st.booleans(),
    INT32: st.integers(-(2**31), 2**31 - 1),
    INT64: st.integers(-(2**63), 2**63 - 1),
}


def field_values(spec: FieldSpec):
    if spec.kind == MAP:
        return st.dictionaries(_text, _text, max_size=3)
    single = messages_of(spec.message) if spec.kind == MESSAGE else _SCALARS[spec.kind]
    if spec.repeated:
        return st.lists(single, max_size=3).map(tuple)
    if spec.kind == MESSAGE:
        return st.none() | single
    return single


def messages_of(cls):
    return st.builds(cls, **{spec.name: field_values(spec) for spec in cls.wire_fields()})


def sample(cls):
    """One message of ``cls`` with every field set to something other than its default."""
    values = {}
    for spec in cls.wire_fields():
        if spec.kind == MAP:
            values[spec.name] = {"K1": "v1", "EMPTY": "", "ünï": "cödé"}
            continue
        if spec.kind == MESSAGE:
            one = sample(spec.message)
        else:
            one = {STRING: f"{spec.name}-µ", BOOL: True, INT32: -7, INT64: -(2**40)}[spec.kind]
        values[spec.name] = (one, one) if spec.repeated else one
    return cls(**values)
