"""The one exception type for bad input; the CLI prints its message as one line."""


class SurgeonError(Exception):
    """A problem with the user's input or environment, with a message that names it."""


def first_line(error: BaseException) -> str:
    """The first line of an exception's message (its type name when the message is empty)."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
