"""Click options generated from settings dataclasses (SimConfig's groups, ReplaySettings): a field's
default, help, choices, flag and value type are written once, on the field (``sim.config.setting``,
``policies.base.knob``); a command lists which fields it offers and, where it means a knob
differently (`replay`'s model preset), what it states of its own."""

from __future__ import annotations

from typing import Callable

import click

from sim.config import flag_of


def option(f, *, lead: bool = False, **override) -> Callable:
    """The click option of settings field ``f``. ``lead``: the form of `run`'s first options
    (``setting(lead=...)``: another parameter name, a default given as text). ``override``:
    ``help`` / ``default`` a command states of its own (None leaves the option without one)."""
    meta = f.metadata
    form = meta.get("lead", {}) if lead else {}
    default = override.get("default", form.get("default", f.default))
    kw: dict = {"default": default}
    help_ = override.get("help", meta.get("help"))
    if help_:
        kw["help"] = help_
    if meta.get("choices"):
        kind = _Spelled(meta["spelling"]) if meta.get("spelling") else click.Choice
        kw["type"] = kind(list(meta["choices"]), case_sensitive=False)  # `--gpu H200` is h200
    elif meta.get("type") is not None:
        kw["type"] = meta["type"]
    elif type(default) in (int, float):
        kw["type"] = type(default)
    if default is not None:
        kw["show_default"] = True
    return click.option(flag_of(f), form.get("name", f.name), **kw)


def _Spelled(spelling: Callable[[str], str]) -> type:
    """A ``click.Choice`` that reads another spelling of a choice as it (``--gpu "H100 SXM"``)."""

    class Spelled(click.Choice):
        def convert(self, value, param, ctx):
            return super().convert(spelling(value) if isinstance(value, str) else value, param, ctx)

    return Spelled


def with_options(fn, options: list[Callable]):
    """``fn`` decorated with ``options``, listed in that order (click lists them in decoration order)."""
    for opt in reversed(options):
        fn = opt(fn)
    return fn


def with_fields(fn, fields_: list, lead: bool = False):
    """``fn`` with the options of settings fields ``fields_``, in their order."""
    return with_options(fn, [option(f, lead=lead) for f in fields_])
