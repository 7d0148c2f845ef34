"""Errors that cross floors and end up as a precise message to the client."""


class RequestError(ValueError):
    """The client's request cannot be run as sent; the message says exactly why."""
