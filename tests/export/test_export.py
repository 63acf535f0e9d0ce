"""Export of step models (issue 6): ONNX written with the dynamo exporter, validated with onnxruntime.

What is proven here, on CPU:
- state names follow the documented scheme (``block{i}.{cell}.{field}``, ``block{i}.conv``; outputs
  ``next.<name>``), for every shipped recipe and for bare cells;
- each shipped cell (lstm, slstm, mlstm), inside every block kind (conv states included), exports
  and agrees with PyTorch at three batch sizes (two of them not the tracing example), per output
  and per state, and over 1000-step rollouts from the zero state and from a random state; the
  comparison fails a model that differs, and its float64 second look forgives only fp32 rounding;
- a full shipped recipe (xLSTM[7:1], small dim) does the same; a prefill model too;
- the static TensorRT operator check runs on every export and flags unsupported operators;
- the CLI end to end, for onnx and for tensorrt (TensorRT is absent here: one line says so, the
  validated ONNX is written, and the trtexec command names every input with min/opt/max shapes);
- bad input (a cell without step, a state returned unchanged, a checkpoint that does not match its
  recipe, an unknown format, an unwritable directory, bad batch/opset) fails with one clear line.
Nothing here pretends TensorRT ran: the one test that needs it skips with the reason.
"""

from __future__ import annotations

import json
import math
import re
from typing import Literal, NamedTuple

import numpy as np
import onnx
import pytest
import torch

import xlstm_zoo
from xlstm_zoo.cells.base import Cell
from xlstm_zoo.checkpoint import save_checkpoint, write_model_dir
from xlstm_zoo.config import BuildContext, ZooConfig, build
from xlstm_zoo.errors import ConfigError
from xlstm_zoo.export import ExportError, ExportWarning, build_signature, export_step, named_state
from xlstm_zoo.export import tensorrt as trt_export
from xlstm_zoo.export import validate as checks
from xlstm_zoo.export.step_model import StepModule, prepare_model
from xlstm_zoo.export.trt_check import check_step_graph
from xlstm_zoo.export.trt_deploy import deploy_tensorrt
from xlstm_zoo.export.validate import OrtStep, check_trt_ops, trt_supported_ops
from xlstm_zoo.recipe_loader import build as build_recipe, load_recipe, shipped_recipes
from xlstm_zoo.registry import component, registry

DIM = 32
BATCH = (1, 3, 5)          # traced at 3; validated at 1, 3 and 5

# One small LM per shipped cell; together they use every block kind: with a conv state (pre_up,
# post_up with conv_kernel 4) and without (mlstm_7b, residual, plain, post_up with conv_kernel 0).
CELL_CASES = {
    "mlstm": ("mb", {"m": {"type": "pre_up", "cell": {"type": "mlstm", "num_heads": 2}},
                     "b": {"type": "mlstm_7b", "cell": {"type": "mlstm", "num_heads": 2, "qk_dim_factor": 0.5,
                                                        "output_gate": True, "norm": {"type": "multihead_rmsnorm"}}}}),
    "slstm": ("sr", {"s": {"type": "post_up", "conv_kernel": 4, "cell": {"type": "slstm", "num_heads": 2}},
                     "r": {"type": "residual", "cell": {"type": "slstm", "num_heads": 4}}}),
    "lstm": ("lpu", {"l": {"type": "post_up", "conv_kernel": 4, "cell": {"type": "lstm", "recurrent": "blockdiag",
                                                                          "num_heads": 2}},
                     "p": {"type": "plain", "cell": {"type": "lstm"}},
                     "u": {"type": "post_up", "conv_kernel": 0, "cell": {"type": "lstm"}}}),
}
EXPECTED_NAMES = {
    "mlstm": ["block0.mlstm.C", "block0.mlstm.n", "block0.mlstm.m", "block0.conv",
              "block1.mlstm.C", "block1.mlstm.n", "block1.mlstm.m"],
    "slstm": ["block0.slstm.c", "block0.slstm.n", "block0.slstm.m", "block0.slstm.h", "block0.conv",
              "block1.slstm.c", "block1.slstm.n", "block1.slstm.m", "block1.slstm.h"],
    "lstm": ["block0.lstm.c", "block0.lstm.h", "block0.conv", "block1.lstm.c", "block1.lstm.h",
             "block2.lstm.c", "block2.lstm.h"],
}
CELL_FIELDS = {"mlstm": ["C", "n", "m"], "slstm": ["c", "n", "m", "h"], "lstm": ["c", "h"]}


def small_lm(cell: str):
    pattern, blocks = CELL_CASES[cell]
    torch.manual_seed(0)
    # the mLSTM case soft-caps its logits (as the 7B does), small enough to change them: the ONNX step
    # must carry the cap to pass validation against PyTorch
    return build_recipe(load_recipe({"name": f"{cell} test", "model": {
        "type": "causal_lm", "vocab_size": 64, "dim": DIM, "logit_softcap": 0.3 if cell == "mlstm" else None,
        "stack": {"type": "xlstm", "pattern": pattern, "blocks": blocks}}}))


def bare_cell(cell: str):
    torch.manual_seed(0)
    config = {"mlstm": {"type": "mlstm", "num_heads": 2}, "slstm": {"type": "slstm", "num_heads": 2},
              "lstm": {"type": "lstm"}}[cell]
    entry = registry.get("cell", cell)
    return build(entry.config.model_validate(config), BuildContext(dim=16, path="cell"), "cell")


