"""The command line's exit codes, and the one-line error that carries one."""

__all__ = [
    "EXIT_APPROVAL",
    "EXIT_CANCELLED",
    "EXIT_ERROR",
    "EXIT_OK",
    "EXIT_PIPE",
    "EXIT_USAGE",
    "CliError",
]

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_APPROVAL = 3
EXIT_CANCELLED = 130
EXIT_PIPE = 141


class CliError(Exception):
    """A one-line error for the user, with an optional hint, and the exit code it gives."""

    def __init__(self, message: str, hint: str = "", *, code: int = EXIT_ERROR) -> None:
        self.hint = hint
        self.code = code
        super().__init__(message)
