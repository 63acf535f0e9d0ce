"""What got in a new user's way: each fixed, each checked here."""

import pytest
import torch
from torch import nn

import xlstm_zoo
from xlstm_zoo import testing
from xlstm_zoo.errors import ConfigError
from xlstm_zoo.tolerances import assert_close


def test_set_task_on_a_recipe_without_a_task_creates_the_section():
    recipe = xlstm_zoo.load_recipe("xlstm_1_1", ["task.type=parity"])
    assert recipe.task is not None and recipe.task.type == "parity"
    assert xlstm_zoo.load_recipe("xlstm_1_1").task is None


def test_set_task_on_a_recipe_without_a_task_from_the_command_line(run_cli, tmp_path):
    code, out, err = run_cli("build", "xlstm_1_1", "--set", "task.type=parity", "--set", "stack.num_blocks=2", "--dump")
    assert code == 0, err
    assert "type: parity" in out


@pytest.mark.parametrize("recipe", ["xlstm_1_1", "lstm"])
def test_step_with_no_state_means_the_zero_state(recipe):
    model = xlstm_zoo.build(xlstm_zoo.load_recipe(recipe, ["stack.num_blocks=2", "dim=32"])).eval()
    token = torch.tensor([1, 2])
    with torch.no_grad():
        from_none, _ = model.step(token, None)
        from_zero, _ = model.step(token, model.init_state(2))
        from_forward, _ = model(token[:, None], None)
    torch.testing.assert_close(from_none, from_zero)
    assert_close(from_none, from_forward[:, 0], kind="form", what="step from None vs forward's first token")


def test_empty_recipe_file_is_a_one_line_error(tmp_path):
    path = tmp_path / "empty.yaml"
    path.write_text("# nothing here\n")
    with pytest.raises(ConfigError) as err:
        xlstm_zoo.load_recipe(path)
    message = str(err.value)
    assert "empty" in message and str(path) in message and "\n" not in message, message


def test_duplicated_yaml_key_is_a_one_line_error(tmp_path):
    path = tmp_path / "twice.yaml"
    path.write_text("extends: xlstm_1_1\nmodel:\n  dim: 64\n  dim: 128\n")
    with pytest.raises(ConfigError) as err:
        xlstm_zoo.load_recipe(path)
    message = str(err.value)
    assert "duplicated key 'dim'" in message and f"{path}:4" in message and "\n" not in message, message


def test_piped_tables_are_never_cut(run_cli, monkeypatch):
    from xlstm_zoo import cli

    monkeypatch.setattr(cli.console, "width", 40)  # narrower than any table: piped output still holds every name
    for argv, needles in ((["list", "backend"], ["reference", "ground truth for every other backend"]),
                          (["plugins"], ["xlstm-zoo", "cell:mlstm"]),
                          (["doctor"], ["mlstm.chunkwise--triton", "slstm.sequence--reference"])):
        code, out, err = run_cli(*argv)
        assert code == 0, err
        for needle in needles:
            assert needle in out, (argv, needle, out)
        assert "…" not in out, out


class _Float32Cell(nn.Module):
    """A GRU-like cell that computes in float32 with .float(): wrong for float64 gradcheck."""

    def __init__(self, dim=8):
        super().__init__()
        self.in_dim = self.out_dim = dim
        self.proj = nn.Linear(dim, dim)

    def init_state(self, batch, device=None):
        return _State(torch.zeros(batch, self.out_dim, device=device))

    def forward(self, x, state=None, *, value_input=None):
        state = state if state is not None else self.init_state(x.shape[0], x.device)
        ys, h = [], state.h
        for t in range(x.shape[1]):
            y, (h,) = self.step(x[:, t], _State(h), value_input=None if value_input is None else value_input[:, t])
            ys.append(y)
        return torch.stack(ys, 1), _State(h)

    def step(self, x_t, state, *, value_input=None):
        h = 0.5 * state.h.float() + torch.tanh(self.proj(x_t).float())
        return h.to(x_t.dtype), _State(h)


class _State(tuple):
    _fields = ("h",)

    def __new__(cls, h):
        return super().__new__(cls, (h,))

    @property
    def h(self):
        return self[0]


xlstm_zoo.component("cell", "hidden_gru", config=type("HiddenGRUConfig", (), {}), description="test")(_Float32Cell)


def test_gradcheck_failure_names_the_component_and_the_fix():
    with pytest.raises(testing.ConformanceError) as err:
        testing.check_cell_gradcheck(_Float32Cell())
    message = str(err.value)
    assert message.startswith("cell 'hidden_gru': float64 gradcheck"), message
    assert "promote_types(x.dtype, torch.float32)" in message[:300], message  # before the plugin check cuts it
    assert "bound method" not in message