def assert_validated(result, *, rollout_steps=1000):
    """Every output and state compared at >= 2 batch sizes (one not the example) and over both rollouts."""
    sig, report = result.signature, result.report
    assert result.ok, "export failed validation:\n" + "\n".join(report.failures())
    names = [sig.output.name, *(f"next.{n}" for n in sig.state_names)]
    step_rows = [r for r in report.rows if r.check.startswith("step from")]
    batches = sorted({r.batch for r in step_rows})
    assert len(batches) >= 2 and any(b != result.example_batch for b in batches), batches
    for b in batches:
        for start in ("zero", "random"):
            compared = [r.name for r in step_rows if r.batch == b and r.check == f"step from {start}"]
            assert compared == names, f"batch {b}, step from {start}: compared {compared}, expected {names}"
    for r in step_rows:
        shape = sig.output.shape if r.name == sig.output.name else \
            next(s.shape for s in sig.states if f"next.{s.name}" == r.name)
        assert r.shape == (r.batch, *shape), r
        assert r.ok and math.isfinite(r.max_abs) and math.isfinite(r.max_rel), r
    for start in ("zero", "random"):
        check = f"rollout {rollout_steps} from {start}" + (" with random resets" if sig.reset else "")
        rows = [r for r in report.rows if r.check == check]
        assert len(rows) == 1 + len(sig.states), f"rollout from {start}: {len(rows)} rows"
        assert all(r.ok for r in rows), [r for r in rows if not r.ok]
        assert rows[0].batch != result.example_batch
    assert all(ok for _, ok, _ in report.graph), report.graph


# -- names (no export needed) ------------------------------------------------------------------------

def test_state_names_follow_the_documented_scheme():
    model = build_recipe(load_recipe("xlstm_1_1", ["stack.num_blocks=2", f"dim={DIM}"]))
    sig = build_signature(prepare_model(model, torch.float32))
    assert sig.input.name == "token" and sig.input.dtype == torch.int64 and sig.input.shape == ()
    assert sig.output.name == "logits" and sig.output.shape == (256,)
    assert sig.state_names == ["block0.mlstm.C", "block0.mlstm.n", "block0.mlstm.m", "block0.conv",
                               "block1.slstm.c", "block1.slstm.n", "block1.slstm.m", "block1.slstm.h", "block1.conv"]
    assert sig.output_names == ["logits", *(f"next.{n}" for n in sig.state_names)]
    zero = {s.name: s.zero for s in sig.states}
    assert zero["block1.slstm.m"] == -math.inf  # sLSTM's zero state: m = -inf, everything else 0
    assert all(v == 0.0 for k, v in zero.items() if k != "block1.slstm.m")
    shapes = {s.name: s.shape for s in sig.states}
    assert shapes["block0.mlstm.C"] == (4, 16, 16) and shapes["block0.conv"] == (3, 2 * DIM)
    assert all(s.dtype == torch.float32 for s in sig.states)


