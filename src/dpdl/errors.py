"""The one exception type that the command line turns into a clean, one-line error."""


class DPDLError(ValueError):
    """Invalid input or a refused operation; the message is meant for the user.

    It subclasses ValueError so library callers can catch either.
    """


class PrivacyBudgetExceeded(DPDLError):
    """A step, run or resume would spend more privacy than its target allows (fails closed)."""


class DatasetNotFound(DPDLError):
    """A data set is missing; the message says how to obtain it."""


def require(condition: bool, message: str) -> None:
    """Raise DPDLError(message) unless condition holds."""
    if not condition:
        raise DPDLError(message)
