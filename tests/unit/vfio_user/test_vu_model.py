"""Model files: the shipped models load with their real identities; impossible layouts are refused."""

from pathlib import Path

import pytest

from hilconform.emulators.vfio_user.model import MODEL_DIR, ModelError, available_models, load_model


def test_shipped_models_have_real_identities():
    assert set(available_models()) >= {"a100-sxm4", "t4", "alveo-u250"}
    a100 = load_model("a100-sxm4")
    assert (a100.ids, a100.class_hex, a100.link_speed, a100.link_width) == ("10de:20b0", "0302", "16", 16)
    assert [(b.index, b.size >> 20, b.kind) for b in a100.bars] == [
        (0, 16, "mem32"), (1, 256, "mem64"), (3, 32, "mem64")]
    assert a100.bar(1).prefetchable and a100.bar(3).prefetchable
    t4 = load_model("t4")
    assert (t4.ids, t4.link_speed, t4.link_width) == ("10de:1eb8", "8", 16)
    u250 = load_model("alveo-u250")
    assert (u250.ids, u250.class_hex) == ("10ee:5005", "1200")
    assert u250.shell is not None and a100.shell is None


def _variant(tmp_path: Path, old: str, new: str, base: str = "a100-sxm4") -> Path:
    text = (MODEL_DIR / f"{base}.toml").read_text()
    assert old in text, f"test fixture: {old!r} not in {base}.toml"
    path = tmp_path / "bad.toml"
    path.write_text(text.replace(old, new, 1))
    return path


@pytest.mark.parametrize(("old", "new", "field", "words"), [
    ('size = "16M"', 'size = "12M"', "bars[0].size", "power of two"),
    ("aer = 0x100", "aer = 0x100\n", None, None),  # sanity: unchanged layout loads
    ("dsn = 0x148", "dsn = 0x140", "capabilities.dsn", "overlaps capabilities.aer"),
    ("pm = 0x60", "pm = 0x7c", "capabilities.pm", "overlaps capabilities.pcie"),
    ('class = "0302"', 'class = "0399"', "identity.class", "unknown class"),
    ('device = "20b0"', 'device = "20b"', "identity.device", "hex digits"),
    ("index = 3", "index = 1", "bars[2].index", "already used"),
    ('speed = "16"', 'speed = "7"', "link.speed", "not one of"),
    ("aer = 0x100", "aer = 0x180", "capabilities.dsn", "must sit at 0x100"),
    ("pm = 0x60", "pm = 0x62", "capabilities.pm", "dword-aligned"),
    ("pm = 0x60", "pm = 0x60\nmsi = 0x50", "capabilities.msi", "unknown capability"),
])
def test_impossible_layouts_are_refused_naming_file_and_field(tmp_path, old, new, field, words):
    path = _variant(tmp_path, old, new)
    if field is None:
        load_model(path)
        return
    with pytest.raises(ModelError) as err:
        load_model(path)
    message = str(err.value)
    assert str(path) in message and f"'{field}'" in message and words in message


def test_missing_register_bar_is_refused(tmp_path):
    path = _variant(tmp_path, 'backing = "registers"', 'backing = "memfd"')
    with pytest.raises(ModelError, match="'bars'.*registers"):
        load_model(path)


def test_unknown_model_names_the_known_ones():
    with pytest.raises(ModelError, match="a100-sxm4"):
        load_model("h100")