@pytest.mark.parametrize("recipe", [r.removeprefix("models/") for r in shipped_recipes() if r.startswith("models/")])
def test_every_shipped_recipe_has_a_step_signature(recipe):
    """Names unique and block-prefixed, fp32 states, the flat step module equals the model's step."""
    model = prepare_model(build_recipe(load_recipe(recipe, [f"dim={DIM}"])), torch.float32)
    sig = build_signature(model)
    blocks = len(model.stack.blocks)
    assert len(set(sig.state_names)) == len(sig.state_names)
    assert {n.split(".")[0] for n in sig.state_names} == {f"block{i}" for i in range(blocks)}
    for name in sig.state_names:
        assert re.fullmatch(r"block\d+\.(conv|(lstm|slstm|mlstm)\.(C|n|m|c|h)|rwkv\.(shift|num|den|m)"
                            r"|rwkv_channel_mix\.shift|retention\.S|attention\.(k|v|pos)|mamba\.(conv|ssm))", name), name
    gen = torch.Generator().manual_seed(0)
    x, states = sig.example_input(2, gen), sig.random_state(2, gen)
    with torch.no_grad():
        y, *new = StepModule(model, sig)(x, *states)
        y_ref, state_ref = model.step(x, sig.unflatten(states))
    torch.testing.assert_close(y, y_ref, rtol=0, atol=0)  # exact: the wrapper runs the same step
    for got, want in zip(new, sig.flatten(state_ref)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert all(a is not b for a, b in zip(new, states)), "a state came back unchanged"


# -- export + validation per cell (module-scoped: each model is exported once) ---------------------------

@pytest.fixture(scope="module")
def cell_exports(tmp_path_factory):
    cache = {}

    def get(cell):
        if cell not in cache:
            out = tmp_path_factory.mktemp(f"export-{cell}")
            # the LSTM case is exported as `--format tensorrt` does (int32 token ids, safe forms; see test_trt.py)
            cache[cell] = export_step(small_lm(cell), out, batch=BATCH, rollout_steps=1000, threads=1,
                                      prefill=5 if cell in ("mlstm", "slstm") else None, source=f"{cell} test",
                                      token_dtype=torch.int32 if cell == "lstm" else torch.int64,
                                      safe_forms=cell == "lstm")
        return cache[cell]
    return get


@pytest.mark.slow  # ONNX export and long validation (10-40 s each)
@pytest.mark.parametrize("cell", list(CELL_CASES))
def test_cell_in_blocks_exports_and_matches_pytorch(cell_exports, cell):
    result = cell_exports(cell)
    assert result.signature.state_names == EXPECTED_NAMES[cell]
    assert result.validation_batches == [1, 3, 5] and result.example_batch == 3
    assert_validated(result)
    # the file says what it is: opset stated, names as documented, batch axis symbolic
    model = onnx.load(str(result.onnx_path))
    assert [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")] == [18]
    assert [i.name for i in model.graph.input] == ["token", *EXPECTED_NAMES[cell]]
    assert [o.name for o in model.graph.output] == ["logits", *(f"next.{n}" for n in EXPECTED_NAMES[cell])]
    for value in [*model.graph.input, *model.graph.output]:
        assert value.type.tensor_type.shape.dim[0].dim_param == "batch", value.name
    meta = json.loads(result.metadata_path.read_text())
    assert meta["opset"] == 18 and meta["validation"]["ok"] is True
    assert [s["name"] for s in meta["states"]] == EXPECTED_NAMES[cell]


@pytest.mark.parametrize("cell", list(CELL_CASES))
def test_trt_op_check_runs_on_every_export(cell_exports, cell):
    check = cell_exports(cell).report.trt
    assert check.ok, check.summary()
    assert check.opset == 18 and check.tensorrt
    assert {op for op, *_ in check.ops} == set(cell_exports(cell).histogram)
    assert all(status == "yes" for _, _, status, _ in check.ops)


def test_slstm_zero_state_minus_inf_runs_in_onnxruntime(cell_exports):
    """The zero state feeds m = -inf; ORT's first step must give finite m = log i and n = 1, like PyTorch."""
    result = cell_exports("slstm")
    sig = result.signature
    ort_step = OrtStep(result.onnx_path, sig)
    zero = sig.zero_state(2)
    assert np.isneginf(zero[sig.state_names.index("block0.slstm.m")].numpy()).all()
    x = torch.tensor([5, 7])
    y, states = ort_step(x.numpy(), [s.numpy() for s in zero])
    new = dict(zip(sig.state_names, states))
    assert np.isfinite(y).all()
    for block in ("block0", "block1"):
        assert np.isfinite(new[f"{block}.slstm.m"]).all()
        np.testing.assert_allclose(new[f"{block}.slstm.n"], 1.0, rtol=0, atol=1e-6)  # n = 1 after one token, fp32
    model = small_lm("slstm").eval()
    with torch.no_grad():
        y_ref, _ = model.step(x, model.init_state(2))
    np.testing.assert_allclose(y, y_ref.numpy(), rtol=1e-4, atol=1e-5)  # onnxruntime vs PyTorch: export validation's fp32 step bound
    # a runtime that cannot hold -inf may feed any m <= -1e30: the first step is then bit-identical
    finite = [np.where(np.isneginf(s.numpy()), np.float32(-1e30), s.numpy()) for s in zero]
    y_finite, states_finite = ort_step(x.numpy(), finite)
    np.testing.assert_array_equal(y_finite, y)
    for got, want in zip(states_finite, states):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("cell", ["mlstm", "slstm"])  # sLSTM: its compiled loop must not be traced
def test_prefill_model_matches_pytorch_forward(cell_exports, cell):
    result = cell_exports(cell)
    assert result.prefill_path is not None and result.prefill_path.is_file()
    report = result.prefill_report
    assert report.ok, report.failures()
    batches = sorted({r.batch for r in report.rows})
    assert batches == [1, 3, 5]
    model = onnx.load(str(result.prefill_path))
    assert model.graph.input[0].name == "tokens"
    assert [d.dim_param or d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim] == ["batch", 5]


@pytest.mark.parametrize("cell", ["lstm", "slstm", "mlstm"])
def test_bare_cell_exports_and_matches_pytorch(tmp_path, cell):
    result = export_step(bare_cell(cell), tmp_path, batch=(1, 2, 4), rollout_steps=1000, threads=1)
    sig = result.signature
    assert sig.input.name == "x" and sig.input.shape == (16,) and sig.input.dtype == torch.float32
    assert sig.output.name == "y" and sig.output.shape == (16,)
    assert sig.state_names == [f"{cell}.{f}" for f in CELL_FIELDS[cell]]
    assert_validated(result)
    assert result.report.trt.ok, result.report.trt.summary()


BASELINE_BLOCKS = {  # a Llama layer (attention + SwiGLU) and a Mamba layer, as the shipped recipes build them
    "a": {"type": "residual", "norm": {"type": "rmsnorm"}, "mlp": {"activation": "silu"}, "mlp_norm": {"type": "rmsnorm"},
          "cell": {"type": "attention", "num_heads": 4, "num_kv_heads": 2, "max_cache": 512}},
    "y": {"type": "residual", "norm": {"type": "rmsnorm"}, "cell": {"type": "mamba", "state_size": 8}},
}


def test_attention_and_mamba_blocks_export_and_match_over_300_steps(tmp_path):
    """The fixed-size cache keeps the attention step's shapes static: 300 steps from the zero state and
    from a random one (at most max_cache / 4 tokens in) stay within the cache and match PyTorch."""
    torch.manual_seed(0)
    model = build_recipe(load_recipe({"name": "baselines", "model": {
        "type": "causal_lm", "vocab_size": 64, "dim": DIM, "stack": {"type": "xlstm", "pattern": "ay",
                                                                    "blocks": BASELINE_BLOCKS}}}))
    result = export_step(model, tmp_path, batch=BATCH, rollout_steps=300, threads=1, source="baselines")
    assert result.signature.state_names == ["block0.attention.k", "block0.attention.v", "block0.attention.pos",
                                            "block1.mamba.conv", "block1.mamba.ssm"]
    assert_validated(result, rollout_steps=300)
    assert result.report.trt.ok, result.report.trt.summary()


@pytest.mark.slow  # a 300-step validation of four block kinds (about 20 s)
def test_reset_input_restarts_rows_and_matches_pytorch_over_300_steps(tmp_path):
    """``reset=True`` (issue 47): the step takes ``reset [batch]``; rows where it is true restart from the zero
    state (sLSTM's m at -inf, conv windows, the attention cache and position). Validated over 300 steps
    with random resets against PyTorch, and a reset row equals a step from the zero state."""
    torch.manual_seed(0)
    blocks = {**BASELINE_BLOCKS, **CELL_CASES["slstm"][1], **CELL_CASES["mlstm"][1]}
    model = build_recipe(load_recipe({"name": "reset", "model": {
        "type": "causal_lm", "vocab_size": 64, "dim": DIM, "stack": {"type": "xlstm", "pattern": "aysm",
                                                                    "blocks": blocks}}}))
    result = export_step(model, tmp_path, batch=BATCH, rollout_steps=300, threads=1, source="reset", reset=True)
    sig = result.signature
    assert sig.input_names[:2] == ["token", "reset"]
    assert_validated(result, rollout_steps=300)
    assert any("with random resets" in r.check for r in result.report.rows)
    assert "reset:3" in result.trtexec_command()
    ort_step = OrtStep(result.onnx_path, sig, threads=1)
    gen = torch.Generator().manual_seed(3)
    x = sig.example_input(3, gen).numpy()
    random_state = [s.numpy() for s in sig.random_state(3, gen)]
    restarted, _ = ort_step(x, random_state, [np.array([True, False, True])])
    fresh, _ = ort_step(x, [s.numpy() for s in sig.zero_state(3)], [np.zeros(3, dtype=bool)])
    kept, _ = ort_step(x, random_state, [np.zeros(3, dtype=bool)])
    np.testing.assert_allclose(restarted[[0, 2]], fresh[[0, 2]], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(restarted[1], kept[1], rtol=1e-5, atol=1e-5)
    assert json.loads(result.metadata_path.read_text())["reset"]["dtype"] == "bool"


def test_exported_attention_step_past_its_cache_gives_nan(tmp_path):
    """An exported graph cannot raise: a step with the cache full outputs NaN rather than a silently
    truncated attention (eagerly it is a ConfigError naming max_cache)."""
    torch.manual_seed(0)
    cell = build(registry.get("cell", "attention").config(max_cache=4), BuildContext(dim=16, path="cell"), "cell")
    result = export_step(cell, tmp_path, batch=(1, 2, 3), rollout_steps=0, threads=1)
    sig = result.signature
    x = torch.randn(2, 16)
    state = [s.numpy() for s in sig.zero_state(2)]
    ort_step = OrtStep(result.onnx_path, sig)
    for _ in range(4):
        y, state = ort_step(x.numpy(), state)
        assert np.isfinite(y).all()
    y, _ = ort_step(x.numpy(), state)
    assert np.isnan(y).all()
    with pytest.raises(ConfigError, match="max_cache=4"):
        cell.step(x, sig.unflatten([torch.from_numpy(s) for s in state]))


def test_validation_catches_a_model_that_differs(cell_exports):
    """The comparison has teeth: the same ONNX against a PyTorch model with nudged weights fails."""
    from xlstm_zoo.export.validate import validate_step

    result = cell_exports("slstm")
    other = prepare_model(small_lm("slstm"), torch.float32)
    with torch.no_grad():
        other.stack.blocks[1].cell.R.mul_(1.01)  # block 1's recurrent weights only
    report = validate_step(result.onnx_path, StepModule(other, result.signature), result.signature,
                           batches=[1, 3], rollout_steps=20, threads=1)
    assert not report.ok
    failed = {r.name for r in report.rows if not r.ok}
    assert "logits" in failed and "next.block1.slstm.c" in failed
    assert "next.block0.slstm.c" not in failed and "next.block0.conv" not in failed  # block 0 still agrees


def test_float64_second_chance_only_forgives_fp32_rounding():
    """Outside tolerance, a tensor passes only if onnxruntime is as close to float64 as PyTorch fp32 is."""
    from xlstm_zoo.export.validate import Row, judge_against_float64, max_abs_diff

    def judged(err_ort, err_torch):
        row = Row("step from zero", 64, "logits", (64, 256), 9.8e-4, 1.3, False)
        judge_against_float64(row, err_ort, err_torch, atol=1e-5)
        return row
    row = judged(4.7e-4, 5.2e-4)   # measured on xlstm_7b_small: both runtimes equally far from float64
    assert row.ok and row.note == "vs float64: onnxruntime 4.7e-04, PyTorch 5.2e-04"
    assert not judged(5e-3, 5.2e-4).ok        # ten times PyTorch's own error: an export error
    assert not judged(math.nan, 5.2e-4).ok and not judged(math.inf, 5.2e-4).ok
    inf = np.array([-np.inf, 1.0], dtype=np.float32)
    assert max_abs_diff(inf, inf.copy()) == 0.0
    assert max_abs_diff(np.array([np.nan, 1.0]), np.array([0.0, 1.0])) == math.inf
    assert max_abs_diff(np.zeros(3), np.zeros(4)) == math.inf


def test_float16_compute_keeps_fp32_states(tmp_path):
    result = export_step(bare_cell("slstm"), tmp_path, batch=(1, 2, 4), dtype="float16", rollout_steps=200, threads=1)
    model = onnx.load(str(result.onnx_path))
    types = {v.name: v.type.tensor_type.elem_type for v in [*model.graph.input, *model.graph.output]}
    assert types["x"] == onnx.TensorProto.FLOAT16 and types["y"] == onnx.TensorProto.FLOAT16
    assert all(types[n] == onnx.TensorProto.FLOAT for n in [*result.signature.state_names,
                                                             *result.signature.output_names[1:]])
    assert_validated(result, rollout_steps=200)


@pytest.mark.slow  # ONNX export and long validation (10-40 s each)
def test_full_shipped_recipe_exports_and_matches_pytorch(tmp_path):
    recipe = load_recipe("xlstm_7_1", [f"dim={DIM}"])
    torch.manual_seed(0)
    result = export_step(build_recipe(recipe), tmp_path, batch=BATCH, rollout_steps=1000, threads=1,
                         source="xlstm_7_1")
    names = result.signature.state_names
    assert len([n for n in names if n.endswith(".conv")]) == 8          # every block has a causal conv
    assert [n for n in names if ".slstm." in n] == [f"block1.slstm.{f}" for f in "cnmh"]  # msmmmmmm
    assert len([n for n in names if ".mlstm." in n]) == 7 * 3
    assert_validated(result)
    assert result.report.trt.ok, result.report.trt.summary()
    meta = json.loads(result.metadata_path.read_text())
    zero = {s["name"]: s["zero"] for s in meta["states"]}
    assert zero["block1.slstm.m"] == "-inf" and zero["block0.mlstm.m"] == 0.0
    assert meta["versions"]["onnxruntime"] != "not installed" and meta["batch"] == {"min": 1, "opt": 3, "max": 5}


# -- the TensorRT operator check and command ---------------------------------------------------------------

def test_trt_op_table_ships_with_the_package_and_flags_unsupported_ops():
    table = trt_supported_ops()
    assert table["operators"]["LayerNormalization"]["supported"] is True
    assert table["operators"]["Unique"]["supported"] is False
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Unique", ["x"], ["u"]), onnx.helper.make_node("MyCustomOp", ["u"], ["y"]),
         onnx.helper.make_node("Relu", ["y"], ["z"])], "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [4])],
        [onnx.helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, [None])])
    check = check_trt_ops(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 25)]))
    assert not check.ok
    status = {op: s for op, _, s, _ in check.ops}
    assert status == {"Unique": "no", "MyCustomOp": "unknown", "Relu": "yes"}
    assert check.unsupported == ["MyCustomOp", "Unique"]
    assert "Unique" in check.summary() and "opset 25 outside" in check.summary()


