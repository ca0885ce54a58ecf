"""Looking at what runs logged: records and DataFrames, run reports, comparisons over seeds,
plots, regex metrics from printed output, and TensorBoard events.

matplotlib (the ``plot`` extra) and pandas (the ``pandas`` extra) are imported only by the functions
that need them.
"""

from .compare import compare
from .frame import dataframe, records
from .metrics import load_definitions
from .plots import plot_comparison, plot_metrics
from .show import run_report

__all__ = ["compare", "dataframe", "load_definitions", "plot_comparison", "plot_metrics", "records", "run_report"]
