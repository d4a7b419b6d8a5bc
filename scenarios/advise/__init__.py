"""``ddlsim advise`` and ``ddlsim run --prune``: search a sweep by simulation and successive
halving of its replays, and recommend one configuration with the reason (docs/advise.md).

:mod:`.search` runs the search, :mod:`.model` holds the facts it reasons with,
:mod:`.explain` says in words why one configuration beats another and :mod:`.render` writes
the table and the recommendation. The command line's part is :mod:`ddlsim.scenarios.cli.advise`.
"""