def test_tensorrt_deployment_rewrites_pass_the_check_and_match_pytorch(cell_exports):
    """The small LSTM LM (int32 token ids, as --format tensorrt exports them): folded and fp16 graphs, each
    checked and validated; the report holds the profile. The int64-token mLSTM export breaks one rule."""
    result = cell_exports("lstm")
    deployed = deploy_tensorrt(result, small_lm("lstm"), steps=20, threads=1)
    assert deployed.violations == [], [v.line() for v in deployed.violations]
    fp32, fp16, storage = deployed.artefacts
    assert [a.precision for a in deployed.artefacts] == ["fp32", "fp16", "fp16 storage (emulated)"]
    for artefact in deployed.artefacts:
        assert artefact.validation.ok, artefact.validation.failures()
        assert {r.check for r in artefact.validation.rows} >= {"rollout 20 from zero", "rollout 20 from random"}
    assert fp32.worst_output(True) <= 1e-4 < fp16.worst_output(True) <= storage.worst_output(True) * 1.5
    half = onnx.load(str(fp16.path))
    assert any(t.data_type == onnx.TensorProto.FLOAT16 for t in half.graph.initializer)  # weights in fp16
    assert [i.type.tensor_type.elem_type for i in half.graph.input] == \
        [onnx.TensorProto.INT32] + [onnx.TensorProto.FLOAT] * len(result.signature.states)  # same bindings
    report = json.loads((result.onnx_path.parent / "step.trt.json").read_text())
    assert report["ok"] and report["optimization_profile"]["token"] == {"min": [1], "opt": [3], "max": [5]}
    assert report["optimization_profile"]["block0.conv"]["max"] == [5, 3, DIM]
    assert report["fp16_guard"]["over"] == {} and report["fp16_guard"]["tensors"] > 50
    assert "**pass**" in (result.onnx_path.parent / "step.trt.md").read_text()
    int64_tokens = check_step_graph(onnx.load(str(cell_exports("mlstm").onnx_path)), cell_exports("mlstm").signature,
                                    BATCH)
    # int64 token ids, and the exporter's own softplus forms (a plain ONNX export keeps them: safe_forms is off)
    assert ("int32 indices", "Gather") in [(v.rule, v.op) for v in int64_tokens], int64_tokens
    assert {v.rule for v in int64_tokens} <= {"int32 indices", "safe forms"}, int64_tokens


