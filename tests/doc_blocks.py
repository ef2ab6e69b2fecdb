"""The fenced code blocks of a Markdown document, for the tests that run the docs.

tests/test_readme.py runs the README's Python blocks and tests/test_getting_started.py
builds the getting-started guide's project from its blocks. A block keeps the line it
starts on, so a failure points into the document (``compile_block``).
"""

from __future__ import annotations

import inspect
import re
import shlex
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

_FENCE = re.compile(r"^```([\w+-]*)[^\n]*\n(.*?)^```[ \t]*$", re.S | re.M)


@dataclass(frozen=True)
class CodeBlock:
    lang: str
    code: str
    #: The document's line number of the block's first line of code (1-based).
    line: int

    @property
    def first_line(self) -> str:
        return self.code.split("\n", 1)[0].strip()


def code_blocks(
    path: Path, lang: str | None = None, *, under: str | None = None
) -> list[CodeBlock]:
    """The fenced blocks of ``path`` in order: only those of ``lang`` when given, and only
    those in the section of the heading ``under`` (a whole heading line, ``## Title``)."""
    text = path.read_text()
    fences = list(_FENCE.finditer(text))
    start, end = 0, len(text)
    if under is not None:
        level = len(under) - len(under.lstrip("#"))
        headings = [
            h
            for h in re.finditer(r"^(#+) .*$", text, re.M)
            if not any(f.start() <= h.start() < f.end() for f in fences)
        ]
        found = [h for h in headings if h.group(0).rstrip() == under]
        assert len(found) == 1, f"{path.name} has {len(found)} headings {under!r}"
        start = found[0].end()
        end = next(
            (h.start() for h in headings if h.start() > start and len(h.group(1)) <= level), end
        )
    blocks = [
        CodeBlock(m.group(1), m.group(2), text.count("\n", 0, m.start(2)) + 1)
        for m in fences
        if start <= m.start() < end
    ]
    return [b for b in blocks if lang is None or b.lang == lang]


def compile_block(block: CodeBlock, path: Path) -> Any:
    """The block compiled so that tracebacks name the document and its line numbers."""
    return compile("\n" * (block.line - 1) + block.code, str(path), "exec")


def exec_blocks(blocks: list[CodeBlock], path: Path, namespace: dict[str, Any]) -> None:
    """Runs the blocks one after another in one namespace, as one module would."""
    for block in blocks:
        exec(compile_block(block, path), namespace)


def async_tests(namespace: dict[str, Any]) -> list[Callable[[], Awaitable[None]]]:
    """The ``async def test_*`` functions the blocks defined, in definition order."""
    return [
        fn
        for name, fn in namespace.items()
        if name.startswith("test_") and inspect.iscoroutinefunction(fn)
    ]


def shell_commands(block: CodeBlock) -> list[list[str]]:
    """The commands of a shell block: each line (joined across ``\\``), split on
    ``&&``, ``;`` and ``|``, without comments, environment assignments or prompts."""
    commands: list[list[str]] = []
    text = block.code.replace("\\\n", " ")
    for line in text.splitlines():
        try:
            lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
            lexer.whitespace_split = True
            lexer.commenters = "#"
            tokens = list(lexer)
        except ValueError as exc:
            raise AssertionError(f"cannot parse shell line {line!r}: {exc}") from exc
        command: list[str] = []
        for token in [*tokens, ";"]:
            if token and set(token) <= set(";&|"):
                if command:
                    commands.append(command)
                command = []
            elif not command and token != "$" and re.fullmatch(r"[A-Za-z_]\w*=.*", token):
                continue  # VAR=value before a command
            elif not (not command and token == "$"):
                command.append(token)
    return commands
