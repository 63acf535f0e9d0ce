"""What every model around a stack shares: the state it carries is the stack's, block by block."""

from __future__ import annotations

from torch import nn


class StackModel(nn.Module):
    """Base of the models that put an input layer and a head around ``self.stack``."""

    step_output = "logits"  # for export: the step's output is named logits

    @property
    def state_blocks(self) -> nn.ModuleList:
        """For export's state names: the stack's blocks, which the state tuple follows."""
        return getattr(self.stack, "state_blocks", None)

    def init_state(self, batch: int, device=None) -> tuple:
        return self.stack.init_state(batch, device or next(self.parameters()).device)
