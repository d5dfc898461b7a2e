"""Experiments: sweep grids (``grid``), their runners on local processes or Ray (``runners``) and
the parquet results folder (``store``)."""