def test_trtexec_command_names_every_input_with_three_shapes():
    model = build_recipe(load_recipe("xlstm_1_1", ["stack.num_blocks=2", f"dim={DIM}"]))
    sig = build_signature(prepare_model(model, torch.float32))
    command = trt_export.trtexec_command("out/step.onnx", sig, (1, 8, 64))
    assert command.startswith("trtexec --onnx=out/step.onnx --saveEngine=out/step.plan ")
    for flag, b in (("minShapes", 1), ("optShapes", 8), ("maxShapes", 64)):
        (spec,) = re.findall(rf"--{flag}=(\S+)", command)
        shapes = dict(item.rsplit(":", 1) for item in spec.split(","))
        assert list(shapes) == sig.input_names
        assert shapes["token"] == str(b)
        for s in sig.states:
            assert shapes[s.name] == "x".join(map(str, (b, *s.shape)))


@pytest.mark.gpu
def test_tensorrt_builds_and_matches_pytorch(tmp_path, run_cli):
    """Both TensorRT paths, checked over a rollout against PyTorch; runs only where TensorRT and a GPU exist."""
    reason = trt_export.unavailable_reason("torch_tensorrt")
    if reason:
        pytest.skip(f"TensorRT path not runnable here: {reason}")
    code, out, err = run_cli("export", "xlstm_1_1", "--set", "stack.num_blocks=2", "--set", f"dim={DIM}",
                          "--format", "tensorrt", "--out", tmp_path, "--batch", "1,3,5", "--rollout", "100")
    assert code == 0, out + err
    assert "torch-tensorrt: pass" in out and "TensorRT (ONNX parser): pass" in out
    assert (tmp_path / "step.plan").is_file() and (tmp_path / "step.trt.ep").is_file()


