"""``xlstm-zoo convert`` and ``xlstm-zoo generate`` end to end on random-weight official checkpoints."""

import json
import warnings

import pytest
import torch

from official_models import official_large, write_large_dir
from xlstm_zoo.cli import main
from xlstm_zoo.compiling import CompileWarning
from xlstm_zoo.pretrained.tensorfile import SafetensorsSource, write_safetensors


@pytest.fixture(scope="module")
def large_dir(tmp_path_factory):
    return write_large_dir(tmp_path_factory.mktemp("large"), official_large())


def test_convert_check_writes_the_zoo_layout(large_dir, tmp_path, capsys):
    assert main(["convert", str(large_dir), "--out", str(tmp_path / "out"), "--check", "--tokens", "20"]) == 0
    out = capsys.readouterr().out
    diff = float(out.split("= ")[1].split()[0])
    assert diff < 1e-4, out
    assert {p.name for p in (tmp_path / "out").iterdir()} == {"recipe.yaml", "model.safetensors", "convert.json",
                                                              "config.json", "xlstm_zoo_hf.py", "README.md"}
    provenance = json.loads((tmp_path / "out" / "convert.json").read_text())
    assert provenance["layout"] == "xlstm_large"
    assert provenance["check"]["max_abs_logit_difference"] == pytest.approx(diff, rel=1e-2)


def test_dry_run_prints_the_mapping_and_writes_nothing(large_dir, tmp_path, capsys):
    assert main(["convert", str(large_dir), "--out", str(tmp_path / "out"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "backbone.blocks.1.ffn.proj_up_gate.weight" in out and "stack.blocks.1.mlp.up.weight" in out
    assert not (tmp_path / "out").exists()


def test_a_misshaped_tensor_exits_nonzero_naming_key_and_field(large_dir, tmp_path, capsys):
    broken = write_large_dir(tmp_path / "broken", official_large())
    source = SafetensorsSource([broken / "model.safetensors"])
    state = {k: source.load(k) for k in source.keys()}
    state["backbone.blocks.1.ffn.proj_down.weight"] = torch.zeros(128, 320)
    write_safetensors(broken / "model.safetensors", state)
    assert main(["convert", str(broken), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "stack.blocks.1.mlp.down.weight" in err and "mlp.hidden_dim" in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("compile_flag", [[], ["--compile"]], ids=["eager", "compiled"])
def test_generate_streams_text_with_the_checkpoints_bos(large_dir, tmp_path, capsys, compile_flag):
    tokenizers = pytest.importorskip("tokenizers")
    directory = write_large_dir(tmp_path / "gen", official_large())
    words = ["<bos>", "<pad>", "<eos>"] + [f"w{i}" for i in range(94)]
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<pad>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tok.save(str(directory / "tokenizer.json"))
    (directory / "generation_config.json").write_text(json.dumps({"bos_token_id": 0, "eos_token_id": 2}))
    with warnings.catch_warnings():
        warnings.simplefilter("error", CompileWarning)  # --compile must really compile
        assert main(["generate", str(directory), "--prompt", "w5 w7", "--max-new-tokens", "6", "--greedy", "--bos",
                     *compile_flag]) == 0
    out = capsys.readouterr().out
    from xlstm_zoo.pretrained import from_pretrained
    prompt = [0, 8, 10]  # <bos> w5 w7
    new = from_pretrained(directory).generate(torch.tensor([prompt]), 6, greedy=True)[0, 3:].tolist()
    new = new[:new.index(2)] if 2 in new else new  # stops at <eos>
    assert new, "the greedy continuation is empty: the test would not see the streamed text"
    assert out == "w5 w7" + tok.decode(prompt + new)[len(tok.decode(prompt)):] + "\n"
