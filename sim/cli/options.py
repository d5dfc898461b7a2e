"""Click options generated from settings dataclasses (SimConfig's groups, ReplaySettings): a field's
default, help, choices, flag and value type are written once, on the field (``sim.config.setting``,
``policies.base.knob``); a command lists which fields it offers and, where it means a knob
differently (`replay`'s model preset), what it states of its own."""

from __future__ import annotations

from typing import Callable

import click

from sim.config import flag_of

#: every command's --progress/--no-progress (a bar on stderr: stdout stays the results alone)
PROGRESS_HELP = "A progress bar on stderr."


def format_option(help: str, choices: tuple = ("table", "json")) -> Callable:
    """``--format`` (into ``fmt``) of a command that prints a table by default: its ``choices``,
    and ``help`` saying what each gives."""
    return click.option(
        "--format", "fmt", type=click.Choice(list(choices)), default="table", show_default=True, help=help
    )


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
        kind = _Spelled(meta["spelling"], meta.get("unknown")) if meta.get("spelling") else click.Choice
        kw["type"] = kind(list(meta["choices"]), case_sensitive=False)  # `--gpu H200` is h200
    elif meta.get("type") is not None:
        kw["type"] = meta["type"]
    elif type(default) in (int, float):
        kw["type"] = type(default)
    if default is not None:
        kw["show_default"] = True
    return click.option(flag_of(f), form.get("name", f.name), **kw)


def _Spelled(spelling: Callable[[str], str], unknown: Callable[[str], str] | None = None) -> type:
    """A ``click.Choice`` that reads another spelling of a choice as it (``--gpu "H100 SXM"``);
    ``unknown``: the message refusing a value of no choice (``--gpu h800``: the close entries and
    the catalogue, ``sim.gpus.unknown_gpu``), click's list of choices without it."""

    class Spelled(click.Choice):
        def convert(self, value, param, ctx):
            spelled = spelling(value) if isinstance(value, str) else value
            if unknown is not None and isinstance(value, str) and spelled not in self.choices:
                self.fail(unknown(value), param, ctx)
            return super().convert(spelled, param, ctx)

    return Spelled


def with_options(fn, options: list[Callable]):
    """``fn`` decorated with ``options``, listed in that order (click lists them in decoration order)."""
    for opt in reversed(options):
        fn = opt(fn)
    return fn


def with_fields(fn, fields_: list, lead: bool = False):
    """``fn`` with the options of settings fields ``fields_``, in their order."""
    return with_options(fn, [option(f, lead=lead) for f in fields_])


# ------------------------------------------------------------------------------ options given twice


def refuse_repeated_options(group: click.Group) -> None:
    """Every command under ``group`` (nested groups too) refuses an option that takes one value
    given more than once (``--capacity 5GB --capacity 10GB``: click keeps the last one silently),
    in one line naming it, and a switch given with both its spellings (``--progress
    --no-progress``); options that take several (``multiple``) and counters stay repeatable."""
    for cmd in group.commands.values():
        _refuse_repeats(cmd)
        if isinstance(cmd, click.Group):
            refuse_repeated_options(cmd)


def _refuse_repeats(cmd: click.Command) -> None:
    make_parser = cmd.make_parser

    def make_checked_parser(ctx: click.Context):
        parser = make_parser(ctx)
        parse = parser.parse_args

        def parse_args(args):
            given = list(args)  # the parser consumes its list
            opts, rest, order = parse(args=args)
            if not ctx.resilient_parsing:  # shell completion parses half-typed lines: no errors there
                _once(ctx, order, given)
            return opts, rest, order

        parser.parse_args = parse_args
        return parser

    cmd.make_parser = make_checked_parser


def _once(ctx: click.Context, order: list, given: list[str]) -> None:
    """Raises click's usage error for the first single-value option met twice in ``order`` (the
    parameters in the order the parser met them, once per occurrence). A switch repeated in one
    spelling (``--no-progress --no-progress``) says one thing and passes; with its other spelling
    (``--progress --no-progress``) it is refused."""
    counts: dict[int, int] = {}
    for param in order:
        counts[id(param)] = counts.get(id(param), 0) + 1
    for param in dict.fromkeys(order):
        times = counts[id(param)]
        if times < 2 or not isinstance(param, click.Option) or param.multiple or param.count or param.is_eager:
            continue
        spellings = [*param.opts, *param.secondary_opts]
        used = _occurrences(param, spellings, given)
        if param.is_flag and len(used) == times and len(set(used)) == 1:
            continue
        name = "/".join(o for o in spellings if o.startswith("--")) or "/".join(spellings)
        what = f" ({', '.join(used)})" if len(used) == times else ""
        kind = "it is one switch" if param.is_flag else "it takes one value"
        raise click.BadOptionUsage(spellings[0], f"{name} is given {times} times{what}: {kind}, give it once", ctx)


def _occurrences(param: click.Option, spellings: list[str], given: list[str]) -> list[str]:
    """What the user wrote for ``param`` in ``given``, each occurrence as one word (`--capacity
    5GB`, `--no-progress`); an approximate reading, used only when it finds every occurrence."""
    found, i = [], 0
    while i < len(given):
        word = given[i]
        if word == "--":
            break
        flag, eq, value = word.partition("=")
        if flag in spellings:
            if param.is_flag:
                found.append(flag)
            elif eq:
                found.append(f"{flag} {value}")
            elif i + 1 < len(given):
                found.append(f"{flag} {given[i + 1]}")
                i += 1
        i += 1
    return found