# -- the command line -----------------------------------------------------------------------------------

def test_cli_onnx_from_a_checkpoint_end_to_end(tmp_path, run_cli):
    recipe = load_recipe("xlstm_1_1", ["stack.num_blocks=2", f"dim={DIM}"])
    torch.manual_seed(1)
    model = build_recipe(recipe)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01 * torch.randn_like(p))  # weights no fresh build has: the export must carry them
    save_checkpoint(tmp_path / "run" / "checkpoint", recipe, model, step=1)
    out_dir = tmp_path / "onnx"
    code, out, err = run_cli("export", tmp_path / "run", "--format", "onnx", "--out", out_dir,
                          "--batch", "1,2,4", "--rollout", "300", "--threads", "1")
    assert code == 0, out + err
    for text in ("versions: torch 2", "onnx 1.", "onnxruntime 1.", "opset 18", "step.onnx: ", "KiB",
                 "operator histogram", "LayerNormalization", "graph checks", "no state returned unchanged",
                 "TensorRT op check: all", "onnxruntime vs PyTorch", "rollout 300 from zero",
                 "rollout 300 from random", "next.block1.slstm.m", "PASS"):
        assert text in out, f"{text!r} missing from:\n{out}"
    assert "FAIL" not in out
    for b in ("1", "2", "4"):
        assert re.search(rf"step from random\s+│ {b}\s+│ next\.block0\.mlstm\.C", out), b
    assert (out_dir / "step.onnx").is_file() and (out_dir / "step.json").is_file()
    # the ONNX holds the checkpoint's weights
    sig = build_signature(prepare_model(model, torch.float32))
    y, _ = OrtStep(out_dir / "step.onnx", sig)(np.array([3, 4]), [s.numpy() for s in sig.zero_state(2)])
    with torch.no_grad():
        y_ref, _ = model.eval().step(torch.tensor([3, 4]), model.init_state(2))
    np.testing.assert_allclose(y, y_ref.numpy(), rtol=1e-4, atol=1e-5)  # onnxruntime vs PyTorch: export validation's fp32 step bound


def test_cli_tensorrt_without_tensorrt_writes_onnx_and_prints_trtexec(tmp_path, run_cli):
    reason = trt_export.unavailable_reason("torch_tensorrt")
    if reason is None:
        pytest.skip("TensorRT and a GPU are present: test_tensorrt_builds_and_matches_pytorch covers this machine")
    code, out, err = run_cli("export", "xlstm_1_1", "--set", "stack.num_blocks=2", "--set", f"dim={DIM}",
                          "--format", "tensorrt", "--check", "--out", tmp_path, "--batch", "1,2,4", "--rollout", "100",
                          "--deploy-rollout", "20", "--threads", "1")
    assert code == 0, out + err
    assert "Traceback" not in out + err
    lines = out.splitlines()
    (message,) = [ln for ln in lines if ln.startswith("TensorRT: not available here")]
    assert reason in message and str(tmp_path / "step.trt.onnx") in message
    for name in ("step.trt.onnx", "step.trt.fp16.onnx", "step.trt.json", "step.trt.md"):
        assert (tmp_path / name).is_file(), name
    assert any(ln.startswith("fp16 overflow guard:") for ln in lines) and "TensorRT deployment rewrites" in out
    (command,) = [ln for ln in lines if ln.startswith("trtexec ")]
    sig = json.loads((tmp_path / "step.json").read_text())
    inputs = [sig["input"], *sig["states"]]
    for flag, b in (("minShapes", 1), ("optShapes", 2), ("maxShapes", 4)):
        (spec,) = re.findall(rf"--{flag}=(\S+)", command)
        shapes = dict(item.rsplit(":", 1) for item in spec.split(","))
        assert list(shapes) == [i["name"] for i in inputs], flag
        for i in inputs:
            assert shapes[i["name"]] == "x".join(map(str, [b, *i["shape"][1:]])), (flag, i["name"])
    assert (tmp_path / "step.onnx").is_file() and "PASS" in out
    assert not list(tmp_path.glob("*.plan")) and not list(tmp_path.glob("*.ep"))  # no engine was pretended


