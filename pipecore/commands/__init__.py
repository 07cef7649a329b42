"""The subcommands of ``pipecore`` (:mod:`pipecore.cli` holds their table):
each module adds a group's arguments and runs it, a pair of functions per
subcommand."""
