"""Reading what runs logged: records, DataFrames."""

from .frame import dataframe, records

__all__ = ["dataframe", "records"]
