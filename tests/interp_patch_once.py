"""The Triton interpreter (``TRITON_INTERPRET=1``) without its repeated language patching: a
test-time speed-up, the same computation.

A kernel launch in the interpreter patches ``triton.language`` (``tl``, ``tl.core``, ``tl.math``,
the tensor class) with interpreted versions for the launch and restores them at its end
(``GridExecutor.__call__``: ``_patch_lang`` ... ``patch_scope.restore()``). Each call of a
``@triton.jit`` helper *inside* the kernel (``InterpretedFunction.__call__``: a device function
call) runs ``_patch_lang`` again: ``inspect.getmembers`` over the language modules and fresh
wrappers set over the launch's own. The helper's module sees the same ``tl`` module objects,
already patched by the launch, so the repeat changes nothing: its builtins are the launch's
wrappers (no longer marked builtin, so not wrapped twice), and the core and tensor attributes it
sets are new closures of the same interpreter functions. That repeat was 10.8 of 29 s of an
interpreted segmented state pass (``test_state_segmented.py::test_one_sequence_matches_oracle_and_serial``,
cProfile, triton 3.6; ``chunk_solve``'s ``_sub_row`` is called 60 times a program).

``install()`` wraps ``triton.runtime.interpreter._patch_lang``: inside a launch, a device
function whose language modules are already patched gets an empty scope instead of the repeat;
any other call (a launch, or a helper seeing a language module not yet patched, such as
``tl.core`` for ``triton.language.standard``'s ``sum``) is patched as before, and (as the
interpreter never restores a device call's patches) its modules count as patched from then on.
``tests/kernels/test_interp_patch_once.py`` checks the bits are the same with and without it.
Installed by tests/conftest.py and tests/cli_forkserver.py when the kernels are interpreted;
never by the package itself.
"""

from __future__ import annotations

import inspect

#: the language-module sets of the launches in progress (innermost last)
_ACTIVE: list[frozenset] = []
#: device-function patches skipped / done since install (what the test reads)
COUNTS = {"skipped": 0, "patched": 0}


def _langs(fn, tl) -> frozenset:
    return frozenset(id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in (tl, tl.core))


def install() -> bool:
    """Wrap the interpreter's ``_patch_lang`` (once); False where Triton or its interpreter's
    ``_patch_lang`` is not there (another Triton layout: nothing is changed)."""
    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return False
    original = getattr(interpreter, "_patch_lang", None)
    if original is None or getattr(original, "_patch_once", False):
        return original is not None
    scope_cls = getattr(interpreter, "_LangPatchScope", None)
    if scope_cls is None:
        return False

    def patch_lang(fn):
        langs = _langs(fn, tl)
        if _ACTIVE and langs <= _ACTIVE[-1]:
            COUNTS["skipped"] += 1
            return scope_cls()  # nothing changed: nothing to restore
        scope = original(fn)
        if _ACTIVE:  # a helper that sees a module the launch did not patch: patched, as before,
            # and (the interpreter never restores a device call's scope) patched to the launch's end
            COUNTS["patched"] += 1
            _ACTIVE[-1] = _ACTIVE[-1] | langs
            return scope
        _ACTIVE.append(langs)  # a launch: its restore ends it
        restore = scope.restore

        def restore_and_pop():
            try:
                restore()
            finally:
                _ACTIVE.pop()

        scope.restore = restore_and_pop
        return scope

    patch_lang._patch_once = True
    patch_lang._original = original
    interpreter._patch_lang = patch_lang
    return True


def uninstall() -> None:
    """Put the interpreter's own ``_patch_lang`` back (a test compares the two)."""
    from triton.runtime import interpreter

    current = interpreter._patch_lang
    if getattr(current, "_patch_once", False):
        interpreter._patch_lang = current._original
