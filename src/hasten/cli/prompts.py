"""Terminal questions for `hasten config`: numbered menus, defaults in brackets, re-ask on bad answers.

Reads with `input()`, so it works the same in a terminal, a pseudo-terminal
driven by a test, or a pipe. In a real terminal, menus also accept the
arrow keys (up/down, then Enter). Ctrl-C / end of input raise `Aborted`,
and the caller writes nothing.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Sequence, TypeVar

T = TypeVar("T")

__all__ = ["Aborted", "ask", "ask_bool", "ask_choice", "ask_int", "ask_text"]


class Aborted(Exception):
    """The user pressed Ctrl-C or closed the input."""


def _read(prompt: str) -> str:
    try:
        return input(prompt)
    except (KeyboardInterrupt, EOFError):
        print()
        raise Aborted from None


def ask(question: str, parse: Callable[[str], T], default: T, shown_default: str | None = None) -> T:
    """Ask until `parse` accepts the answer; an empty answer takes the default (if there is one)."""
    shown = shown_default if shown_default is not None else ("" if default is None else str(default))
    while True:
        answer = _read(f"{question} [{shown}]: ").strip()
        if not answer and default not in (None, ""):
            return default  # (with no default, the parser decides whether "" is an answer)
        try:
            return parse(answer)
        except ValueError as error:
            print(f"  {error} Please try again.")


def ask_text(question: str, default: str | None = None) -> str | None:
    return ask(question, lambda text: text, default)


def ask_int(question: str, default: int, minimum: int | None = None, maximum: int | None = None) -> int:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"{text!r} is not a whole number.") from None
        if minimum is not None and value < minimum:
            raise ValueError(f"{value} is below the minimum {minimum}.")
        if maximum is not None and value > maximum:
            raise ValueError(f"{value} is above the maximum {maximum}.")
        return value

    return ask(question, parse, default)


def ask_bool(question: str, default: bool = False) -> bool:
    def parse(text: str) -> bool:
        lowered = text.lower()
        if lowered in ("y", "yes", "true", "1"):
            return True
        if lowered in ("n", "no", "false", "0"):
            return False
        raise ValueError(f"{text!r} is not yes or no.")

    return ask(question + " (yes/no)", parse, default, "yes" if default else "no")


def ask_choice(question: str, choices: Sequence[Any], default: Any, labels: Sequence[str] | None = None) -> Any:
    """A numbered menu; answer with the number, the value, or (in a terminal) the arrow keys."""
    labels = list(labels or [str(c) for c in choices])
    default_index = list(choices).index(default)
    if _arrow_keys_possible():
        picked = _arrow_menu(question, labels, default_index)
        if picked is not None:
            return choices[picked]
    print(question)
    for number, label in enumerate(labels, 1):
        print(f"  {number}) {label}")

    def parse(text: str) -> Any:
        if text.isdigit() and 1 <= int(text) <= len(choices):
            return choices[int(text) - 1]
        for value, label in zip(choices, labels):
            if text.lower() in (str(value).lower(), label.lower()):
                return value
        raise ValueError(f"{text!r} is not one of the numbers 1-{len(choices)}.")

    return ask("Your choice", parse, choices[default_index], str(default_index + 1))


# ---------------------------------------------------------------------------- arrow-key menu (real terminals)
def _arrow_keys_possible() -> bool:
    try:
        import termios  # noqa: F401
    except ImportError:
        return False
    return sys.stdin.isatty() and sys.stdout.isatty() and not _env_disables_arrows()


def _env_disables_arrows() -> bool:
    import os

    from ..process.launch_spec import NO_ARROW_MENU_ENV

    return os.environ.get(NO_ARROW_MENU_ENV, "") not in ("", "0") or os.environ.get("TERM") == "dumb"


def _arrow_menu(question: str, labels: list[str], index: int) -> int | None:
    """Up/down or a digit moves the marker, Enter picks; returns None if the terminal refuses raw mode.

    A digit only moves the marker (it does not pick), so typing "2" then Enter
    -- the habit from numbered menus -- picks item 2 instead of leaving the
    Enter to silently accept the next question's default. Keys are read with
    os.read (unbuffered) so nothing typed ahead is swallowed before input().
    """
    import os
    import termios
    import tty

    fd = sys.stdin.fileno()
    try:
        saved = termios.tcgetattr(fd)
    except termios.error:
        return None
    out = sys.stdout
    print(f"{question}  (arrow keys or a number, Enter to choose)")

    def draw(first: bool) -> None:
        if not first:
            out.write(f"\x1b[{len(labels)}A")  # back to the first line of the menu
        for i, label in enumerate(labels):
            marker = ">" if i == index else " "
            out.write(f"\r\x1b[2K {marker} {i + 1}) {label}\n")
        out.flush()

    def read_key() -> str:
        data = os.read(fd, 1)
        if not data:
            raise EOFError
        return data.decode("latin-1")

    try:
        tty.setcbreak(fd)  # before drawing: keys pressed as soon as the menu shows are neither echoed nor lost
        draw(first=True)
        while True:
            key = read_key()
            if key in ("\r", "\n"):
                return index
            if key == "\x03":
                raise KeyboardInterrupt
            if key == "\x04":
                raise EOFError
            if key.isdigit():
                if 1 <= int(key) <= len(labels):
                    index = int(key) - 1
                    draw(first=False)
                else:
                    out.write("\a")  # not a menu number: beep, keep the menu
                    out.flush()
                continue
            if key == "\x1b" and read_key() == "[":
                arrow = read_key()
                if arrow == "A":
                    index = (index - 1) % len(labels)
                elif arrow == "B":
                    index = (index + 1) % len(labels)
                draw(first=False)
    except (KeyboardInterrupt, EOFError):
        print()
        raise Aborted from None
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)