# -- bad input --------------------------------------------------------------------------------------------

class _PluginConfig(ZooConfig):
    type: Literal["nostep"] = "nostep"


class NoStepCell(Cell):
    """A plugin cell with a sequence form but no step."""

    def __init__(self, config, ctx):
        super().__init__(ctx.dim, ctx.dim)
        self.config = config
        self.proj = torch.nn.Linear(ctx.dim, ctx.dim)

    def init_state(self, batch, device=None):
        return (torch.zeros(batch, self.in_dim),)

    def forward(self, x, state=None, *, value_input=None):
        return self.proj(x), (x[:, -1],)


class _LazyConfig(ZooConfig):
    type: Literal["lazycell"] = "lazycell"


class LazyCell(NoStepCell):
    """A plugin cell whose step hands its state back unchanged (TensorRT rejects that)."""

    def step(self, x_t, state, *, value_input=None):
        return self.proj(x_t), state


class _BranchyConfig(ZooConfig):
    type: Literal["branchy"] = "branchy"


class BranchyCell(NoStepCell):
    """A plugin cell whose step branches on tensor values (an exporter would bake the branch in)."""

    def step(self, x_t, state, *, value_input=None):
        h = state[0]
        if (h == 0).all():  # data-dependent Python branch
            h = h + 1
        h = self.proj(x_t) + h
        return h, (h,)


@pytest.fixture
def plugin_cells():
    names = []
    for name, config, cls in (("nostep", _PluginConfig, NoStepCell), ("lazycell", _LazyConfig, LazyCell),
                              ("branchy", _BranchyConfig, BranchyCell)):
        registry.register(component("cell", name, config=config, description=cls.__doc__)(cls))
        names.append(name)
    try:
        yield
    finally:
        for name in names:
            registry.unregister("cell", name)


def _plugin_lm(cell):
    return {"name": "plugin", "model": {"type": "causal_lm", "vocab_size": 16, "dim": 8, "stack": {
        "type": "xlstm", "pattern": "mp", "blocks": {"m": {"type": "pre_up", "cell": {"type": "mlstm", "num_heads": 2}},
                                                     "p": {"type": "residual", "cell": {"type": cell}}}}}}


def assert_one_line_error(code, out, err, *needles):
    assert code == 2, (code, out, err)
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in out + err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def test_cell_without_step_is_named(plugin_cells, tmp_path, run_cli):
    model = build_recipe(load_recipe(_plugin_lm("nostep")))
    with pytest.raises(ExportError, match=r"cell 'nostep' at stack\.blocks\.1\.cell \(NoStepCell\) has no step\(\)"):
        export_step(model, tmp_path)
    with pytest.raises(ExportError, match=r"cell 'nostep' \(the exported module\)"):
        export_step(model.stack.blocks[1].cell, tmp_path)
    (tmp_path / "plugin.yaml").write_text(json.dumps(_plugin_lm("nostep")))
    assert_one_line_error(*run_cli("export", tmp_path / "plugin.yaml", "--out", tmp_path / "o"), "nostep", "has no step()")


def test_state_returned_unchanged_is_rejected(plugin_cells, tmp_path):
    model = build_recipe(load_recipe(_plugin_lm("lazycell")))
    with pytest.raises(ExportError, match=r"returns state block1\.lazycell\.0 unchanged"):
        export_step(model, tmp_path)


def test_data_dependent_branch_names_the_component_and_line(plugin_cells, tmp_path):
    model = build_recipe(load_recipe(_plugin_lm("branchy")))
    with pytest.raises(ExportError, match=r"export \(dynamo\) failed in 'branchy' \(BranchyCell\)\.step at "
                                          r"test_export\.py:\d+: .*data-dependent"):
        export_step(model, tmp_path, validate=False)
    assert not (tmp_path / "step.onnx").exists()


