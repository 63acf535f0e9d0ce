"""``python -m xlstm_zoo ...``: the command line, so ``torchrun -m xlstm_zoo train ...`` works."""

from xlstm_zoo.cli import main

raise SystemExit(main())
