"""The cache: the hybrid radix tree (``tree``) and block re-gridding of symbols (``blocks``)."""
