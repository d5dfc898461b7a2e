"""Analysis of sweep results: condensed numbers (``report``, pandas only) and figures (``plot``)."""