class RunsCode:
    """Unpickled, it creates ``marker``: the shape of a pickle exploit."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').close()",)


def test_checkpoint_that_does_not_match_its_recipe_or_is_unsafe(tmp_path, run_cli):
    recipe = load_recipe("xlstm_1_1", ["stack.num_blocks=2", f"dim={DIM}"])
    write_model_dir(tmp_path / "model", recipe, build_recipe(recipe))
    write_model_dir(tmp_path / "bad", load_recipe("xlstm_1_1", ["stack.num_blocks=2", "dim=64"]), build_recipe(recipe))
    assert_one_line_error(*run_cli("export", tmp_path / "bad", "--out", tmp_path / "o"), "model.safetensors",
                          "weights do not match")
    assert_one_line_error(*run_cli("export", tmp_path / "model", "--set", "dim=64", "--out", tmp_path / "o"),
                          "--set changes a recipe")
    marker = tmp_path / "code_ran"  # a pickle that would run code is refused before anything in it runs
    torch.save({"format": 1, "x": RunsCode(marker)}, tmp_path / "evil.pt")
    assert_one_line_error(*run_cli("export", tmp_path / "evil.pt", "--out", tmp_path / "o"), "evil.pt",
                          "refused to unpickle")
    assert not marker.exists()
    assert not (tmp_path / "o" / "step.onnx").exists()


def test_usage_errors_are_one_line(tmp_path, run_cli):
    base = ("export", "xlstm_1_1", "--set", "stack.num_blocks=2", "--set", f"dim={DIM}")
    assert_one_line_error(*run_cli(*base, "--format", "pytorch", "--out", tmp_path),
                          "unknown export format 'pytorch'", "onnx, tensorrt")
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    assert_one_line_error(*run_cli(*base, "--out", blocker / "sub"), "is not writable", str(blocker / "sub"))
    assert_one_line_error(*run_cli(*base, "--out", tmp_path, "--batch", "8,2,1"), "MIN <= OPT <= MAX")
    assert_one_line_error(*run_cli(*base, "--out", tmp_path, "--batch", "a,b"), "three integers")
    assert_one_line_error(*run_cli(*base, "--out", tmp_path, "--opset", "13"), "opset 13 is too old")
    assert_one_line_error(*run_cli(*base, "--out", tmp_path, "--dtype", "int8"), "unknown dtype 'int8'")
    assert_one_line_error(*run_cli("export", "no_such_recipe", "--out", tmp_path), "no_such_recipe")
    assert not list(tmp_path.glob("*.onnx"))


def test_python_api_errors_are_config_errors(tmp_path):
    model = build_recipe(load_recipe("xlstm_1_0", ["stack.num_blocks=1", f"dim={DIM}"]))
    (tmp_path / "f").write_text("")
    with pytest.raises(ConfigError, match="not writable"):
        export_step(model, tmp_path / "f" / "out")
    with pytest.raises(ConfigError, match="MIN <= OPT <= MAX"):
        export_step(model, tmp_path, batch=(4, 2, 8))
    assert isinstance(ExportError("x"), xlstm_zoo.ZooError)
    assert named_state(model, model.init_state(1))[0][0] == "block0.mlstm.C"


# -- what a component declares ---------------------------------------------------------------------------

class _UndeclaredState(NamedTuple):
    h: torch.Tensor


class _UndeclaredCell(Cell):
    """A plugin cell whose state class declares no export_sample."""

    def __init__(self, dim=4):
        super().__init__(dim, dim)
        self.proj = torch.nn.Linear(dim, dim)

    def init_state(self, batch, device=None):
        return _UndeclaredState(torch.zeros(batch, self.in_dim))

    def forward(self, x, state=None, *, value_input=None):
        return self.proj(x), _UndeclaredState(x[:, -1])

    def step(self, x_t, state, *, value_input=None):
        return self.proj(x_t), _UndeclaredState(state.h + x_t)


def test_undeclared_state_validates_from_a_reached_state(tmp_path):
    """export_sample is optional (plugin API 2): without it, export warns, naming the class and what to
    declare, and validation starts from the state the step reaches on random inputs."""
    with pytest.warns(ExportWarning, match=r"state class _UndeclaredState .*declares no export_sample.*"
                                           r"reaches on 16 random inputs.*classmethod export_sample\(cls, like, generator\)"):
        result = export_step(_UndeclaredCell(), tmp_path, rollout_steps=20)
    assert result.ok and (tmp_path / "step.onnx").exists()
    assert any("from random" in row.check for row in result.report.rows)
    sig = build_signature(_UndeclaredCell())  # names and zeros need no sample: only validation does
    assert sig.state_names == ["_undeclaredcell.h"] and sig.undeclared()
    with pytest.raises(ExportError, match="declares no export_sample"):  # no step to reach one with
        sig.random_state(2, torch.Generator().manual_seed(0))
    cell = _UndeclaredCell()
    sig.reach_with = StepModule(cell, sig).eval()
    reached = sig.random_state(2, torch.Generator().manual_seed(0))[0]
    gen, expected = torch.Generator().manual_seed(0), torch.zeros(2, 4)
    for _ in range(16):
        expected = expected + torch.randn(2, 4, generator=gen)
    torch.testing.assert_close(reached, expected)


def test_module_without_step_input_is_a_clear_error():
    class Bare(torch.nn.Module):
        def init_state(self, batch, device=None):
            return (torch.zeros(batch, 2),)

        def step(self, x_t, state):
            return x_t, (state[0] + 1,)

    with pytest.raises(ExportError, match=r"Bare .*does not say what its step takes.*step_input"):
        build_signature(Bare())
    assert build_signature(Bare(), input_dim=3).input.shape == (3,)  # or say it in the call


def test_a_batch_range_that_cannot_be_allocated_is_refused_before_writing(tmp_path, run_cli):
    out_dir = tmp_path / "o"
    assert_one_line_error(*run_cli("export", "xlstm_0_1", "--set", f"dim={DIM}", "--batch", "1,2,100000000000",
                                   "--out", out_dir),
                          "batch max 100,000,000,000 cannot be validated here", "GiB free", "give a smaller MAX")
    assert not out_dir.exists(), "nothing written"


def test_a_failed_export_leaves_nothing_unvalidated(tmp_path, monkeypatch):
    (tmp_path / "README.md").write_text("mine")

    def broken(*args, **kwargs):
        raise RuntimeError("onnxruntime crashed")

    monkeypatch.setattr(checks, "validate_step", broken)
    with pytest.raises(RuntimeError, match="onnxruntime crashed"):
        export_step(bare_cell("lstm"), tmp_path, batch=(1, 2, 4), rollout_steps=2, threads=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["README.md"], "no step.onnx, no staging folder"
    monkeypatch.undo()
    result = export_step(bare_cell("lstm"), tmp_path, batch=(1, 2, 4), rollout_steps=2, threads=1)
    assert result.ok and result.onnx_path == tmp_path / "step.onnx" and result.onnx_path.is_file()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == [], "the staging folder is gone"
