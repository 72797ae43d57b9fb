"""Shared plumbing for every PARFusion service: settings, logging, errors, gRPC and HTTP bootstrap."""
