"""``python -m xlstm_zoo ...``: the command line, so ``torchrun -m xlstm_zoo train ...`` works."""

from xlstm_zoo.cli import main

if __name__ == "__main__":  # importing the module (e.g. to check the wheel) runs nothing
    raise SystemExit(main())
