"""Tasks: what models are trained and evaluated on. See :mod:`xlstm_zoo.tasks.base` for the contract."""
