"""ddlsim: predict the accuracy/runtime tradeoff of distributed deep-learning training.

Sub-packages: ``simulator`` (SimPy cluster model, writes traces), ``backends``
(execute traces with PyTorch), ``scenarios`` (schema, sweeps, CLI) and
``analysis`` (tables, plots, report).
"""

__version__ = "0.1.0"
