"""Griffe extension: a docstring's `Example:` section is read as an `Examples:` section.

strategykit's Google-style docstrings end with `Example:` (as Keras's do); griffe's Google
parser knows only `Examples:` and would render the other as a note whose `>>>` lines are
Markdown text (block quotes). Reading it as `Examples:` renders them as Python console
code, with `# doctest:` flags trimmed. Only a line `Example:` at the docstring's own
indentation (a section title) is read so; the docstrings themselves are unchanged.
"""

from __future__ import annotations

import re

import griffe

_EXAMPLE_TITLE = re.compile(r"^Example:[ \t]*$", re.MULTILINE)


class ExampleSections(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _EXAMPLE_TITLE.sub("Examples:", obj.docstring.value)
