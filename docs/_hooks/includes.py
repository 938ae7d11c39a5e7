"""MkDocs hook: text the site shows from elsewhere, kept in one place.

Two markers, each an HTML comment alone on a line (invisible where GitHub renders the page):

- `<!-- readme: top -->` is the README from its title to its first `## ` heading, and
  `<!-- readme: ## The demo -->` is that section of the README, heading excluded, up to
  the next heading of its level. Relative links in them, written for the README at the
  repository's root, are rewritten for the page that includes them, so that the build's
  link validation checks them like the page's own.
- `<!-- command-help: launch -->` is `strategykit launch --help` (`<!-- command-help: -->`
  the command's own), from the parser the command itself uses
  (`strategykit.cli.commands.build_parser`). A page that shows the help of some
  subcommands must show every one: a missing one is a warning, so `mkdocs build --strict`
  fails naming it.

An unknown marker target (a README heading that is gone, a subcommand that does not
exist) is a warning too.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import posixpath
import re
import sys
from pathlib import Path

log = logging.getLogger("mkdocs.hooks.includes")

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
HELP_WIDTH = 78

_README_MARKER = re.compile(r"^<!-- readme: (?P<what>.+?) -->$", re.MULTILINE)
_HELP_MARKER = re.compile(r"^<!-- command-help: ?(?P<command>[\w-]*) -->$", re.MULTILINE)
# A Markdown link or image target that is a relative path: not a URL, not an anchor alone.
_RELATIVE_LINK = re.compile(r"(!?\[[^\]]*\]\()(?![a-z][a-z0-9+.-]*:|#|/)([^)\s]+)(\))")


def on_page_markdown(markdown: str, page, config, files) -> str:
    markdown = _README_MARKER.sub(lambda match: _readme(match["what"], page), markdown)
    if _HELP_MARKER.search(markdown):
        markdown = _command_help(markdown, page)
    return markdown


def _readme(what: str, page) -> str:
    lines = README.read_text(encoding="utf-8").splitlines()
    if what == "top":
        start = next(i for i, line in enumerate(lines) if line.startswith("# ")) + 1
        level = 2
    else:
        heading = what.strip()
        if heading not in lines:
            log.warning("%s: the README has no heading %r (marker <!-- readme: %s -->)",
                        page.file.src_uri, heading, what)
            return ""
        start = lines.index(heading) + 1
        level = len(heading) - len(heading.lstrip("#"))
    end = len(lines)
    in_code = False
    for i in range(start, len(lines)):
        if lines[i].startswith("```"):
            in_code = not in_code
        hashes = len(lines[i]) - len(lines[i].lstrip("#"))
        if not in_code and 0 < hashes <= level and lines[i][hashes:hashes + 1] == " ":
            end = i
            break
    text = "\n".join(lines[start:end]).strip("\n")
    return _RELATIVE_LINK.sub(lambda match: _relink(match, page), text)


def _relink(match: re.Match, page) -> str:
    """A link written relative to the repository's root, made relative to `page`."""
    target = match[2]
    path = posixpath.normpath(target.split("#")[0])
    fragment = target[len(target.split("#")[0]):]
    if path == "docs" or path.startswith("docs/"):
        path = posixpath.relpath(path, "docs")  # a page or file of the site
    elif not (ROOT / "docs" / path).exists():  # docs/notebooks/ holds the notebooks
        # not on the site: left pointing outside docs/, so that validation reports it
        path = posixpath.join("..", path)
    page_dir = posixpath.dirname(page.file.src_uri) or "."
    return match[1] + posixpath.relpath(path, page_dir) + fragment + match[3]


def _command_help(markdown: str, page) -> str:
    parser = _parser()
    subcommands = _subcommands(parser)
    shown = set()

    def replace(match: re.Match) -> str:
        name = match["command"]
        if name and name not in subcommands:
            log.warning("%s: the strategykit command has no subcommand %r; it has %s",
                        page.file.src_uri, name, ", ".join(subcommands))
            return ""
        shown.add(name)
        with _columns(HELP_WIDTH):
            text = (subcommands[name] if name else parser).format_help()
        return "```text\n" + text.rstrip() + "\n```"

    markdown = _HELP_MARKER.sub(replace, markdown)
    for name in subcommands:
        if name not in shown:
            log.warning("%s: `strategykit %s` is not documented: add <!-- command-help: %s -->",
                        page.file.src_uri, name, name)
    return markdown


def _parser() -> argparse.ArgumentParser:
    # The command's parser, imported as the command imports it for `launch`: without the
    # package's __init__, so without TensorFlow (the build stays fast). From this
    # repository, installed or not.
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    import strategykit_console

    strategykit_console.import_package_without_tensorflow()
    from strategykit.cli.commands import build_parser

    return build_parser()


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    # argparse keeps its subparsers only in a private action class.
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


@contextlib.contextmanager
def _columns(width: int):
    """argparse wraps its help to $COLUMNS: a fixed width, whatever the terminal."""
    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(width)
    try:
        yield
    finally:
        if before is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = before
