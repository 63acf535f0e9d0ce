"""Early stopping on a validation metric (``train.early_stop``): the rule, apart from the loop."""

from __future__ import annotations

from xlstm_zoo.errors import ConfigError


class EarlyStopper:
    """Fed each periodic evaluation; says when ``rule.metric`` on ``rule.split`` has met the rule's
    level (at least ``at_least`` or at most ``at_most``) for ``rule.evals`` evaluations in a row.
    ``rule=None`` never stops."""

    def __init__(self, rule):
        self.rule, self.streak = rule, 0

    def reached(self, scores: dict[str, dict[str, float]]) -> bool:
        if self.rule is None:
            return False
        metrics = scores[self.rule.split]
        if self.rule.metric not in metrics:
            raise ConfigError(f"early_stop.metric {self.rule.metric!r} is not a metric of this task; "
                              f"it reports {', '.join(sorted(metrics))}", path="train.early_stop.metric")
        self.streak = self.streak + 1 if self.rule.met(metrics[self.rule.metric]) else 0
        return self.streak >= self.rule.evals
