"""Domain errors raised by service code and mapped to gRPC status codes / HTTP statuses in one place.

Service code raises these instead of touching ``grpc.ServicerContext`` so that the same domain
module can back a gRPC servicer, an HTTP handler and a test without change.
"""

from __future__ import annotations


class DomainError(Exception):
    """Base class: an expected error with a precise status."""

    # The gRPC status code by name (grpc.StatusCode[code]): the domain errors import no gRPC, so
    # the pure core can raise them.
    code: str = "INTERNAL"
    http_status: int = 500

    def __init__(self, message: str, *, field: str | None = None) -> None:
        self.field = field
        super().__init__(f"{field}: {message}" if field else message)

    @property
    def message(self) -> str:
        return str(self)


class InvalidArgument(DomainError):
    code = "INVALID_ARGUMENT"
    http_status = 422


class NotFound(DomainError):
    code = "NOT_FOUND"
    http_status = 404


class AlreadyExists(DomainError):
    code = "ALREADY_EXISTS"
    http_status = 409


class FailedPrecondition(DomainError):
    code = "FAILED_PRECONDITION"
    http_status = 409


class PermissionDenied(DomainError):
    code = "PERMISSION_DENIED"
    http_status = 403


class Unauthenticated(DomainError):
    code = "UNAUTHENTICATED"
    http_status = 401


class Unavailable(DomainError):
    code = "UNAVAILABLE"
    http_status = 503


class ResourceExhausted(DomainError):
    """A configured limit is reached; the message names the limit and its setting."""

    code = "RESOURCE_EXHAUSTED"
    http_status = 429
