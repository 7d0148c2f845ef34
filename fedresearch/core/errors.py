"""Errors that cross floors and end up as a precise message to the client, and the kinds of failure
a task can end in: each floor says which kind, and the floor that answers the client (web/) says
what a kind means there (an HTTP status for a REST caller)."""

from __future__ import annotations

from enum import StrEnum
from typing import ClassVar


class FailureKind(StrEnum):
    """Why a task did not run, or did not finish."""

    bad_request = "bad_request"  # the request cannot run as sent
    too_many_tasks = "too_many_tasks"  # its API key already runs MAX_TASKS_PER_KEY tasks
    stopping = "stopping"  # the server is stopping and takes no new task
    timed_out = "timed_out"  # it ran past TASK_TIMEOUT_S
    internal = "internal"  # an error of the server's own


class RequestError(ValueError):
    """The client's request cannot be run as sent, or not now; the message says exactly why, and
    `kind` which kind of refusal it is."""

    kind: ClassVar[FailureKind] = FailureKind.bad_request


class TooManyTasks(RequestError):
    """The caller's API key already runs MAX_TASKS_PER_KEY tasks: the same request runs once one ends."""

    kind = FailureKind.too_many_tasks


class ServerStopping(RequestError):
    """This server is stopping and takes no new task: the same request runs on another worker or host."""

    kind = FailureKind.stopping
