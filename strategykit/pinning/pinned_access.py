"""`PinnedAccess`: private upstream code strategykit reads, sets or calls, not replaces.

A `Fix` replaces an upstream attribute. Some gaps need no replacement, only a private
attribute read or set, or a private method called: a strategy's collective key base,
the all-reduce a strategy uses, the coordination service's key-value store, the steps
of a distributed dataset, the inputs of a `tf.data` dataset. Each is a `PinnedAccess`:
the upstream issue, what users lose, and the code it relies on with its fingerprints on
the versions checked (as a `Fix` pins its code). Before each access strategykit asks:

* `require()` where going on without it would train or report differently: on unknown
  code it raises `UnknownUpstreamCode` (the versions, what is affected, what to do);
* `known()` where strategykit can do without it (upstream's own behaviour, e.g. the
  all-reduce described as "unknown").

The fingerprints are compared once per process. `strategykit info` lists each access
with the fixes (`strategykit.upstream.status()`).
"""

from __future__ import annotations

import dataclasses

from strategykit.pinning.fix import UnknownUpstreamCode, differing, refusal

_FOUND: dict = {}  # PinnedAccess -> its differing code, compared once per process


@dataclasses.dataclass(frozen=True, eq=False)
class PinnedAccess:
    """Private upstream code read, set or called, pinned by fingerprint.

    Attributes:
        issue: the upstream issue, as for a `Fix` (e.g. `"tensorflow/tensorflow#67677"`,
            or `"tensorflow/tensorflow (unreported)"`).
        affects: what users lose where the code is unknown, in a few words.
        relies_on: `{"module:Class.attribute": fingerprints}` of the private code read,
            set or called (one string, or a tuple where versions differ).
        refuses: True where unknown code must refuse (`require()`), False where
            strategykit does without the access (`known()`).

    Example:
        >>> name = "strategykit.pinning.fix:differing"
        >>> access = PinnedAccess("example (unreported)", "an example", {name: "0" * 16},
        ...                       refuses=False)
        >>> access.known(), access.state()
        (False, "upstream's own")
    """

    issue: str
    affects: str
    relies_on: dict
    refuses: bool

    def unknown_code(self) -> dict:
        """`{name: what is found}` of the code relied on that differs from every pinned
        fingerprint; empty on code the access was checked on."""
        if self not in _FOUND:
            _FOUND[self] = differing(self.relies_on)
        return _FOUND[self]

    def known(self) -> bool:
        """Whether the installed code is the code pinned."""
        return not self.unknown_code()

    def require(self) -> None:
        """Raises `UnknownUpstreamCode` unless the installed code is the code pinned."""
        if not self.known():
            raise UnknownUpstreamCode(refusal(self.affects, self.issue, self.unknown_code()))

    def state(self) -> str:
        """`"checked"` (the code pinned), else `"refusing"` or `"upstream's own"`, as
        for a `Fix`."""
        if self.known():
            return "checked"
        return "refusing" if self.refuses else "upstream's own"
