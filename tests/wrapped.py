"""Text the command line wraps to 120 columns, read back as one line: a test
that looks for a sentence finds it whatever the line breaks."""


def flat(text: str) -> str:
    """``text`` with every run of white space (line breaks and the indents of
    continuation lines included) made one space."""
    return " ".join(str(text).split())
