"""Recipe files that are not UTF-8 YAML: one line naming the file and the byte, no traceback."""

import pytest

from xlstm_zoo import load_recipe
from xlstm_zoo.errors import ConfigError


@pytest.mark.parametrize("content, byte, offset", [
    (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "0x89", 0),                   # a binary file
    ("name: M\u00fcller's grid\nmodel: {}\n".encode("latin-1"), "0xfc", 7),  # Latin-1 text
])
def test_a_recipe_that_is_not_utf8_names_the_byte(tmp_path, run_cli, content, byte, offset):
    path = tmp_path / "recipe.yaml"
    path.write_bytes(content)
    code, _, err = run_cli("train", path)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"{path}: not UTF-8 text: byte {byte} at offset {offset} (recipes are UTF-8 YAML" in err
    with pytest.raises(ConfigError, match=f"byte {byte} at offset {offset}"):
        load_recipe(path)


def test_a_recipe_extending_a_latin1_file_names_that_file(tmp_path):
    (tmp_path / "base.yaml").write_bytes("description: d\u00e9j\u00e0 vu\n".encode("latin-1"))
    (tmp_path / "child.yaml").write_text("extends: base.yaml\n")
    with pytest.raises(ConfigError, match=r"base.yaml: not UTF-8 text: byte 0xe9 at offset 14"):
        load_recipe(tmp_path / "child.yaml")
