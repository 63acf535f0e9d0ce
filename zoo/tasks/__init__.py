"""Tasks: what models train on (formal languages, retrieval, byte-level language modelling).

:mod:`xlstm_zoo.tasks.base` holds the contract (:class:`Task`, :class:`Batch`, :data:`IGNORE`);
every concrete task is a registered component of kind ``task``.
"""

from xlstm_zoo.tasks.base import IGNORE, SPLITS, Batch, Task, check_split, merge_scores
from xlstm_zoo.tasks.formal import FormalConfig, FormalTask
from xlstm_zoo.tasks.formal_cf import (ModArithBrackets, ModArithBracketsConfig, SolveEquation,
                                       SolveEquationConfig)
from xlstm_zoo.tasks.formal_cs import BucketSort, BucketSortConfig, MissingDuplicate, MissingDuplicateConfig
from xlstm_zoo.tasks.formal_regular import (CycleNav, CycleNavConfig, EvenPairs, EvenPairsConfig, Majority,
                                            MajorityConfig, MajorityCount, MajorityCountConfig, ModArithNoBrackets,
                                            ModArithNoBracketsConfig, Parity, ParityConfig)
from xlstm_zoo.tasks.retrieval import MQAR, MQARConfig, NNSearch, NNSearchConfig
from xlstm_zoo.tasks.synthetic import SyntheticConfig, SyntheticTask
from xlstm_zoo.tasks.text import ByteLM, ByteLMConfig

__all__ = [
    "IGNORE", "SPLITS", "Batch", "Task", "check_split", "merge_scores",
    "FormalConfig", "FormalTask", "SyntheticConfig", "SyntheticTask",
    "Parity", "ParityConfig", "EvenPairs", "EvenPairsConfig", "CycleNav", "CycleNavConfig",
    "Majority", "MajorityConfig", "MajorityCount", "MajorityCountConfig",
    "ModArithNoBrackets", "ModArithNoBracketsConfig", "ModArithBrackets", "ModArithBracketsConfig",
    "SolveEquation", "SolveEquationConfig", "BucketSort", "BucketSortConfig",
    "MissingDuplicate", "MissingDuplicateConfig", "MQAR", "MQARConfig", "NNSearch", "NNSearchConfig",
    "ByteLM", "ByteLMConfig",
]
