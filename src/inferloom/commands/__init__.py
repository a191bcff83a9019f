"""The CLI's commands, one module per command (``inferloom.commands.<command>``).

Each module has ``run(args, console, err) -> int``: ``args`` the parsed
command line, ``console`` / ``err`` rich consoles on stdout / stderr, the
return value the exit code. :mod:`inferloom.cli` parses the command line and
imports only the module of the command it names (its ``COMMANDS`` table), so
``inferloom --help`` or ``inferloom validate`` does not import the session
machinery (numpy, scipy, SQLAlchemy, the phases). Nothing but ``cli`` imports
these modules; :mod:`inferloom.commands.common` holds what several share.
"""

__all__: list[str] = []
