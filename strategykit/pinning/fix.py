"""`Fix`: one replaced upstream attribute, pinned to the upstream code it relies on.

Before a fix replaces anything it compares the fingerprints of the private upstream code
it relies on with those pinned on the versions it was checked on
(`strategykit.pinning.versions`). On code it knows it installs its replacement. On code
it does not know (a newer Keras, a patched TensorFlow) it does not guess: it installs a
guard instead, which hands over to upstream's own code everywhere except where the fix
was needed (`refuses_when`), and there raises `UnknownUpstreamCode`, which names the
installed versions, the versions checked, what is affected and what to do. Training
never goes on differently in silence.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable

import keras
import tensorflow as tf

from strategykit.pinning import versions

CHECKED_ON = versions.describe_checked_on()


class UnknownUpstreamCode(RuntimeError):
    """A strategykit fix met Keras or TensorFlow code it was not checked on, where it is
    needed: the feature refuses rather than train differently."""


@dataclasses.dataclass(frozen=True, eq=False)
class Fix:
    """One upstream fix: `owner.attribute` replaced by `replacement`.

    Attributes:
        issue: the upstream issue, e.g. `"keras-team/keras#20582"`, or where none was
            found the release that fixed it upstream, e.g. `"keras-team/keras@3.12.0"`,
            or where upstream neither reported nor fixed it `"keras-team/keras
            (unreported)"`.
        affects: what users lose where the fix cannot be installed, in a few words, e.g.
            `"gradient_accumulation_steps under a tf.distribute strategy"`.
        owner: `"module:Class"` whose attribute is replaced, or `"module"` for a
            function of a module (looked up by the module's own code at each call).
        attribute: the name of the replaced attribute.
        replacement: the new attribute; it calls `original(owner_class, attribute)`
            where the fix does not apply.
        relies_on: `{"module:Class.attribute": fingerprints}` of the private upstream
            code the fix reads or calls, one fingerprint (a string) or several (a tuple:
            the code differs between the versions checked); `fingerprint(name)` must
            give one of them.
        refuses_when: called with the replaced attribute's arguments where the fix
            cannot be installed: True where upstream's own code would give other
            results than the fix (an `UnknownUpstreamCode` is raised there). None:
            upstream's own code is right everywhere, only slower.
        fixed_upstream: `{"module:Class.attribute": fingerprints}` of upstream code that
            does what the fix does (a Keras release with the issue fixed): where all
            match, the fix is not needed and installs nothing. Empty: needed on every
            version.
        package: the optional package (`"keras_hub"`) the owner belongs to, which
            strategykit does not import: until the program imports it the fix waits
            (`"on import"`; `strategykit.upstream.install` installs it right after the
            import), and where it is not installed there is nothing to fix (`"no
            package"`). None: TensorFlow's or Keras's code, always there.
        guard: for an attribute a function cannot stand for (a property): called with
            the fix, it returns the attribute installed where the code is unknown,
            upstream's own behaviour except where the fix is needed, where it raises
            `UnknownUpstreamCode(fix.refusal())`. None: where `refuses_when` is given,
            a function guard made of it.
    """

    issue: str
    affects: str
    owner: str
    attribute: str
    replacement: object
    relies_on: dict
    refuses_when: Callable[..., bool] | None = None
    fixed_upstream: dict = dataclasses.field(default_factory=dict)
    guard: Callable[[Fix], object] | None = None
    package: str | None = None

    def imported(self) -> bool:
        """Whether the owner's package is imported (always, without `package`)."""
        return self.package is None or self.package in sys.modules

    def absent(self) -> bool:
        """Whether the owner's optional `package` is not installed at all."""
        return self.package is not None and importlib.util.find_spec(self.package) is None

    def owner_class(self):
        """The class (or module) whose attribute is replaced."""
        return resolve(self.owner)

    def unknown_code(self) -> dict:
        """`{name: what is found}` of the code relied on that differs from every pinned
        fingerprint (`"missing"` where it is gone); empty on code the fix knows, and
        where the fix is not needed or its optional package is not installed."""
        return {} if self.absent() or self.not_needed() else differing(self.relies_on)

    def not_needed(self) -> bool:
        """Whether upstream's code does what the fix does (`fixed_upstream`)."""
        return bool(self.fixed_upstream) and not differing(self.fixed_upstream)

    def installed(self) -> bool:
        """Whether the replacement is in place (not the guard, not upstream's own)."""
        return self.imported() and (
            self.owner_class().__dict__.get(self.attribute) is self.replacement)

    def guarded(self) -> bool:
        """Whether the guard of `refuses_when` is in place: the code was unknown."""
        guard = _GUARDS.get(self)
        return guard is not None and self.imported() and (
            self.owner_class().__dict__.get(self.attribute) is guard)

    def state(self) -> str:
        """`"installed"`, `"not needed"` (fixed upstream in this version), `"refusing"`
        (unknown upstream code: the guard is in place), `"upstream's own"` (unknown
        code, where upstream's own is right), `"not installed"`, or for an optional
        package's code `"no package"` (not installed) or `"on import"` (the package
        not imported yet)."""
        if self.absent():
            return "no package"
        if not self.imported():
            return "on import"
        if self.installed():
            return "installed"
        if self.not_needed():
            return "not needed"
        if self.guarded():
            return "refusing"
        if self in _UNKNOWN:
            return "upstream's own"
        return "not installed"

    def install(self) -> bool:
        """Installs the replacement, or where the code is unknown the guard; idempotent.

        Returns:
            True where the replacement is in place or not needed, or where the fix's
            optional package is not imported (nothing to fix yet).
        """
        if not self.imported():
            return True
        if self.installed() or self.guarded():
            return self.installed()
        if self.not_needed():
            return True
        unknown = self.unknown_code()
        if not unknown:
            self._replace_with(self.replacement)
            return True
        _UNKNOWN[self] = unknown
        if self.refuses_when is not None or self.guard is not None:
            self._replace_with(_GUARDS.setdefault(self, _guard(self)))
        return False

    def _replace_with(self, replacement) -> None:
        owner = self.owner_class()
        _ORIGINALS.setdefault((owner, self.attribute), owner.__dict__.get(self.attribute))
        setattr(owner, self.attribute, replacement)

    def uninstall(self) -> None:
        """Puts upstream's own attribute back (replacement or guard); idempotent."""
        _UNKNOWN.pop(self, None)
        if not (self.installed() or self.guarded()):
            return
        owner = self.owner_class()
        original = _ORIGINALS.pop((owner, self.attribute))
        if original is None:
            delattr(owner, self.attribute)
        else:
            setattr(owner, self.attribute, original)

    def refusal(self) -> str:
        """The message of the `UnknownUpstreamCode` this fix raises where it refuses."""
        return refusal(self.affects, self.issue, _UNKNOWN.get(self) or self.unknown_code())


_ORIGINALS: dict = {}
_GUARDS: dict = {}  # Fix -> its guard function, made once
_UNKNOWN: dict = {}  # Fix -> its unknown_code() when it was last installed
_NEWEST = versions.CHECKED_ON[-1]


def refusal(affects: str, issue: str, unknown: dict) -> str:
    """The message of an `UnknownUpstreamCode`: `affects` refuses because the code the
    fix of `issue` relies on differs (`unknown`) from the versions checked."""
    return (
        f"strategykit cannot make {affects} work on TensorFlow {tf.__version__} + "
        f"Keras {keras.__version__}: its fix for {issue} relies on private upstream "
        f"code that differs from the versions it was checked on ({CHECKED_ON}): "
        f"{', '.join(sorted(unknown))}. Rather than train differently, it refuses. "
        f"Install a checked pair (e.g. pip install \"keras=={_NEWEST[1]}\" "
        f"\"tensorflow=={_NEWEST[0]}\"), a strategykit release that supports this one, "
        f"or train without {affects}."
    )


def differing(pins: dict) -> dict:
    """`{name: fingerprint found}` of the names in `pins` whose code has none of their
    pinned fingerprints (`"missing (...)"` where the code is gone)."""
    found_differing = {}
    for name, pinned in pins.items():
        try:
            found = fingerprint(name)
        except (ImportError, AttributeError, TypeError, OSError) as error:
            found = f"missing ({type(error).__name__})"
        if found not in ((pinned,) if isinstance(pinned, str) else pinned):
            found_differing[name] = found
    return found_differing


def _guard(fix: Fix):
    """The attribute installed where `fix`'s code is unknown: upstream's own, except where
    `fix.refuses_when` says the fix is needed."""
    if fix.guard is not None:
        return fix.guard(fix)
    original_attribute = fix.owner_class().__dict__.get(fix.attribute)
    if isinstance(original_attribute, (staticmethod, classmethod, property)):
        raise TypeError(f"{fix.owner}.{fix.attribute}: a guard replaces functions only")

    @functools.wraps(fix.replacement)
    def guard(*args, **kwargs):
        if fix.refuses_when(*args, **kwargs):
            raise UnknownUpstreamCode(fix.refusal())
        return original(fix.owner_class(), fix.attribute)(*args, **kwargs)

    return guard


def resolve(name: str):
    """The object `"package.module:Class.attribute"` names (attribute path optional)."""
    module, _, path = name.partition(":")
    target = importlib.import_module(module)
    for part in filter(None, path.split(".")):
        target = inspect.getattr_static(target, part) if inspect.isclass(target) else getattr(
            target, part)
    return target.fget if isinstance(target, property) else target


def by_fingerprint(name: str, choices: dict):
    """What a fix does on the installed code of `name`: `choices[fingerprint(name)]`.

    For upstream code that differs between the versions a fix was checked on; pin the
    same fingerprints in `relies_on` (`tuple(choices)`), so that unknown code never
    gets here. Read once per process.

    Example:
        >>> name = "strategykit.pinning.fix:by_fingerprint"
        >>> by_fingerprint(name, {fingerprint(name): "this version"})
        'this version'
    """
    return choices[_fingerprint_once(name)]


@functools.cache
def _fingerprint_once(name: str) -> str:
    return fingerprint(name)


def fingerprint(name: str) -> str:
    """The first 16 hex digits of the SHA-256 of the upstream source code `name` names.

    A name that a fix replaced (or guards) is fingerprinted as upstream wrote it.
    """
    module, _, path = name.partition(":")
    owner_name, _, attribute = f"{module}:{path}".rpartition(".") if "." in path else (
        module, None, path)
    code, owner = resolve(name), resolve(owner_name)
    if (owner, attribute) in _ORIGINALS and code is vars(owner).get(attribute):
        code = original(owner, attribute)
    return hashlib.sha256(inspect.getsource(code).encode()).hexdigest()[:16]


def original(owner: type, attribute: str):
    """The attribute `owner` inherits or had before a fix replaced it (for the fixes)."""
    if (owner, attribute) in _ORIGINALS and _ORIGINALS[(owner, attribute)] is not None:
        return _ORIGINALS[(owner, attribute)]
    return getattr(super(owner, owner), attribute)
