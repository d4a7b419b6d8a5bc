"""The ``ddlsim`` command line (``ddlsim`` and ``python -m ddlsim`` run :func:`main`).

One module a command group, each with its ``register`` (its part of the parser) and its
``cmd_…`` functions: :mod:`.sweep` (simulate, run), :mod:`.info` (scenarios, hardware,
trace), :mod:`.figures` (plot, report), :mod:`.calibrate`, :mod:`.validate`, :mod:`.replay`,
:mod:`.advise`; :mod:`.entry` builds the parser and turns every user error into one line
and exit status 2. They share :mod:`.common` (scenario options, output folders),
:mod:`.cost` (the size limits checked before any work) and :mod:`.table` (the printed table).
A command imports torch, matplotlib, numba or SimPy only inside the function that needs
them, so that the command line starts, and refuses bad input, without loading them.
"""

from .entry import main

__all__ = ["main"]
