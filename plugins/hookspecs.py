"""The hook specifications: the whole contract between xlstm-zoo and a plugin.

A plugin is a module (or any object) with functions marked ``@hookimpl`` whose names match the
specs below. pluggy hands an implementation only the arguments it names, so a spec may gain
arguments in later versions without breaking plugins written against an earlier one: never
rename or remove an argument, only add. An implementation that names an argument the running
xlstm-zoo does not offer (a plugin written for a newer version) fails to load with a warning
that says which argument is missing.
"""

from __future__ import annotations

import pluggy

PROJECT = "xlstm_zoo"  # the pluggy project name and the entry-point group

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


class ZooHookSpecs:
    @hookspec
    def register_components(self, register):
        """Register components: cells, gates, norms, blocks, stacks, models, backends, tasks, loggers, ...

        Called once per process, when the registry is first used: core first, then every plugin
        in a fixed order (installed distributions sorted by name, then ``XLSTM_ZOO_PLUGINS``
        modules, then ``--plugin`` modules).

        :param register: the registration callback, with two forms::

                register(builder, *, override=False) -> Component | None
                register(kind=..., name=..., config=..., builder=..., description=...,
                         override=False) -> Component | None

            ``builder`` is usually a class decorated with :func:`xlstm_zoo.component` (which
            supplies kind, name, config and description); it is called as ``builder(config,
            ctx)`` (backends and loggers: ``builder(config)``; a logger is a
            :class:`xlstm_zoo.loggers.base.Logger`, named in ``train.report_to``). ``config`` must be a pydantic model with a
            field ``type: Literal[name] = name``; ``description`` one line. A name that core or
            another plugin already registered is an error naming both distributions, unless
            ``override=True`` (then the later registration wins, deliberately).

            Returns the :class:`xlstm_zoo.registry.Component` (registered once the hook
            returns). A registration that is invalid or conflicts does not raise into the
            plugin: it is reported as one warning naming the plugin's distribution and version,
            ``None`` is returned and the plugin's other registrations go on (in strict mode it
            raises :class:`xlstm_zoo.plugins.PluginError`). The registrations of a hook that
            raises are discarded as a whole.
        """

    @hookspec
    def register_commands(self, add_command):
        """Add ``xlstm-zoo`` subcommands; core adds every built-in command through this hook.

        Called right after the same plugin's :meth:`register_components` (a plugin may implement
        either hook or both).

        :param add_command: ``add_command(name, *, help, arguments, run, description=None,
            override=False)``. ``arguments(parser)`` declares the command's arguments on its
            ``argparse`` parser; ``run(args)`` runs it and returns the exit status (``None``
            means 0); a :class:`xlstm_zoo.ZooError` it raises prints as one line with status 2.
            A name already taken is reported like a conflicting component registration.
        """
