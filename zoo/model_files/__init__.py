"""What a model directory holds besides its weights, written and checked without importing transformers:
``config.json`` with the recipe and the ``trust_remote_code`` module (:mod:`.files`), the README.md model card
(:mod:`.card`). Both ``save_pretrained`` (:mod:`xlstm_zoo.pretrained`) and the trainer's checkpoints write them;
:mod:`xlstm_zoo.interop` reads them for transformers."""
