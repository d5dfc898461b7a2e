"""Pluggable admission and eviction policies, and named presets that combine them."""
