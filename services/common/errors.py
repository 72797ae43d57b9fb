"""Domain errors raised by service code and mapped to gRPC status codes / HTTP statuses in one place.

Service code raises these instead of touching ``grpc.ServicerContext`` so that the same domain
module can back a gRPC servicer, an HTTP handler and a test without change.
"""

from __future__ import annotations

import grpc


class DomainError(Exception):
    """Base class: an expected error with a precise status."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL
    http_status: int = 500

    def __init__(self, message: str, *, field: str | None = None) -> None:
        self.field = field
        super().__init__(f"{field}: {message}" if field else message)

    @property
    def message(self) -> str:
        return str(self)


class InvalidArgument(DomainError):
    code = grpc.StatusCode.INVALID_ARGUMENT
    http_status = 422


class NotFound(DomainError):
    code = grpc.StatusCode.NOT_FOUND
    http_status = 404


class AlreadyExists(DomainError):
    code = grpc.StatusCode.ALREADY_EXISTS
    http_status = 409


class FailedPrecondition(DomainError):
    code = grpc.StatusCode.FAILED_PRECONDITION
    http_status = 409


class PermissionDenied(DomainError):
    code = grpc.StatusCode.PERMISSION_DENIED
    http_status = 403


class Unauthenticated(DomainError):
    code = grpc.StatusCode.UNAUTHENTICATED
    http_status = 401


class Unavailable(DomainError):
    code = grpc.StatusCode.UNAVAILABLE
    http_status = 503
