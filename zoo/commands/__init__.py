"""Every built-in ``xlstm-zoo`` subcommand, one module per group, each listing its ``COMMANDS``.

The core plugin (:mod:`xlstm_zoo.core_plugin`) registers them through the ``register_commands``
hook, the one a third-party plugin uses for its own commands; :mod:`xlstm_zoo.cli` builds the
parser from what was registered. Tables print through :mod:`.output` (never cut when piped).
"""
