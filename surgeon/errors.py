"""The one exception type for bad input; the CLI prints its message as one line."""


class SurgeonError(Exception):
    """A problem with the user's input or environment, with a message that names it."""
